# Included by _kernels.pyx (see _kernels_ew.pxi).  Statistics -> qparams
# (the schemes of qc_qparams.h, the observers' updates) and the fused
# FakeQuantize step (observe_fake_quant_f32).

# ------------------------------------------------------- statistics -> qparams
#: qparams scheme name -> (id, number of outputs) (qc_qparams.h, QC_QP_SCHEMES)
QP_SCHEMES = {qc_qp_scheme_names[i].decode(): (i, qc_qp_scheme_nout[i])
              for i in range(QC_QP_COUNT)}


def qparams(int scheme, const floating[::1] a, const floating[::1] b, double qmin, double qmax,
            double eps, int num_bits, int flags):
    """Scheme ``scheme`` (``QP_SCHEMES``) over the C channels of a (and b;
    None for schemes of one input): float64[NOUT, C], output j at row j."""
    cdef int64_t C = a.shape[0]
    if not 0 <= scheme < QC_QP_COUNT:
        raise ValueError(f"qparams: unknown scheme {scheme}")
    if b is not None and b.shape[0] != C:
        raise ValueError(f"qparams: the two inputs have {C} and {b.shape[0]} channels")
    out_a = np.empty((qc_qp_scheme_nout[scheme], C), dtype=np.float64)
    cdef double[:, ::1] out = out_a
    cdef QcQpArgs g
    g.qmin, g.qmax, g.eps, g.num_bits, g.flags = qmin, qmax, eps, num_bits, flags
    cdef const floating* bp = NULL
    if b is not None and C:
        bp = &b[0]
    if C:
        qc_qparams_run(scheme, &a[0], bp, C, g, &out[0, 0])
    return out_a


def affine_qparams(const float[::1] lo, const float[::1] hi, int64_t qmin, int64_t qmax,
                   float eps):
    """(scale float32[C], zero_point int64[C]) by qc_affine_qparams_f32."""
    cdef int64_t c, n = lo.shape[0]
    scale = np.empty(n, dtype=np.float32)
    zp = np.empty(n, dtype=np.int64)
    cdef float[::1] s = scale
    cdef int64_t[::1] z = zp
    for c in range(n):
        qc_affine_qparams_f32(lo[c], hi[c], qmin, qmax, eps, &s[c], &z[c])
    return scale, zp


def symmetric_scale(const float[::1] lo, const float[::1] hi, int64_t qmin, int64_t qmax,
                    float eps):
    """scale float32[C] by qc_symmetric_scale_f32."""
    cdef int64_t c, n = lo.shape[0]
    scale = np.empty(n, dtype=np.float32)
    cdef float[::1] s = scale
    for c in range(n):
        s[c] = qc_symmetric_scale_f32(lo[c], hi[c], qmin, qmax, eps)
    return scale


def ma_update(float[::1] m, const float[::1] x, float c):
    """In place m = qc_ma_update_f32(m, x, c) (PyTorch's moving average)."""
    cdef int64_t i
    for i in range(m.shape[0]):
        m[i] = qc_ma_update_f32(m[i], x[i], c)


def running_minmax(const float[::1] m_lo, const float[::1] m_hi, const float[::1] lo,
                   const float[::1] hi):
    """(qc_running_min_f32(m_lo, lo), qc_running_max_f32(m_hi, hi)) elementwise,
    as new float32 arrays (a min / max observer's update)."""
    cdef int64_t i, n = m_lo.shape[0]
    if m_hi.shape[0] != n or lo.shape[0] != n or hi.shape[0] != n:
        raise ValueError("running_minmax: all four arrays must have one length")
    new_lo = np.empty(n, dtype=np.float32)
    new_hi = np.empty(n, dtype=np.float32)
    cdef float[::1] rl = new_lo
    cdef float[::1] rh = new_hi
    for i in range(n):
        rl[i] = qc_running_min_f32(m_lo[i], lo[i])
        rh[i] = qc_running_max_f32(m_hi[i], hi[i])
    return new_lo, new_hi


