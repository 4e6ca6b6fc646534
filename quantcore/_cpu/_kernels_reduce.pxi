# Included by _kernels.pyx (see _kernels_ew.pxi).  The straight-through
# backward (ste), the min / max reductions and torch.histc (histc_f32).

# ----------------------------------------------------------------- backward
cdef void _ste_run(const floating* gp, const unsigned char* mp, floating* yp, int64_t n,
                   int nthreads) noexcept nogil:
    cdef int64_t u
    cdef Unit un
    cdef Units L = _units(1, 1, n)
    if L.n == 1 or nthreads <= 1:
        ste_block(gp, mp, yp, n)
        return
    for u in prange(L.n, schedule='static', num_threads=nthreads):
        un = _unit(&L, u)
        ste_block(gp + un.start, mp + un.start, yp + un.start, un.count)


def ste(cnp.ndarray grad, cnp.ndarray mask, cnp.ndarray y, int nthreads):
    """Straight-through backward y = grad * mask (y may alias grad).

    grad, y: C-contiguous float32 / float64 of one dtype and size; mask:
    C-contiguous uint8 / bool of that size.  (Raw data pointers: this is on
    the per-call path of small arrays.)
    """
    cdef int64_t n = cnp.PyArray_SIZE(grad)
    _check_flat(grad)
    _check_dest(y, grad)
    if mask is None or not cnp.PyArray_IS_C_CONTIGUOUS(mask) or cnp.PyArray_ITEMSIZE(mask) != 1 \
            or cnp.PyArray_SIZE(mask) != n:
        raise ValueError(f"expected a C-contiguous uint8 mask of {n} elements")
    cdef const unsigned char* mp = <const unsigned char*>cnp.PyArray_DATA(mask)
    if n == 0:
        return
    if cnp.PyArray_TYPE(grad) == cnp.NPY_FLOAT32:
        with nogil:
            _ste_run(<const float*>cnp.PyArray_DATA(grad), mp, <float*>cnp.PyArray_DATA(y), n,
                     nthreads)
    else:
        with nogil:
            _ste_run(<const double*>cnp.PyArray_DATA(grad), mp, <double*>cnp.PyArray_DATA(y),
                     n, nthreads)


# ---------------------------------------------------------------- min / max
cdef inline int64_t _minmax_teams(const Units* L, int nthreads) noexcept nogil:
    """Threads of a min / max over L: 1 (on the calling thread) for one
    unit or one thread, else at most one per unit."""
    if nthreads <= 1 or L.n <= 1:
        return 1
    return nthreads if nthreads < L.n else L.n


def minmax_scratch_bytes(int64_t outer, int64_t C, int64_t inner, int nthreads, int itemsize):
    """Bytes of scratch a min / max of the (outer, C, inner) view allocates:
    ``T * C * (2 * itemsize + 1)`` for its T > 1 threads (each thread's C
    results), whatever the input size; 0 on one thread."""
    cdef Units L = _units(outer, C, inner)
    cdef int64_t T = _minmax_teams(&L, nthreads)
    return 0 if T == 1 else T * C * (2 * itemsize + 1)


cdef inline void _minmax_share(const floating* xp, const Units* L, int64_t u0, int64_t u1,
                               floating* lo, floating* hi, unsigned char* flags) noexcept nogil:
    """Units u0..u1-1 of L folded, in unit order, into (lo, hi, flags)[C]."""
    cdef int64_t u
    cdef Unit un
    cdef floating l1, h1
    cdef unsigned char f1
    for u in range(u0, u1):
        un = _unit(L, u)
        if un.channel >= 0:
            minmax_block(xp + un.start, un.count, &l1, &h1, &f1)
            qc_mm_fold(&lo[un.channel], &hi[un.channel], &flags[un.channel], l1, h1, f1)
        else:
            minmax_rowvec(xp + un.start, un.count, L.C, lo, hi, flags)


