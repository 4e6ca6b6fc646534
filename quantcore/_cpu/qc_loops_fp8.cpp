/*
 * The CPU loops of the elementwise fp8 family (FP8 fake quant / fake cast,
 * qc_formats.h), for one build (see qc_loops_affine.cpp).
 */
#define QC_NO_BLOCK_RECIPES
#include "qc_cpu_loops.h"

QC_LOOPS_EW(fp8)
