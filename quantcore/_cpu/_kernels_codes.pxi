# Included by _kernels.pyx (see _kernels_ew.pxi).  The encode / decode
# families (encode, decode and their grouped forms), the group recipes
# (group_quant) and the block-scaled recipes (block_scaled_quant).

# ------------------------------------------------------- codes and groups
#: encode (float -> code) and decode (code -> float) family name -> id
#: (qc_registry.h: QC_ENCODE_FAMILIES, QC_DECODE_FAMILIES), and the group
#: recipes of group_quant (QC_GROUP_RECIPES)
ENCODE_FAMILIES = {qc_encode_family_names[i].decode(): i for i in range(QC_ENC_COUNT)}
DECODE_FAMILIES = {qc_decode_family_names[i].decode(): i for i in range(QC_DEC_COUNT)}
GROUP_RECIPES = {qc_group_recipe_names[i].decode(): i for i in range(QC_GRP_COUNT)}
#: the block-scaled recipes of block_scaled (QC_BLOCK_RECIPES: MX, NVFP4)
BLOCK_RECIPES = {qc_block_recipe_names[i].decode(): i for i in range(QC_BLK_COUNT)}


cdef inline int _check_codes(cnp.ndarray codes, int64_t n, int allowed, bint writable,
                             str func) except -1:
    """codes: an aligned C-contiguous array of n one- or two-byte integers
    whose width the family supports (allowed: bit 1 one byte, bit 2 two)."""
    if codes is None or not cnp.PyArray_ISCARRAY_RO(codes) or \
            cnp.PyArray_SIZE(codes) != n or (writable and not cnp.PyArray_ISWRITEABLE(codes)) \
            or cnp.PyArray_TYPE(codes) not in (cnp.NPY_UINT8, cnp.NPY_INT8, cnp.NPY_UINT16,
                                               cnp.NPY_INT16) \
            or not (allowed & cnp.PyArray_ITEMSIZE(codes)):
        raise ValueError(f"{func}: expected {'a writable ' if writable else 'an '}aligned "
                         f"C-contiguous integer code array of {n} elements with a width the "
                         f"family supports")
    return cnp.PyArray_ITEMSIZE(codes)


cdef void _code_run(bint enc, int family, floating* x, char* codes, int cb, Units L,
                    const floating* params, floating u0, floating u1, int mode,
                    int nthreads) noexcept nogil:
    """Encode (x -> codes) or decode (codes -> x) family `family` over every
    unit of L."""
    cdef int64_t u
    cdef Unit un
    for u in prange(L.n, schedule='static', num_threads=nthreads if L.n > 1 else 1):
        un = _unit(&L, u)
        if un.channel >= 0:
            if enc:
                enc_block(family, x + un.start, codes + un.start * cb, cb, un.count, params,
                          L.C, un.channel, u0, u1, mode)
            else:
                dec_block(family, codes + un.start * cb, cb, x + un.start, un.count, params,
                          L.C, un.channel, u0, u1, mode)
        elif enc:
            enc_rowvec(family, x + un.start, codes + un.start * cb, cb, un.count, L.C, params,
                       u0, u1, mode)
        else:
            dec_rowvec(family, codes + un.start * cb, cb, x + un.start, un.count, L.C, params,
                       u0, u1, mode)


cdef void _code_groups_run(bint enc, int family, floating* x, char* codes, int cb,
                           int64_t rows, int64_t K, int64_t g, const floating* params,
                           floating u0, floating u1, int mode, int nthreads) noexcept nogil:
    """The same over rows of K elements in groups of g (the last of a row
    may be shorter), group b = r * ng + j using parameter b of rows * ng:
    units of whole groups."""
    cdef int64_t ng = (K + g - 1) // g
    cdef Units L = _units(rows * ng, g, 1)   # units of whole groups (one row of g per group)
    cdef Unit un
    cdef int64_t u, b, r, j, start, cnt
    for u in prange(L.n, schedule='static', num_threads=nthreads if L.n > 1 else 1):
        un = _unit(&L, u)
        for b in range(u * L.nrows, u * L.nrows + un.count):
            r = b // ng
            j = b - r * ng
            start = r * K + j * g
            cnt = K - j * g
            if cnt > g:
                cnt = g
            if enc:
                enc_block(family, x + start, codes + start * cb, cb, cnt, params, rows * ng, b,
                          u0, u1, mode)
            else:
                dec_block(family, codes + start * cb, cb, x + start, cnt, params, rows * ng, b,
                          u0, u1, mode)