def observe_update(int mode, bint first, float c, float d, float[::1] smin, float[::1] smax,
                   const float[::1] lo, const float[::1] hi):
    """In place, per channel: (smin, smax) = qc_observe_update(mode, first, c,
    d, lo, hi) -- an observer's update by its rule (qc_minmax.h), the one
    the GPU's reductions apply in their last block.  With
    ``OBS_FIRST_IF_EMPTY`` in mode the first-batch rule is per channel by
    the state's values and ``first`` is not used."""
    cdef int64_t i, n = smin.shape[0]
    if smax.shape[0] != n or lo.shape[0] != n or hi.shape[0] != n:
        raise ValueError("observe_update: all four arrays must have one length")
    cdef bint by_value = (mode & QC_OBS_FIRST_IF_EMPTY) != 0
    for i in range(n):
        qc_observe_update(mode, qc_obs_first(mode, 0 if first else 1, smin[i], smax[i])
                          if by_value else first, c, d, lo[i], hi[i], &smin[i], &smax[i])


# -------------------------------------------------------- fused FakeQuantize
cdef enum:
    ST_OBSERVED = 0
    ST_NONFINITE_SKIPPED = 1
    ST_NONFINITE_REFUSED = 2
    ST_NOT_OBSERVED = 3
    ST_NO_MEMORY = 4

#: status codes of observe_fake_quant_f32
OBSERVED, NONFINITE_SKIPPED, NONFINITE_REFUSED, NOT_OBSERVED = (
    ST_OBSERVED, ST_NONFINITE_SKIPPED, ST_NONFINITE_REFUSED, ST_NOT_OBSERVED)

cdef int AFFINE = FAMILIES["affine"]


def observe_fake_quant_f32(cnp.ndarray x, cnp.ndarray y, cnp.ndarray mask,
                           cnp.ndarray state, int rule, float c, int nan_policy,
                           cnp.ndarray qparams_out, cnp.ndarray zp_out,
                           int64_t qmin, int64_t qmax, float eps, int symmetric,
                           int64_t zp_fixed, int quantize, int mode, int nthreads):
    """FakeQuantize's per-tensor float32 step in one call: observe, qparams,
    fake quant (two passes over x, no temporaries).

    All arrays must be C-contiguous with the dtypes below (the caller,
    ``FakeQuantize._forward_fused``, guarantees it; they are checked here
    cheaply): x, y float32[n] (y may be x), mask uint8[n] or None,
    state = float32[3] [min, max, batches seen (0 / 1)], qparams_out
    float32[1] (scale), zp_out int64[1].  rule: ``OBS_MINMAX`` or
    ``OBS_MOVING_AVG`` with c (qc_observe_update), or 0 not to observe;
    nan_policy: 0 skip, 1 propagate, 2 refuse (return NONFINITE_REFUSED,
    nothing written).  qparams (qc_qparams) are recomputed from the state
    whenever it is observed and used for the fake quant when ``quantize``.
    Returns a status code.  (Raw data pointers rather than typed
    memoryviews: this entry point is on the per-step path, where six buffer
    acquisitions would cost more than the kernel at 1 Ki elements.)
    """
    cdef int64_t n = cnp.PyArray_SIZE(x)
    cdef int status
    _check_f32(x, n, False)
    _check_f32(y, n, True)
    _check_f32(state, 3, True)
    _check_f32(qparams_out, 1, True)
    if cnp.PyArray_TYPE(zp_out) != cnp.NPY_INT64 or cnp.PyArray_SIZE(zp_out) < 1 or \
            not cnp.PyArray_ISCARRAY(zp_out):
        raise ValueError("zp_out must be a writable contiguous int64[1] array")
    cdef unsigned char* mp = NULL
    if mask is not None:
        if cnp.PyArray_TYPE(mask) != cnp.NPY_UINT8 or cnp.PyArray_SIZE(mask) != n or \
                not cnp.PyArray_ISCARRAY(mask):
            raise ValueError("mask must be a writable contiguous uint8 array like x")
        mp = <unsigned char*>cnp.PyArray_DATA(mask)
    cdef const float* xp = <const float*>cnp.PyArray_DATA(x)
    cdef float* yp = <float*>cnp.PyArray_DATA(y)
    cdef float* sp = <float*>cnp.PyArray_DATA(state)
    cdef float* qp = <float*>cnp.PyArray_DATA(qparams_out)
    cdef int64_t* zp = <int64_t*>cnp.PyArray_DATA(zp_out)
    with nogil:
        status = _observe_fake_quant(xp, yp, mp, n, sp, rule, c, nan_policy, qp, zp, qmin,
                                     qmax, eps, symmetric, zp_fixed, quantize, mode, nthreads)
    if status == ST_NO_MEMORY:
        _no_scratch(n)
    return status


