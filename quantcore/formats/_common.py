"""Code shared by the formats modules (casts, ONNX Q/DQ, groups, MX): the
minifloat format table and the allow-list each consumer derives from it,
the mode bits of qc_formats.h, argument checks, and the drivers of the
encode / decode families.  Nothing here imports another formats module.
"""
import math

import numpy as np

from .. import _arrays as A
from .._cpu import _kernels as K
from .._cpu.threads import effective_n_threads

F32 = np.float32

#: Every minifloat format of qc_formats.h (QC_FMT_*, the low bits of a
#: family's mode word): name -> (id, largest finite value, consumers).  One
#: line per format; each consumer's allow-list below is derived from it
#: (tests/test_formats.py checks the ids against the header and each list
#: against this table):
#:
#: - ``"cast"``: cast_fp8 / fp8_decode / fp8_fake_cast / the scaled FP8 recipes
#: - ``"onnx"``: the ``float8_*`` types of quantize_linear / dequantize_linear
#: - ``"mx"``:   an MX element type (its name without the ``fn`` suffix)
#: - ``"onnx_fp4"``: the ``float4_*`` types of quantize_linear / dequantize_linear
MINIFLOATS = {
    "e4m3fn": (0, 448.0, ("cast", "onnx", "mx")),
    "e5m2": (1, 57344.0, ("cast", "onnx", "mx")),
    "e4m3fnuz": (2, 240.0, ("cast", "onnx")),
    "e5m2fnuz": (3, 57344.0, ("cast", "onnx")),
    "e2m3fn": (4, 7.5, ("mx",)),
    "e3m2fn": (5, 28.0, ("mx",)),
    "e2m1fn": (6, 6.0, ("mx", "onnx_fp4")),
}
#: the number of minifloat ids (QC_FMT_COUNT); the MX element ids go on
#: after them (qc_mx.h: QC_MX_INT8 = QC_FMT_COUNT)
FMT_COUNT = len(MINIFLOATS)


def formats_for(role):
    """{format name: id} of the minifloat formats a consumer accepts."""
    return {name: fid for name, (fid, _, roles) in MINIFLOATS.items() if role in roles}


#: the FP8 formats of the casts and the scaled FP8 recipes -> format id
FP8_FORMATS = formats_for("cast")
#: the FP8 element types of ONNX QuantizeLinear / DequantizeLinear -> format id
ONNX_FP8_FORMATS = formats_for("onnx")
#: the FP4 element types of ONNX QuantizeLinear / DequantizeLinear
#: (FLOAT4E2M1, named as ml_dtypes names it: ``"float4_" + name``) -> format id
ONNX_FP4_FORMATS = formats_for("onnx_fp4")
#: the largest finite value of each FP8 format
FP8_MAX = {name: MINIFLOATS[name][1] for name in FP8_FORMATS}
#: the cast formats whose NaN encoding option (NAN_ENCODING) changes their
#: codes: the one list.  ``_cast_mode`` keeps the NaN bit for these only and
#: drops it for the others, so that their kernels run the loops specialised
#: without it; qc_format_families.h's QC_FP8_CASTS (the cast modes with their
#: own CPU loop) must hold each cast format under each overflow policy and
#: these under the ml_dtypes NaN too (tests/test_registry_drift.py)
NAN_ENCODED_FORMATS = ("e5m2",)

# Mode bits, mirrored from qc_formats.h / qc_families.h (one definition
# there; tests/test_formats.py checks these against the header).
OVERFLOW = {"satfinite": 0, "nonsat": 16, "torch": 32}
NAN_ENCODING = {"sign": 0, "ml_dtypes": 64}
F8_SCALE_MUL, F8_SCALE_DIV, F8_DEQ_MUL, F8_DEQ_DIV, F8_MASK_AMAX = 128, 256, 512, 1024, 2048
F8_PLUS_ZERO = 4096
INT_SIGNED, INT_WRAP32, INT_ADD_FLOAT = 32, 64, 128
GRP_SYMMETRIC, GRP_HQQ_OWN, GRP_F16_SCALE = 1, 2, 4