def _code_call(bint enc, int family, cnp.ndarray x, cnp.ndarray codes, int64_t outer,
               int64_t C, int64_t inner, int64_t g, cnp.ndarray params, double u0, double u1,
               int mode, int nthreads, str func):
    """encode / decode (g == 0: the (outer, C, inner) view) and their
    grouped forms (g > 0: rows = outer, K = inner)."""
    cdef int64_t n = cnp.PyArray_SIZE(x)
    cdef int count = QC_ENC_COUNT if enc else QC_DEC_COUNT
    if not 0 <= family < count:
        raise ValueError(f"{func}: unknown family {family}")
    _check_flat(x)
    if not enc and not cnp.PyArray_ISWRITEABLE(x):
        raise ValueError(f"{func}: the output is not writable")
    cdef int allowed = qc_encode_family_bytes[family] if enc else qc_decode_family_bytes[family]
    cdef int cb = _check_codes(codes, n, allowed, enc, func)
    if n == 0:
        return
    cdef int64_t nparams
    if g > 0:
        if outer * inner != n:
            raise ValueError(f"{func}: {outer} rows of {inner} do not make {n} elements")
        nparams = outer * ((inner + g - 1) // g)
    else:
        if outer * C * inner != n:
            raise ValueError(f"{func}: the view ({outer}, {C}, {inner}) does not have {n} "
                             "elements")
        nparams = C
    cdef int np_ = qc_encode_family_np[family] if enc else qc_decode_family_np[family]
    cdef void* pp = _params_ptr(params, x, np_ * nparams)
    cdef char* cp = <char*>cnp.PyArray_DATA(codes)
    cdef Units L
    if g <= 0:
        L = _units(outer, C, inner)
    if cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT32:
        with nogil:
            if g > 0:
                _code_groups_run(enc, family, <float*>cnp.PyArray_DATA(x), cp, cb, outer, inner,
                                 g, <const float*>pp, <float>u0, <float>u1, mode, nthreads)
            else:
                _code_run(enc, family, <float*>cnp.PyArray_DATA(x), cp, cb, L,
                          <const float*>pp, <float>u0, <float>u1, mode, nthreads)
    else:
        with nogil:
            if g > 0:
                _code_groups_run(enc, family, <double*>cnp.PyArray_DATA(x), cp, cb, outer,
                                 inner, g, <const double*>pp, u0, u1, mode, nthreads)
            else:
                _code_run(enc, family, <double*>cnp.PyArray_DATA(x), cp, cb, L,
                          <const double*>pp, u0, u1, mode, nthreads)


def encode(int family, cnp.ndarray x, cnp.ndarray codes, int64_t outer, int64_t C,
           int64_t inner, cnp.ndarray params, double u0, double u1, int mode, int nthreads):
    """Encode family `family` (``ENCODE_FAMILIES``) over the (outer, C, inner)
    view of x into codes (one- or two-byte integers of x's size, as the
    family allows); params: x's dtype, NP arrays of C values; u0, u1, mode:
    the family's uniform parameters."""
    _code_call(True, family, x, codes, outer, C, inner, 0, params, u0, u1, mode, nthreads,
               "encode")


def decode(int family, cnp.ndarray codes, cnp.ndarray y, int64_t outer, int64_t C,
           int64_t inner, cnp.ndarray params, double u0, double u1, int mode, int nthreads):
    """Decode family `family` (``DECODE_FAMILIES``): codes into y (float32 /
    float64 of the codes' size) over the (outer, C, inner) view."""
    _code_call(False, family, y, codes, outer, C, inner, 0, params, u0, u1, mode, nthreads,
               "decode")


def encode_groups(int family, cnp.ndarray x, cnp.ndarray codes, int64_t rows, int64_t K,
                  int64_t g, cnp.ndarray params, double u0, double u1, int mode, int nthreads):
    """:func:`encode` over rows of K elements with one parameter set per
    group of g consecutive elements (the last of a row may be shorter):
    params holds NP arrays of rows * ceil(K / g) values, row-major."""
    if g < 1:
        raise ValueError(f"encode_groups: the group size must be >= 1, got {g}")
    _code_call(True, family, x, codes, rows, 1, K, g, params, u0, u1, mode, nthreads,
               "encode_groups")


def decode_groups(int family, cnp.ndarray codes, cnp.ndarray y, int64_t rows, int64_t K,
                  int64_t g, cnp.ndarray params, double u0, double u1, int mode, int nthreads):
    """:func:`decode` with per-group parameters (as :func:`encode_groups`)."""
    if g < 1:
        raise ValueError(f"decode_groups: the group size must be >= 1, got {g}")
    _code_call(False, family, y, codes, rows, 1, K, g, params, u0, u1, mode, nthreads,
               "decode_groups")


cdef inline void* _opt_ptr(cnp.ndarray a, int typenum, int64_t n, str what,
                           str func) except? NULL:
    """Data of a writable C-contiguous array of `typenum` with n elements,
    or NULL for None."""
    if a is None:
        return NULL
    if not cnp.PyArray_ISCARRAY(a) or cnp.PyArray_SIZE(a) != n or \
            cnp.PyArray_TYPE(a) != typenum:
        raise ValueError(f"{func}: {what} must be a writable C-contiguous array of {n} "
                         "elements")
    return cnp.PyArray_DATA(a)


cdef int64_t _blocks_per_row(cnp.ndarray x, int64_t rows, int64_t K, int64_t g,
                             str func) except -1:
    """ceil(K / g): the groups (blocks) of g along each of the rows of K of
    x, which must be an aligned C-contiguous float32 array of rows * K."""
    cdef int64_t n = cnp.PyArray_SIZE(x)
    if cnp.PyArray_TYPE(x) != cnp.NPY_FLOAT32 or not cnp.PyArray_ISCARRAY_RO(x):
        raise ValueError(f"{func}: expected an aligned C-contiguous float32 array")
    if g < 1 or K < 1 or rows * K != n:
        raise ValueError(f"{func}: {rows} rows of {K} in groups of {g} do not fit {n} elements")
    return (K + g - 1) // g


cdef void _groups_run(bint scaled, int recipe, const float* x, unsigned char* codes, float* y,
                      unsigned char* mask, float* scale, float* zp, unsigned char* scodes,
                      int64_t rows, int64_t K, int64_t g, int elem, int mode, float p0, float p1,
                      int nthreads) noexcept nogil:
    """group_blocks (recipe of GROUP_RECIPES; p0, p1 = qmin, qmax) or, when
    scaled, block_scaled (recipe of BLOCK_RECIPES, element format elem)
    over the rows * ceil(K / g) groups of g of x, in units of whole groups
    (the rowvec layout of one row of g per group)."""
    cdef Units L = _units(rows * ((K + g - 1) // g), g, 1)
    cdef Unit un
    cdef int64_t u
    for u in prange(L.n, schedule='static', num_threads=nthreads if L.n > 1 else 1):
        un = _unit(&L, u)
        if scaled:
            block_scaled(recipe, x, scodes, codes, y, u * L.nrows, un.count, K, g, elem, mode,
                         p0, p1)
        else:
            group_blocks(recipe, x, codes, y, mask, scale, zp, u * L.nrows, un.count, K, g, p0,
                         p1, mode)


def group_quant(int recipe, cnp.ndarray x, cnp.ndarray codes, cnp.ndarray y,
                cnp.ndarray mask, cnp.ndarray scale, cnp.ndarray zp, int64_t rows, int64_t K,
                int64_t g, double qmin, double qmax, int mode, int nthreads):
    """Group quantization by recipe `recipe` (``GROUP_RECIPES``) of x
    (float32, rows of K, groups of g along each row, the last may be
    shorter): per group the finished min / max, the recipe's qparams into
    scale / zp (float32[rows * ceil(K / g)]), then codes (uint8 / int8), the
    fake-quant values y (float32) and the mask, each when not None."""
    cdef int64_t n = cnp.PyArray_SIZE(x)
    if not 0 <= recipe < QC_GRP_COUNT:
        raise ValueError(f"group_quant: unknown recipe {recipe}")
    cdef int64_t ng = _blocks_per_row(x, rows, K, g, "group_quant")
    cdef str f = "group_quant"
    cdef unsigned char* cp = <unsigned char*>_opt_ptr(codes, cnp.NPY_UINT8, n, "codes", f)
    cdef float* yp = <float*>_opt_ptr(y, cnp.NPY_FLOAT32, n, "y", f)
    cdef unsigned char* mp = <unsigned char*>_opt_ptr(mask, cnp.NPY_UINT8, n, "mask", f)
    cdef float* sp = <float*>_opt_ptr(scale, cnp.NPY_FLOAT32, rows * ng, "scale", f)
    cdef float* zpp = <float*>_opt_ptr(zp, cnp.NPY_FLOAT32, rows * ng, "zp", f)
    with nogil:
        _groups_run(False, recipe, <const float*>cnp.PyArray_DATA(x), cp, yp, mp, sp, zpp, NULL,
                    rows, K, g, 0, mode, qmin, qmax, nthreads)


def block_scaled_quant(int recipe, cnp.ndarray x, cnp.ndarray scodes, cnp.ndarray codes,
                 cnp.ndarray y, int64_t rows, int64_t K, int64_t g, int elem, int mode,
                 double p0, double p1, int nthreads):
    """Block-scaled quantization by recipe `recipe` (``BLOCK_RECIPES``) of x
    (float32, rows of K, blocks of g along each row, the last may be
    shorter): per block the amax, the recipe's scale code into scodes
    (uint8[rows * ceil(K / g)]), then the element codes (uint8, one per
    element) and the fake-quant values y (float32), each when not None."""
    cdef int64_t n = cnp.PyArray_SIZE(x)
    if not 0 <= recipe < QC_BLK_COUNT:
        raise ValueError(f"block_scaled_quant: unknown recipe {recipe}")
    cdef int64_t ng = _blocks_per_row(x, rows, K, g, "block_scaled_quant")
    cdef str f = "block_scaled_quant"
    cdef unsigned char* sp = <unsigned char*>_opt_ptr(scodes, cnp.NPY_UINT8, rows * ng, "scodes",
                                                      f)
    cdef unsigned char* cp = <unsigned char*>_opt_ptr(codes, cnp.NPY_UINT8, n, "codes", f)
    cdef float* yp = <float*>_opt_ptr(y, cnp.NPY_FLOAT32, n, "y", f)
    with nogil:
        _groups_run(True, recipe, <const float*>cnp.PyArray_DATA(x), cp, yp, NULL, NULL, NULL, sp,
                    rows, K, g, elem, mode, p0, p1, nthreads)