cdef int _no_scratch(int64_t n) except -1:
    """The fused step's MemoryError (its min / max scratch for n values)."""
    raise MemoryError(f"observe_fake_quant_f32: cannot allocate the scratch of the min / "
                      f"max of {n} values ({_units(1, 1, n).n} work units)")


cdef float NAN_F = float("nan")


def fake_quantize_step_f32(object x, object out, object lo, object hi, bint seen, int rule,
                           float c, int nan_policy, object scale, object zp, int64_t qmin,
                           int64_t qmax, float eps, int symmetric, int64_t zp_fixed,
                           bint quantize, int mode, int nthreads):
    """FakeQuantize.forward's common case: :func:`observe_fake_quant_f32`
    on the caller's own state arrays, with the layout checks and the
    allocations its Python caller would make done here (they cost more
    than the kernel at 1 Ki elements).

    Returns None, having read and written nothing, unless every argument
    has the form below; the caller then takes its general path (which
    reports whatever is wrong).  x: a numpy array (not a subclass) of
    native float32, aligned and C-contiguous; out: None or such an array,
    writable, of x's shape, either x's memory or disjoint from it; lo, hi:
    the observer's min_val / max_val, writable native float32 0-d arrays;
    scale, zp: writable native float32[1] / int64[1] arrays (the qparams).

    Otherwise ``(status, y, mask)``, as the general path's step: rule
    (0: do not observe), c, nan_policy, qmin ... nthreads as for
    :func:`observe_fake_quant_f32`; ``seen``: whether the observer holds a
    batch.  An observed batch (status OBSERVED) is written into lo / hi
    and its qparams into scale / zp, in place.  An observing step of an
    observer that holds no batch sets the scale to NaN unless the batch is
    observed or skipped (FakeQuantize's class Notes: NaN qparams, kept
    when the batch is skipped as non-finite).  When ``quantize``, y is
    ``out`` or a new C-ordered float32 array like x, and mask a new uint8
    one, both written; else both are None.  MemoryError, as
    :func:`observe_fake_quant_f32`'s, when the scratch of a large x cannot
    be allocated (nothing written then).
    """
    if not (_plain_array(x, cnp.NPY_FLOAT32, False) and _plain_array(lo, cnp.NPY_FLOAT32, True)
            and _plain_array(hi, cnp.NPY_FLOAT32, True)
            and _plain_array(scale, cnp.NPY_FLOAT32, True)
            and _plain_array(zp, cnp.NPY_INT64, True)):
        return None
    cdef cnp.ndarray xa = <cnp.ndarray>x
    cdef cnp.ndarray lo_a = <cnp.ndarray>lo, hi_a = <cnp.ndarray>hi
    cdef cnp.ndarray s_a = <cnp.ndarray>scale, z_a = <cnp.ndarray>zp
    if cnp.PyArray_NDIM(lo_a) != 0 or cnp.PyArray_NDIM(hi_a) != 0 or \
            cnp.PyArray_NDIM(s_a) != 1 or cnp.PyArray_DIMS(s_a)[0] != 1 or \
            cnp.PyArray_NDIM(z_a) != 1 or cnp.PyArray_DIMS(z_a)[0] != 1:
        return None
    cdef int i, nd = cnp.PyArray_NDIM(xa)
    cdef cnp.npy_intp* dims = cnp.PyArray_DIMS(xa)
    cdef int64_t n = cnp.PyArray_SIZE(xa)
    cdef const char* xb = <const char*>cnp.PyArray_DATA(xa)
    cdef const char* ob
    cdef cnp.ndarray oa
    if out is not None:
        if not _plain_array(out, cnp.NPY_FLOAT32, True):
            return None
        oa = <cnp.ndarray>out
        if cnp.PyArray_NDIM(oa) != nd:
            return None
        for i in range(nd):
            if cnp.PyArray_DIMS(oa)[i] != dims[i]:
                return None
        ob = <const char*>cnp.PyArray_DATA(oa)
        if ob != xb and ob < xb + 4 * n and xb < ob + 4 * n:  # partial overlap
            return None
    y = mask = None
    cdef float* yp = NULL
    cdef unsigned char* mp = NULL
    if quantize:
        y = out if out is not None else cnp.PyArray_EMPTY(nd, dims, cnp.NPY_FLOAT32, 0)
        mask = cnp.PyArray_EMPTY(nd, dims, cnp.NPY_UINT8, 0)
        yp = <float*>cnp.PyArray_DATA(<cnp.ndarray>y)
        mp = <unsigned char*>cnp.PyArray_DATA(<cnp.ndarray>mask)
    cdef float* lo_p = <float*>cnp.PyArray_DATA(lo_a)
    cdef float* hi_p = <float*>cnp.PyArray_DATA(hi_a)
    cdef float* qp = <float*>cnp.PyArray_DATA(s_a)
    cdef int64_t* zpp = <int64_t*>cnp.PyArray_DATA(z_a)
    cdef float state[3]
    state[0], state[1], state[2] = lo_p[0], hi_p[0], (1 if seen else 0)
    cdef bint nan_first = rule != QC_OBS_NONE and not seen
    cdef float kept = qp[0]
    cdef int status
    if nan_first:
        qp[0] = NAN_F
    with nogil:
        status = _observe_fake_quant(<const float*>xb, yp, mp, n, state, rule, c, nan_policy,
                                     qp, zpp, qmin, qmax, eps, symmetric, zp_fixed, quantize,
                                     mode, nthreads)
    if nan_first and status != ST_OBSERVED and status != ST_NONFINITE_SKIPPED:
        qp[0] = kept  # nothing observed (empty x), refused, or no memory: unchanged
    if status == ST_NO_MEMORY:
        _no_scratch(n)
    if status == ST_OBSERVED:
        lo_p[0], hi_p[0] = state[0], state[1]
    return status, y, mask


