/*
 * The CPU loops of every group recipe (QC_GROUP_RECIPES: the LLM weight
 * recipes, qc_groups.h QcGroup*), for one build (see qc_loops_affine.cpp).
 */
#include "qc_groups.h"
#include "qc_cpu_loops.h"

QC_GROUP_RECIPES(QC_LOOPS_GROUP)
