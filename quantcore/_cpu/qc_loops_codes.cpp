/*
 * The CPU loops of every encode and decode family (QC_ENCODE_FAMILIES,
 * QC_DECODE_FAMILIES: FP8 / int codes, qc_formats.h), for one build (see
 * qc_loops_affine.cpp).
 */
#define QC_NO_BLOCK_RECIPES
#include "qc_cpu_loops.h"

QC_ENCODE_FAMILIES(QC_LOOPS_ENC)
QC_DECODE_FAMILIES(QC_LOOPS_DEC)
