"""GPU twins of the CPU extension's code families, group recipes and
block-scaled recipes (``cuda/formats.cu``): encode / decode, their grouped
forms, the group and block-scaled quantizers.  Exposed through
:mod:`quantcore_gpu.kernels`."""
import numpy as np

from ._runtime import (_BLOCK_LIST, _CODE_TYPES, _CTYPE, _DEC_LIST, _ENC_LIST, _RECIPE_LIST, _check,
                       _dt, _function, _index, _param, _sm_count)


# ------------------------------------------------ codes and group recipes

_FMT_THREADS = 256   # QC_FMT_THREADS in formats.cu


def _code_launch(enc, family, x, codes, n_rows, a, b, c, layout, params, u0, u1, mode, func):
    """One launch of qc_enc / qc_dec: x is the float side, codes the integer
    side, both C-contiguous 1-D of one size."""
    _check(x)
    _check(codes, "codes")
    families = _ENC_LIST if enc else _DEC_LIST
    if not 0 <= int(family) < len(families):
        raise ValueError(f"{func}: unknown family {family}")
    _, op, nparam, cbytes = families[int(family)]
    width = codes.dtype.itemsize
    if codes.dtype.kind not in "iu" or not cbytes & width or codes.size != x.size:
        raise ValueError(f"{func}: expected an integer code array of {x.size} elements with a "
                         "width the family supports")
    n = int(x.size)
    if n == 0:
        return
    dtype = _dt(x)
    T = dtype.type
    params = _param(params, dtype)
    count = n_rows
    if params.size < nparam * count:
        raise ValueError(f"{func}: expected {nparam * count} parameters, got {params.size}")
    ct, it = _index(n)
    kernel = "qc_enc" if enc else "qc_dec"
    fn = _function("formats.cu",
                   f"{kernel}<{op}, {_CTYPE[dtype]}, {_CODE_TYPES[width]}, {ct}, {layout}>")
    grid = max(1, min(-(-n // _FMT_THREADS), _sm_count() * 8 * 4))
    codes = codes.view(np.uint8 if width == 1 else np.uint16)  # (the kernels' code types)
    head = (x, codes) if enc else (codes, x)
    fn((grid,), (_FMT_THREADS,), head + (it(n), it(a), it(b), it(c), it(count), params, T(u0),
                                         T(u1), np.int32(mode)))


def _view_args(n, outer, C, inner, func):
    if int(outer) * int(C) * int(inner) != n:
        raise ValueError(f"{func}: the view ({outer}, {C}, {inner}) does not have {n} elements")
    return (int(C), (int(inner), int(C), 0, 1)) if int(C) > 1 else (1, (1, 1, 0, 0))


def encode(family, x, codes, outer, C, inner, params, u0, u1, mode, nthreads=None):
    """The CPU's ``encode``: encode family `family` (``ENCODE_FAMILIES``) over
    the (outer, C, inner) view of x into codes (cupy integer arrays)."""
    count, (a, b, c, layout) = _view_args(int(x.size), outer, C, inner, "encode")
    _code_launch(True, family, x, codes, count, a, b, c, layout, params, u0, u1, mode, "encode")


def decode(family, codes, y, outer, C, inner, params, u0, u1, mode, nthreads=None):
    """The CPU's ``decode``: codes into y over the (outer, C, inner) view."""
    count, (a, b, c, layout) = _view_args(int(y.size), outer, C, inner, "decode")
    _code_launch(False, family, y, codes, count, a, b, c, layout, params, u0, u1, mode, "decode")


def _group_args(n, rows, K, g, func):
    rows, K, g = int(rows), int(K), int(g)
    if g < 1 or rows * K != n:
        raise ValueError(f"{func}: {rows} rows of {K} in groups of {g} do not fit {n} elements")
    ng = -(-K // g)
    return rows * ng, K, g, ng


def encode_groups(family, x, codes, rows, K, g, params, u0, u1, mode, nthreads=None):
    """The CPU's ``encode_groups``: one parameter set per group of g
    consecutive elements of each row of K."""
    count, K, g, ng = _group_args(int(x.size), rows, K, g, "encode_groups")
    _code_launch(True, family, x, codes, count, K, g, ng, 2, params, u0, u1, mode,
                 "encode_groups")


def decode_groups(family, codes, y, rows, K, g, params, u0, u1, mode, nthreads=None):
    """The CPU's ``decode_groups``."""
    count, K, g, ng = _group_args(int(y.size), rows, K, g, "decode_groups")
    _code_launch(False, family, y, codes, count, K, g, ng, 2, params, u0, u1, mode,
                 "decode_groups")


def group_quant(recipe, x, codes, y, mask, scale, zp, rows, K, g, qmin, qmax, mode,
                nthreads=None):
    """The CPU's ``group_quant``: recipe `recipe` (``GROUP_RECIPES``) over
    rows of K float32 values in groups of g; writes scale / zp (float32 per
    group) and codes (uint8) / y (float32) / mask (uint8) when not None."""
    launch = _warp_per_group_launch(
        "qc_group", _RECIPE_LIST, recipe, x, rows, K, g,
        (("codes", codes, False), ("y", y, False), ("mask", mask, False),
         ("scale", scale, True), ("zp", zp, True)), "group_quant")
    if launch is not None:
        fn, grid, it, K, g = launch
        fn((grid,), (_FMT_THREADS,), (x, codes, y, mask, scale, zp, it(int(rows)), it(K), it(g),
                                      np.float32(qmin), np.float32(qmax), np.int32(mode)))


def _warp_per_group_launch(kernel, recipe_list, recipe, x, rows, K, g, outputs, func):
    """The checks and the launch shape of a one-warp-per-group kernel of
    formats.cu (``kernel<recipe's struct, index type>``) over rows of K
    float32 values in groups of g; ``outputs``: (name, array or None,
    per group (else per element)).  (kernel function, grid, index type, K,
    g), or None when x is empty."""
    _check(x)
    if x.dtype != np.float32:
        raise ValueError(f"{func}: expected float32, got {x.dtype}")
    if not 0 <= int(recipe) < len(recipe_list):
        raise ValueError(f"{func}: unknown recipe {recipe}")
    n = int(x.size)
    count, K, g, _ = _group_args(n, rows, K, g, func)
    for name, a, per_group in outputs:
        size = count if per_group else n
        if a is not None and (_check(a, name).size != size):
            raise ValueError(f"{func}: {name} must have {size} elements")
    if n == 0:
        return None
    ct, it = _index(n)
    fn = _function("formats.cu", f"{kernel}<{recipe_list[int(recipe)][1]}, {ct}>")
    warps = _FMT_THREADS // 32
    return fn, max(1, min(-(-count // warps), _sm_count() * 8 * 4)), it, K, g


def block_scaled_quant(recipe, x, scodes, codes, y, rows, K, g, elem, mode, p0, p1,
                       nthreads=None, scale_from=None):
    """The CPU's ``block_scaled_quant``: recipe `recipe` (``BLOCK_RECIPES``:
    MX, NVFP4) over rows of K float32 values in blocks of g; writes scodes
    (uint8 per block) and codes (uint8) / y (float32) when not None.
    ``scale_from``: (range, div, mul, gout) to take ``p1 = gs = f32(amax /
    div)`` and ``p0 = f32(mul * gs)`` from the device instead, amax from
    ``range`` (float32[2]: x's finished min and max; +NaN when either is
    NaN), ``gs`` also written to ``gout`` (float32[1] or None)."""
    launch = _warp_per_group_launch(
        "qc_block_scaled", _BLOCK_LIST, recipe, x, rows, K, g,
        (("scodes", scodes, True), ("codes", codes, False), ("y", y, False)),
        "block_scaled_quant")
    if launch is not None:
        fn, grid, it, K, g = launch
        rng, div, mul, gout = scale_from if scale_from is not None else (None, 1.0, 1.0, None)
        if rng is not None:
            _check(rng, "range")
            if rng.dtype != np.float32 or rng.size != 2:
                raise ValueError("block_scaled_quant: range must be float32[2]")
            p0 = p1 = 0.0
        fn((grid,), (_FMT_THREADS,), (x, scodes, codes, y, it(int(rows)), it(K), it(g),
                                      np.int32(elem), np.int32(mode), np.float32(p0),
                                      np.float32(p1), rng, np.float32(div), np.float32(mul),
                                      gout))