cdef inline bint _plain_array(object a, int typenum, bint writable):
    """a is a numpy array (not a subclass) of type ``typenum``, native
    byte order, aligned and C-contiguous (and writable if asked)."""
    if not cnp.PyArray_CheckExact(a):
        return False
    cdef cnp.ndarray arr = <cnp.ndarray>a
    return cnp.PyArray_TYPE(arr) == typenum and cnp.PyArray_ISCARRAY_RO(arr) and \
        (not writable or cnp.PyArray_ISWRITEABLE(arr))


cdef inline int _check_f32(cnp.ndarray a, int64_t n, bint writable) except -1:
    if cnp.PyArray_TYPE(a) != cnp.NPY_FLOAT32 or cnp.PyArray_SIZE(a) < n or \
            not cnp.PyArray_ISCARRAY_RO(a) or (writable and not cnp.PyArray_ISWRITEABLE(a)):
        raise ValueError(f"expected a {'writable ' if writable else ''}aligned C-contiguous "
                         f"float32 array of at least {n} elements")
    return 0


cdef int _observe_fake_quant(const float* xp, float* yp, unsigned char* mp, int64_t n,
                             float* state, int rule, float c, int nan_policy,
                             float* scale_out, int64_t* zp_out, int64_t qmin, int64_t qmax,
                             float eps, int symmetric, int64_t zp_fixed, int quantize,
                             int mode, int nthreads) noexcept nogil:
    cdef float lo = INFINITY_F, hi = -INFINITY_F
    cdef float params[3]
    cdef unsigned char flags = 0
    cdef int status = ST_NOT_OBSERVED
    if rule != QC_OBS_NONE and n > 0:
        if _minmax_run(xp, _units(1, 1, n), nthreads, &lo, &hi, &flags) != 0:
            return ST_NO_MEMORY
        qc_minmax_finish(&lo, &hi, flags)
        status = ST_OBSERVED
        if qc_mm_nonfinite(lo, hi, flags):
            if nan_policy == 0:
                status = ST_NONFINITE_SKIPPED
            elif nan_policy == 2:
                return ST_NONFINITE_REFUSED
        if status == ST_OBSERVED:
            qc_observe_update(rule, state[2] == 0, c, 0.0, lo, hi, &state[0], &state[1])
            state[2] += 1
            qc_qparams(state[0], state[1], QC_QS_SYMMETRIC if symmetric else QC_QS_AFFINE, eps,
                       qmin, qmax, zp_fixed, scale_out, zp_out)
    if quantize and n > 0:
        params[0] = scale_out[0]
        params[1] = <float>1.0 / params[0]
        params[2] = <float>zp_out[0]
        _ew_run(AFFINE, xp, yp, mp, _units(1, 1, n), params, <float>qmin, <float>qmax, mode,
                nthreads)
    return status
