/*
 * The CPU loops of every block-scaled recipe (QC_BLOCK_RECIPES: MX,
 * NVFP4, qc_mx.h), for one build (see qc_loops_affine.cpp).  The only unit
 * that includes qc_mx.h: an edit there rebuilds these loops alone.
 */
#include "qc_mx.h"
#include "qc_cpu_loops.h"

QC_BLOCK_RECIPES(QC_LOOPS_BLOCK)