cdef int64_t _minmax_run(const floating* xp, Units L, int nthreads, floating* lo, floating* hi,
                         unsigned char* flags) noexcept nogil:
    """(lo, hi, flags)[C] of the view L (the caller initialises them to
    (+inf, -inf, 0)); 0, or the bytes of scratch it could not allocate.

    One thread folds every unit into the results, on the calling thread
    (no OpenMP region).  T threads: thread t folds its contiguous share of
    the units, in unit order, into its own C results (the scratch: T * C,
    not one partial per unit), and the shares are folded in thread order:
    the units' partials folded in unit order, only grouped differently (the
    fold -- the first of equal minima / maxima, the flags or'ed -- is
    associative), so the same bits for any thread count."""
    cdef int64_t T = _minmax_teams(&L, nthreads), C = L.C
    cdef int64_t t, j, share
    cdef floating* plo
    cdef floating* phi
    cdef unsigned char* pfl
    if T == 1:
        _minmax_share(xp, &L, 0, L.n, lo, hi, flags)
        return 0
    plo = <floating*>malloc(T * C * sizeof(floating))
    phi = <floating*>malloc(T * C * sizeof(floating))
    pfl = <unsigned char*>malloc(T * C)
    if plo == NULL or phi == NULL or pfl == NULL:
        free(plo)
        free(phi)
        free(pfl)
        return T * C * (2 * sizeof(floating) + 1)
    for j in range(T * C):
        plo[j] = <floating>INFINITY_F
        phi[j] = -<floating>INFINITY_F
        pfl[j] = 0
    share = (L.n + T - 1) // T
    for t in prange(T, schedule='static', num_threads=T):
        _minmax_share(xp, &L, t * share, min((t + 1) * share, L.n), &plo[t * C], &phi[t * C],
                      &pfl[t * C])
    for t in range(T):
        for j in range(C):
            qc_mm_fold(&lo[j], &hi[j], &flags[j], plo[t * C + j], phi[t * C + j], pfl[t * C + j])
    free(plo)
    free(phi)
    free(pfl)
    return 0


cdef int _no_memory(str func, int64_t nbytes, Units L, int nthreads) except -1:
    """MemoryError saying what could not be allocated."""
    raise MemoryError(f"{func}: cannot allocate {nbytes} bytes ({nbytes / 2**20:.1f} MiB) of "
                      f"scratch for the partial min / max of {_minmax_teams(&L, nthreads)} "
                      f"threads x {L.C} channels (fewer threads need less)")


cdef int _minmax_flat(cnp.ndarray x, int nthreads, double* lo, double* hi,
                      unsigned char* flags) except -1:
    """(min, max, flags) of a C-contiguous float32 / float64 array into
    ``lo`` / ``hi`` (float64, exact for float32) / ``flags``: (+inf, -inf,
    0) when empty."""
    cdef int64_t n = cnp.PyArray_SIZE(x)
    cdef float lo32 = INFINITY_F, hi32 = -INFINITY_F
    cdef int64_t status = 0
    _check_flat(x)
    lo[0], hi[0], flags[0] = INFINITY_F, -INFINITY_F, 0
    if n == 0:
        return 0
    if cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT32:
        with nogil:
            status = _minmax_run(<const float*>cnp.PyArray_DATA(x), _units(1, 1, n), nthreads,
                                 &lo32, &hi32, flags)
        lo[0], hi[0] = lo32, hi32
    else:
        with nogil:
            status = _minmax_run(<const double*>cnp.PyArray_DATA(x), _units(1, 1, n), nthreads,
                                 lo, hi, flags)
    if status != 0:
        _no_memory("minmax", status, _units(1, 1, n), nthreads)
    return 0


def minmax(cnp.ndarray x, int nthreads):
    """Per-tensor (min, max, flags) of a C-contiguous float32 / float64 array
    in one pass; flags = QC_MM_* bits.

    The min / max skip NaN; ``minmax_finish`` turns them into NaN when the
    NaN flag is set and fixes the sign of a zero result.  An empty x gives
    (+inf, -inf, 0).  (Raw data pointers and no allocation for inputs of one
    work unit: this is on the per-call path of small arrays.)
    """
    cdef double lo, hi
    cdef unsigned char fl
    _minmax_flat(x, nthreads, &lo, &hi, &fl)
    return lo, hi, int(fl)


def minmax_many(list arrays, int nthreads, int64_t parallel_from):
    """:func:`minmax` of each array of ``arrays`` (C-contiguous float32 /
    float64) in one call: ``(lo, hi, flags)`` as float64[T], float64[T]
    (exact for float32) and uint8[T]; an array of at least
    ``parallel_from`` values on ``nthreads`` threads, a smaller one on one.
    (A batch of many small tensors: one call, not one per tensor.)"""
    cdef Py_ssize_t T = len(arrays), t
    out_lo = np.empty(T, dtype=np.float64)
    out_hi = np.empty(T, dtype=np.float64)
    out_fl = np.zeros(T, dtype=np.uint8)
    cdef double[::1] olo = out_lo
    cdef double[::1] ohi = out_hi
    cdef unsigned char[::1] ofl = out_fl
    cdef cnp.ndarray x
    for t in range(T):
        x = arrays[t]
        _minmax_flat(x, nthreads if cnp.PyArray_SIZE(x) >= parallel_from else 1,
                     &olo[t], &ohi[t], &ofl[t])
    return out_lo, out_hi, out_fl


