/*
 * The CPU loops of the elementwise fp8 family (FP8 fake quant / fake cast,
 * qc_format_families.h), for one build (see qc_loops_affine.cpp).
 */
#include "qc_format_families.h"
#include "qc_cpu_loops.h"

QC_LOOPS_EW(fp8)
