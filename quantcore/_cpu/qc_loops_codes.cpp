/*
 * The CPU loops of every encode and decode family (QC_ENCODE_FAMILIES,
 * QC_DECODE_FAMILIES: FP8 / int codes, qc_format_families.h), for one build
 * (see qc_loops_affine.cpp).
 */
#include "qc_format_families.h"
#include "qc_cpu_loops.h"

QC_ENCODE_FAMILIES(QC_LOOPS_ENC)
QC_DECODE_FAMILIES(QC_LOOPS_DEC)
