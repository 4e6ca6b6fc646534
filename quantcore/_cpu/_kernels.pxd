# The C++ side of the CPU extension, declared once (Cython reads this file
# with _kernels.pyx).  The entry points are templates over the compute type,
# deduced from the arguments: float or double.
from libc.stdint cimport int64_t


cdef extern from "qc_omp.h" nogil:
    int qc_openmp_enabled()
    int qc_omp_max_threads()


cdef extern from "qc_minmax.h" nogil:
    int QC_MM_NAN, QC_MM_NEGZERO, QC_MM_POSZERO
    int QC_OBS_NONE, QC_OBS_MINMAX, QC_OBS_MOVING_AVG, QC_OBS_EMA, QC_OBS_MOMENTUM
    int QC_OBS_PROPAGATE, QC_OBS_INCLUDE_ZERO, QC_OBS_FROM_ZERO, QC_OBS_ABSMAX
    int QC_OBS_FIRST_IF_EMPTY, QC_OBS_INF_RESETS
    int QC_QS_NONE, QC_QS_AFFINE, QC_QS_SYMMETRIC
    float qc_ma_update_f32(float m, float x, float c)
    float qc_running_min_f32(float m, float v)
    float qc_running_max_f32(float m, float v)
    void qc_affine_qparams_f32(float mn, float mx, int64_t qmin, int64_t qmax, float eps,
                               float* scale, int64_t* zp)
    float qc_symmetric_scale_f32(float mn, float mx, int64_t qmin, int64_t qmax, float eps)
    void qc_minmax_finish[T](T* lo, T* hi, unsigned flags)
    bint qc_mm_nonfinite[T](T lo, T hi, unsigned flags)
    void qc_mm_fold[T](T* lo, T* hi, unsigned char* flags, T plo, T phi, unsigned char pfl)
    void qc_observe_update(int mode, bint first, float c, float d, float blo, float bhi,
                           float* smin, float* smax)
    bint qc_obs_first(int mode, long long batches, float smin, float smax)
    void qc_qparams(float mn, float mx, int qscheme, float eps, int64_t qmin, int64_t qmax,
                    int64_t sym_zp, float* scale_out, int64_t* zp_out)


cdef extern from "qc_registry.h" nogil:
    int QC_EW_COUNT, QC_ENC_COUNT, QC_DEC_COUNT, QC_GRP_COUNT, QC_BLK_COUNT
    const char* qc_ew_family_names[]
    const char* qc_encode_family_names[]
    const char* qc_decode_family_names[]
    const char* qc_group_recipe_names[]
    const char* qc_block_recipe_names[]


cdef extern from "qc_kernels.h" nogil:
    const int qc_ew_family_np[]
    const int qc_encode_family_np[]
    const int qc_decode_family_np[]
    const int qc_encode_family_bytes[]
    const int qc_decode_family_bytes[]
    int qc_simd_level "qc::simd_level"
    int qc_select_simd "qc::select_simd"(int max_level)
    int qc_simd_builds "qc::simd_builds"()


cdef extern from "qc_kernels.h" namespace "qc" nogil:
    void ew_block[T](int family, const T* x, T* y, unsigned char* mask, int64_t n,
                     const T* params, int64_t C, int64_t c, T u0, T u1, int mode)
    void ew_rowvec[T](int family, const T* x, T* y, unsigned char* mask, int64_t rows,
                      int64_t C, const T* params, T u0, T u1, int mode)
    void affine_exact_range[T](const T* x, T* y, unsigned char* mask, int64_t start, int64_t n,
                               int64_t C, int64_t inner, const T* s, const T* inv,
                               const double* zp, double qmin, double qmax, int mode)
    void ste_block[T](const T* g, const unsigned char* mask, T* y, int64_t n)
    void minmax_block[T](const T* x, int64_t n, T* lo, T* hi, unsigned char* flags)
    void minmax_rowvec[T](const T* x, int64_t rows, int64_t C, T* lo, T* hi,
                          unsigned char* flags)
    void histc_block(const float* x, int64_t n, float lo, float hi, int bins, int absolute,
                     int skip_zeros, int64_t* counts)
    void enc_block[T](int family, const T* x, void* codes, int code_bytes, int64_t n,
                      const T* params, int64_t C, int64_t c, T u0, T u1, int mode)
    void enc_rowvec[T](int family, const T* x, void* codes, int code_bytes, int64_t rows,
                       int64_t C, const T* params, T u0, T u1, int mode)
    void dec_block[T](int family, const void* codes, int code_bytes, T* y, int64_t n,
                      const T* params, int64_t C, int64_t c, T u0, T u1, int mode)
    void dec_rowvec[T](int family, const void* codes, int code_bytes, T* y, int64_t rows,
                       int64_t C, const T* params, T u0, T u1, int mode)
    void group_blocks(int recipe, const float* x, unsigned char* codes, float* y,
                      unsigned char* mask, float* scale, float* zp, int64_t b0, int64_t nb,
                      int64_t K, int64_t g, float qmin, float qmax, int mode)
    void block_scaled(int recipe, const float* x, unsigned char* scodes, unsigned char* codes,
                      float* y, int64_t b0, int64_t nb, int64_t K, int64_t g, int elem,
                      int mode, float p0, float p1)


cdef extern from "qc_qparams.h" nogil:
    struct QcQpArgs:
        double qmin, qmax, eps
        int num_bits, flags
    int QC_QP_COUNT
    const char* qc_qp_scheme_names[]
    const int qc_qp_scheme_nout[]
    void qc_qparams_run[T](int scheme, const T* a, const T* b, int64_t C, QcQpArgs g,
                           double* out)
