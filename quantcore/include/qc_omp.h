/* qc_omp.h -- the OpenMP shim: the same names with and without OpenMP. */
#ifndef QC_OMP_H
#define QC_OMP_H
#ifdef _OPENMP
#include <omp.h>
static inline int qc_openmp_enabled(void) { return 1; }
static inline int qc_omp_max_threads(void) { return omp_get_max_threads(); }
static inline int qc_omp_thread_num(void) { return omp_get_thread_num(); }
#else
static inline int qc_openmp_enabled(void) { return 0; }
static inline int qc_omp_max_threads(void) { return 1; }
static inline int qc_omp_thread_num(void) { return 0; }
#endif
#endif