#: ONNX integer element types: (qmin, qmax, numpy container)
INT_TYPES = {
    "int8": (-128, 127, np.int8), "uint8": (0, 255, np.uint8),
    "int16": (-32768, 32767, np.int16), "uint16": (0, 65535, np.uint16),
    "int4": (-8, 7, np.int8), "uint4": (0, 15, np.uint8),
    "int2": (-2, 1, np.int8), "uint2": (0, 3, np.uint8),
}
_ENC, _DEC = K.ENCODE_FAMILIES, K.DECODE_FAMILIES


# ----------------------------------------------------------------- helpers
def _fp8_name(fmt, func):
    name = fmt[len("float8_"):] if isinstance(fmt, str) and fmt.startswith("float8_") else fmt
    if not isinstance(name, str) or name not in FP8_FORMATS:
        raise ValueError(f"{func}: fmt must be one of {sorted(FP8_FORMATS)} (optionally with a "
                         f"'float8_' prefix), got {fmt!r}")
    return name


def _cast_mode(name, overflow, nan, func):
    """The mode word of a cast / fake cast: format | overflow policy | NaN
    encoding (which matters for NAN_ENCODED_FORMATS only: dropped for the
    other formats, so that their kernels run the loops specialised without
    it)."""
    nan_bit = _choice(NAN_ENCODING, nan, "nan", func)
    return FP8_FORMATS[name] | _choice(OVERFLOW, overflow, "overflow", func) | \
        (nan_bit if name in NAN_ENCODED_FORMATS else 0)


def _choice(table, value, name, func):
    if not isinstance(value, str) or value not in table:
        raise ValueError(f"{func}: {name} must be one of {sorted(table)}, got {value!r}")
    return table[value]


def _fp8_dtype_name(arr):
    """'e4m3fn' etc. for an ml_dtypes float8 array, else None."""
    name = getattr(arr, "dtype", None)
    name = getattr(name, "name", "")
    return name[len("float8_"):] if name.startswith("float8_") and \
        name[len("float8_"):] in FP8_FORMATS else None


#: ml_dtypes' sub-byte integer dtypes -> the numpy container of their values
_SUBBYTE_INTS = {"int4": np.int8, "uint4": np.uint8, "int2": np.int8, "uint2": np.uint8}


def _onnx_dtype_name(arr):
    """The ONNX element type name of an ml_dtypes array (``float8_e4m3fn``,
    ``float4_e2m1fn``, ``int4``, ``uint2``, ...) or a numpy integer array
    (its dtype name), else None."""
    dt = getattr(arr, "dtype", None)
    name = getattr(dt, "name", "")
    if _fp8_dtype_name(arr) is not None or name in _SUBBYTE_INTS:
        return name
    if name.startswith("float4_") and name[len("float4_"):] in ONNX_FP4_FORMATS:
        return name
    return name if getattr(dt, "kind", "") in "iu" and name else None


def _nthreads(flat):
    return effective_n_threads(flat.shape[0])


def _param(values, work, xp):
    """A parameter array (NP arrays of C values, concatenated) for the
    kernels: numpy for the CPU, kept as given (host or device) for the GPU."""
    if xp is np:
        return np.ascontiguousarray(np.concatenate([np.asarray(v, work).reshape(-1)
                                                    for v in values]))
    return xp.concatenate([xp.asarray(v, dtype=work).reshape(-1) for v in values])


def _channel_count(axis, shape):
    return None if axis is None else shape[axis]


def _encode(family, arr, params, u0, u1, mode, axis, code_dtype, out, func):
    """An encode family over ``arr`` (per tensor or per channel along
    ``axis``) into codes of ``code_dtype`` with arr's shape."""
    work = A.compute_dtype(arr.dtype)
    layout = A.Layout(arr, work)
    o = A.Output(layout, arr, out, np.dtype(code_dtype), np.dtype(code_dtype), func)
    flat = layout.flat
    outer, C, inner = (1, 1, flat.shape[0]) if axis is None else layout.channels(axis)
    A.kernels_for(flat, func).encode(_ENC[family], flat, o.flat, outer, C, inner,
                                     _param(params, work, layout.xp), u0, u1, mode,
                                     _nthreads(flat))
    return o.finish(np.dtype(code_dtype))