def minmax_finished(cnp.ndarray x, int nthreads, bint omit_nan):
    """Per-tensor (min, max) with the NaN / signed-zero rule applied
    (qc_minmax_finish): NaN when x holds a NaN (unless ``omit_nan``),
    ``-0.0 < +0.0``.  Values as Python floats, exact in x's dtype."""
    lo, hi, fl = minmax(x, nthreads)
    cdef unsigned flags = fl & (~QC_MM_NAN if omit_nan else 0xFF)
    cdef float lo32, hi32
    cdef double lo64 = lo, hi64 = hi
    if cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT32:
        lo32, hi32 = lo64, hi64
        qc_minmax_finish(&lo32, &hi32, flags)
        return lo32, hi32
    qc_minmax_finish(&lo64, &hi64, flags)
    return lo64, hi64


def minmax_channels(const floating[::1] x, int64_t outer, int64_t C, int64_t inner,
                    int nthreads):
    """Per-channel (min[C], max[C], flags[C]) of the (outer, C, inner) view."""
    dtype = np.float32 if floating is float else np.float64
    out_lo = np.full(C, np.inf, dtype=dtype)
    out_hi = np.full(C, -np.inf, dtype=dtype)
    out_fl = np.zeros(C, dtype=np.uint8)
    cdef floating[::1] olo = out_lo
    cdef floating[::1] ohi = out_hi
    cdef unsigned char[::1] ofl = out_fl
    cdef int64_t status
    if x.shape[0] == 0 or C == 0:
        return out_lo, out_hi, out_fl
    with nogil:
        status = _minmax_run(&x[0], _units(outer, C, inner), nthreads, &olo[0], &ohi[0],
                             &ofl[0])
    if status != 0:
        _no_memory("minmax_channels", status, _units(outer, C, inner), nthreads)
    return out_lo, out_hi, out_fl


def minmax_finish(floating[::1] lo, floating[::1] hi, const unsigned char[::1] flags):
    """In place: NaN if the NaN flag is set; the sign of a zero result fixed
    so that -0.0 < +0.0 (qc_minmax_finish)."""
    cdef int64_t c
    for c in range(lo.shape[0]):
        qc_minmax_finish(&lo[c], &hi[c], flags[c])


# ---------------------------------------------------------------- histogram
cdef struct HistcArgs:
    float lo, hi
    int bins, absolute, skip_zeros
    int64_t* counts      # thread t's two sub-histograms at counts + t * 2 * bins


cdef void _histc_share(const float* xp, int64_t cnt, int t, void* ctx) noexcept nogil:
    """histc_block on thread t's share (run_shares)."""
    cdef const HistcArgs* a = <const HistcArgs*>ctx
    histc_block(xp, cnt, a.lo, a.hi, a.bins, a.absolute, a.skip_zeros,
                a.counts + <int64_t>t * 2 * a.bins)


def histc_f32(cnp.ndarray x, int bins, float lo, float hi, bint absolute, bint skip_zeros,
              int nthreads):
    """``torch.histc(x, bins, lo, hi)`` counts (int64[bins]) of a C-contiguous
    float32 array in one pass (qc_histc_bin_f32, with lo and hi already
    chosen as torch chooses them): NaN and values outside [lo, hi] are not
    counted; ``absolute`` bins |x|; ``skip_zeros`` skips zeros.  Each
    thread counts a contiguous share into its own histograms; integer
    counts make the result independent of the thread count."""
    cdef int64_t n = cnp.PyArray_SIZE(x)
    if cnp.PyArray_TYPE(x) != cnp.NPY_FLOAT32 or not cnp.PyArray_ISCARRAY_RO(x):
        raise ValueError("histc_f32: expected an aligned C-contiguous float32 array")
    if bins < 1:
        raise ValueError(f"histc_f32: bins must be >= 1, got {bins}")
    if not lo <= hi:
        raise ValueError(f"histc_f32: need lo <= hi, got [{lo}, {hi}]")
    nthreads = share_threads(n, nthreads)
    parts_a = np.zeros((nthreads, 2 * bins), dtype=np.int64)
    cdef int64_t[:, ::1] parts = parts_a
    cdef HistcArgs a
    a.lo, a.hi, a.bins, a.absolute, a.skip_zeros = lo, hi, bins, absolute, skip_zeros
    a.counts = &parts[0, 0]
    with nogil:
        run_shares(_histc_share, <const float*>cnp.PyArray_DATA(x), n, nthreads, &a)
    return parts_a.reshape(nthreads * 2, bins).sum(axis=0)
