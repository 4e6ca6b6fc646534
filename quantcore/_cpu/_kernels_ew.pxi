# Included by _kernels.pyx (one module: the scheduler's cdef helpers, the
# fused type `floating` and the C++ declarations of _kernels.pxd are shared).
# The elementwise families: ew, ew_tensor, fq_affine_exact.

# ---------------------------------------------------------------- elementwise
cdef void _ew_run(int family, const floating* x, floating* y, unsigned char* mask, Units L,
                  const floating* params, floating u0, floating u1, int mode,
                  int nthreads) noexcept nogil:
    """Family `family` over every unit of L."""
    cdef int64_t u
    cdef Unit un
    if L.n == 1 or nthreads <= 1:  # on the calling thread, no OpenMP region
        for u in range(L.n):
            _ew_unit(family, x, y, mask, &L, _unit(&L, u), params, u0, u1, mode)
        return
    for u in prange(L.n, schedule='static', num_threads=nthreads):
        un = _unit(&L, u)
        _ew_unit(family, x, y, mask, &L, un, params, u0, u1, mode)


cdef inline void _ew_unit(int family, const floating* x, floating* y, unsigned char* mask,
                          const Units* L, Unit un, const floating* params, floating u0,
                          floating u1, int mode) noexcept nogil:
    if un.channel >= 0:
        ew_block(family, x + un.start, y + un.start, _off(mask, un.start), un.count, params,
                 L.C, un.channel, u0, u1, mode)
    else:
        ew_rowvec(family, x + un.start, y + un.start, _off(mask, un.start), un.count, L.C,
                  params, u0, u1, mode)


def ew(int family, cnp.ndarray x, cnp.ndarray y, cnp.ndarray mask, int64_t outer, int64_t C,
       int64_t inner, cnp.ndarray params, double u0, double u1, int mode, int nthreads):
    """Elementwise family `family` (``FAMILIES``) over the (outer, C, inner)
    view of x into y (may alias x), with the mask when given.

    x, y: C-contiguous float32 / float64 arrays of one dtype and size; mask:
    uint8 of that size or None; params: x's dtype, the family's NP
    parameters as NP arrays of C values (``params[j * C + c]``); u0, u1,
    mode: the family's uniform parameters (rounded to x's dtype).  (Raw data
    pointers: this is on the per-call path of small arrays.)
    """
    cdef int64_t n = cnp.PyArray_SIZE(x)
    _check_flat(x)
    _check_dest(y, x)
    cdef unsigned char* mp = _mask_ptr(mask, n)
    if not 0 <= family < QC_EW_COUNT:
        raise ValueError(f"ew: unknown family {family}")
    if n == 0 or C == 0:
        return
    if outer * C * inner != n:
        raise ValueError(f"ew: the view ({outer}, {C}, {inner}) does not have {n} elements")
    cdef void* pp = _params_ptr(params, x, qc_ew_family_np[family] * C)
    cdef Units L = _units(outer, C, inner)
    if cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT32:
        with nogil:
            _ew_run(family, <const float*>cnp.PyArray_DATA(x), <float*>cnp.PyArray_DATA(y), mp,
                    L, <const float*>pp, <float>u0, <float>u1, mode, nthreads)
    else:
        with nogil:
            _ew_run(family, <const double*>cnp.PyArray_DATA(x), <double*>cnp.PyArray_DATA(y),
                    mp, L, <const double*>pp, u0, u1, mode, nthreads)


def ew_tensor(int family, cnp.ndarray x, cnp.ndarray y, cnp.ndarray mask, double p0, double p1,
              double p2, double p3, double p4, double u0, double u1, int mode, int nthreads):
    """:func:`ew` per tensor with the family's parameters as scalars
    (p0, p1, ...: the first NP are used, rounded to x's dtype)."""
    cdef int64_t n = cnp.PyArray_SIZE(x)
    cdef float pf[5]
    cdef double pd[5]
    _check_flat(x)
    _check_dest(y, x)
    cdef unsigned char* mp = _mask_ptr(mask, n)
    if not 0 <= family < QC_EW_COUNT:
        raise ValueError(f"ew_tensor: unknown family {family}")
    if n == 0:
        return
    cdef Units L = _units(1, 1, n)
    if cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT32:
        pf[0], pf[1], pf[2], pf[3], pf[4] = p0, p1, p2, p3, p4
        with nogil:
            _ew_run(family, <const float*>cnp.PyArray_DATA(x), <float*>cnp.PyArray_DATA(y), mp,
                    L, pf, <float>u0, <float>u1, mode, nthreads)
    else:
        pd[0], pd[1], pd[2], pd[3], pd[4] = p0, p1, p2, p3, p4
        with nogil:
            _ew_run(family, <const double*>cnp.PyArray_DATA(x), <double*>cnp.PyArray_DATA(y),
                    mp, L, pd, u0, u1, mode, nthreads)


def fq_affine_exact(const floating[::1] x, floating[::1] y, unsigned char[::1] mask,
                    int64_t C, int64_t inner, const floating[::1] scale,
                    const floating[::1] inv, const double[::1] zp, double qmin, double qmax,
                    int mode, int nthreads):
    """PyTorch's affine fake quant with exact integer zero points and range
    (qc_fq_affine_exact) over the C-ordered (outer, C, inner) view of x
    (per tensor: C = 1, inner = x.size); y may alias x."""
    cdef int64_t n = x.shape[0]
    cdef int64_t u
    cdef Unit un
    if n == 0:
        return
    if C < 1 or inner < 1 or scale.shape[0] < C or inv.shape[0] < C or zp.shape[0] < C:
        raise ValueError("fq_affine_exact: C and inner must be >= 1, with C parameters each")
    cdef const floating* xp = &x[0]
    cdef floating* yp = &y[0]
    cdef unsigned char* mp = NULL
    if mask is not None and mask.shape[0] > 0:
        mp = &mask[0]
    cdef Units L = _units(1, 1, n)  # elementwise, the channel of each element computed
    for u in prange(L.n, nogil=True, schedule='static', num_threads=nthreads):
        un = _unit(&L, u)
        affine_exact_range(xp, yp, mp, un.start, un.count, C, inner, &scale[0], &inv[0], &zp[0],
                           qmin, qmax, mode)