def _decode(family, codes, params, u0, u1, mode, axis, dtype, out, func):
    """A decode family over integer ``codes`` into floats of ``dtype``."""
    dtype = np.dtype(dtype)
    if dtype not in A.FLOAT_DTYPES:
        raise TypeError(f"{func}: dtype must be float16, float32 or float64, got {dtype}")
    work = A.compute_dtype(dtype)
    layout = A.Layout(codes, codes.dtype)
    o = A.Output(layout, codes, out, dtype, work, func)
    flat = layout.flat
    outer, C, inner = (1, 1, flat.shape[0]) if axis is None else layout.channels(axis)
    A.kernels_for(flat, func).decode(_DEC[family], flat, o.flat, outer, C, inner,
                                     _param(params, work, layout.xp), u0, u1, mode,
                                     _nthreads(flat))
    return o.finish(dtype)


def _as_codes(q, name, func):
    """A numpy / cupy integer array of codes (ml_dtypes float8 arrays are
    viewed as their uint8 bits)."""
    A.require_cpu(q, func)
    xp = A.array_module(q)
    arr = q if A.is_cupy_array(q) or isinstance(q, np.ndarray) else np.asarray(q)
    name = arr.dtype.name
    if _fp8_dtype_name(arr) is not None or name.startswith("float4_"):
        arr = arr.view(np.uint8)
    elif name in _SUBBYTE_INTS:  # ml_dtypes int4 / uint4 / int2 / uint2: their values
        arr = arr.astype(_SUBBYTE_INTS[name])
    if arr.dtype.kind not in "iu" or arr.dtype.itemsize > 2:
        raise TypeError(f"{func}: {name} must be an int8 / uint8 / int16 / uint16 array (or an "
                        f"ml_dtypes float8 array), got {A.describe(q)}")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return xp, arr


def _float_input(x, func):
    if A.is_cupy_array(x) or isinstance(x, np.ndarray):
        if x.dtype.name == "bfloat16":  # ml_dtypes bfloat16: exact in float32
            x = x.astype(np.float32)
    return A.as_float_array(x, "x", func)


# ------------------------------------------------------------------ layout
def _to_last(a, ax):
    """``moveaxis(a, ax, -1)`` through ``transpose`` (numpy and cupy alike)."""
    perm = [d for d in range(a.ndim) if d != ax] + [ax]
    return a.transpose(perm)


def _from_last(a, ax):
    """The inverse of :func:`_to_last`."""
    perm = list(range(a.ndim - 1))
    perm.insert(ax, a.ndim - 1)
    return a.transpose(perm)


def _blocked_call(arr, ax, fn):
    """fn(rows x K contiguous data) -> result of the same layout, with the
    block axis moved last (a copy only when it is not already)."""
    xp = A.array_module(arr)
    moved = xp.ascontiguousarray(_to_last(arr, ax))
    res = fn(moved, math.prod(moved.shape[:-1]), moved.shape[-1])
    return xp.ascontiguousarray(_from_last(res, ax))


def _blocked_input(x, axis, size, func, x_name="x", size_name="block_size"):
    """``(arr, axis, size)`` checked for a function that works on blocks (or
    groups) of ``size`` elements along ``axis``: a float input of at least
    one dimension, a valid axis, a whole ``size >= 1``; the messages name
    the arguments ``x_name`` and ``size_name``."""
    arr = _float_input(x, func)
    if arr.ndim == 0:
        raise ValueError(f"{func}: {x_name} must have at least one dimension")
    ax = A.normalize_axis(axis, arr.ndim, func)
    n = A.as_int(size, size_name, func)
    if n < 1:
        raise ValueError(f"{func}: {size_name} must be >= 1, got {n}")
    return arr, ax, n
