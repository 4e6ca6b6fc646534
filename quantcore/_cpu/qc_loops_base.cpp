/*
 * The loops of qc_cpu_loops.h with the extension's baseline flags
 * (x86-64-v2 on x86-64), exported as qc_base::Entries (qc_kernels.h).
 */
#define QC_LOOPS_NS qc_base
#include "qc_cpu_loops.h"
#include "qc_kernels.h"

QC_DEFINE_BUILD
