"""Integer group quantization of LLM weights (int4 / int8 with a scale and
zero point per group; the formats specification §6) and int4 packing, on
numpy (CPU) and cupy (GPU).  Integer codes are int8 / uint8 values (4- and
2-bit ones unpacked, one per byte; :func:`pack_int4` packs them two per
byte).
"""
import math

import numpy as np

from .. import _arrays as A
from .._cpu import _kernels as K
from ._common import (F32, GRP_F16_SCALE, GRP_HQQ_OWN, GRP_SYMMETRIC, INT_ADD_FLOAT, INT_SIGNED,
                      _DEC, _as_codes, _blocked_call, _blocked_input, _from_last, _nthreads,
                      _param, _to_last)

#: recipe name -> (its id in qc_registry.h QC_GROUP_RECIPES, mode bits): the
#: kernel's recipes, and "hqq_ort" (ORT's port of HQQ: the hqq id without
#: QC_GRP_HQQ_OWN, which "hqq", HQQ's own rule, sets)
_RECIPES = {**{name: (rid, 0) for name, rid in K.GROUP_RECIPES.items()},
            "hqq": (K.GROUP_RECIPES["hqq"], GRP_HQQ_OWN), "hqq_ort": (K.GROUP_RECIPES["hqq"], 0)}
#: the group recipes
GROUP_RECIPES = tuple(_RECIPES)
#: those with a float zero point
_FLOAT_ZP = ("tinygemm", "hqq", "hqq_ort")


# ------------------------------------------------------ group quantization
def _group_bits(bits, func):
    b = A.as_int(bits, "bits", func)
    if not 2 <= b <= 8:
        raise ValueError(f"{func}: bits must be in 2..8, got {b}")
    return b


def group_qrange(bits, recipe="onnx", symmetric=False, quant_min=None, quant_max=None):
    """(qmin, qmax) of a group recipe's codes (spec §6.2): [0, 2**bits - 1]
    for onnx (symmetric too: zero point 2**(bits-1)), tinygemm, hqq, gptq and
    asymmetric awq / torchao; [-2**(bits-1), 2**(bits-1) - 1] for symmetric
    awq / torchao.  torchao takes ``quant_min`` / ``quant_max`` as well."""
    func = "group_quantize"
    if recipe not in GROUP_RECIPES:
        raise ValueError(f"{func}: recipe must be one of {list(GROUP_RECIPES)}, got {recipe!r}")
    b = _group_bits(bits, func)
    if symmetric and recipe in _FLOAT_ZP:
        raise ValueError(f"{func}: the {recipe} recipe is asymmetric only (symmetric=False)")
    signed = symmetric and recipe in ("awq", "torchao", "onnx_numpy")
    qmin, qmax = (-(1 << (b - 1)), (1 << (b - 1)) - 1) if signed else (0, (1 << b) - 1)
    if quant_min is not None or quant_max is not None:
        if recipe != "torchao":
            raise ValueError(f"{func}: quant_min / quant_max are torchao options")
        qmin = qmin if quant_min is None else A.as_int(quant_min, "quant_min", func)
        qmax = qmax if quant_max is None else A.as_int(quant_max, "quant_max", func)
        if not -128 <= qmin < qmax <= 255 or (qmin < 0 and qmax > 127):
            raise ValueError(f"{func}: [quant_min, quant_max] = [{qmin}, {qmax}] must fit int8 "
                             "or uint8")
    return qmin, qmax


def _group_args(w, bits, group_size, axis, symmetric, recipe, quant_min, quant_max, func):
    arr, ax, g = _blocked_input(w, axis, group_size, func, "w", "group_size")
    qmin, qmax = group_qrange(bits, recipe, symmetric, quant_min, quant_max)
    if recipe not in ("onnx", "onnx_numpy") and arr.shape[ax] % g:
        raise ValueError(f"{func}: w.shape[axis] = {arr.shape[ax]} is not a multiple of "
                         f"group_size {g} (only recipe='onnx' allows a shorter last group)")
    mode = (GRP_SYMMETRIC if symmetric else 0) | _RECIPES[recipe][1] | \
        (GRP_F16_SCALE if recipe == "onnx" and arr.dtype == np.float16 else 0)
    return arr, ax, g, qmin, qmax, mode


def _group_run(arr, ax, g, recipe, qmin, qmax, mode, want_codes, want_y, want_mask, func):
    """The group driver over arr with groups of g along ax: (codes, y, mask,
    scale, zp) in arr's layout (None for what was not asked)."""
    xp = A.array_module(arr)
    moved = xp.ascontiguousarray(_to_last(arr, ax)).astype(F32, copy=False)
    rows, k = math.prod(moved.shape[:-1]), moved.shape[-1]
    ng = -(-k // g)
    flat = moved.reshape(-1)
    codes = xp.empty(moved.shape, np.uint8) if want_codes else None
    y = xp.empty(moved.shape, F32) if want_y else None
    mask = xp.empty(moved.shape, np.uint8) if want_mask else None
    scale = xp.empty(moved.shape[:-1] + (ng,), F32)
    zp = xp.empty(moved.shape[:-1] + (ng,), F32)
    if flat.size:  # (an empty w: empty codes and no group)
        A.kernels_for(flat, func).group_quant(
            _RECIPES[recipe][0], flat, None if codes is None else codes.reshape(-1),
            None if y is None else y.reshape(-1), None if mask is None else mask.reshape(-1),
            scale.reshape(-1), zp.reshape(-1), rows, k, g, float(qmin), float(qmax), mode,
            _nthreads(flat))

    def back(a):
        return None if a is None else xp.ascontiguousarray(_from_last(a, ax))
    return back(codes), back(y), back(mask), back(scale), back(zp)


@A.interop
def group_quantize(w, bits=4, group_size=128, *, axis=-1, symmetric=False, recipe="onnx",
                   quant_min=None, quant_max=None):
    """Integer group quantization of a weight: one scale and zero point per
    ``group_size`` consecutive elements along ``axis`` (the input dimension
    K of ``W[N, K]``), by a reference's exact float32 arithmetic (spec §6.2):

    - ``"onnx"`` (default, ORT MatMulNBits / MLAS): zero in the range,
      ``s = (mx0 - mn0) / qmax``, ``zp = RNA(-mn0 / s)``,
      ``q = RNA(x * f32(1 / s) + zp)``; symmetric: ``s = -m / 2**(bits-1)``
      with m the signed value of largest magnitude (negative scales), zero
      point ``2**(bits-1)``.  A shorter last group is allowed.  float16
      weights (ORT's ``quantize_matmul_4bits`` on float16): the zero point
      from the float32 scale, then the scale rounded to float16 (returned
      as float32 values) and ``q = RNA(x * f32(1 / s16) + zp)``.
    - ``"onnx_numpy"``: ORT's numpy weight quantizer (used for Gather):
      the same scales, ``q = rint(x / s) + zp``; symmetric codes signed.
    - ``"torchao"``: ``choose_qparams_affine`` / ``quantize_affine``
      (symmetric divides the range by ``(qmax - qmin) / 2``; eps 2**-126),
      with ``quant_min`` / ``quant_max`` options.
    - ``"tinygemm"``: float zero point ``mn + 8 s``, ``q = rint((x - min) / s)``.
    - ``"hqq"``: HQQ's own initialisation (mobiusml/hqq ``Quantizer.quantize``,
      ``optimize=False``, ``round_zero=False``): ``si = clamp(f32(1 / (mx -
      mn)) * qmax, max=2e4)`` (torch's ``qmax / d``; a constant group: -> 2e4,
      scale ``1/2e4``, zero point ``-mn * 2e4``, e.g. -5000 for 0.25), float
      zero point ``z = -mn * si`` (not rounded), ``q = rint(x * si + z)``,
      scale ``f32(1 / si)``; HQQ's meta before HQQLinear casts it to its
      compute dtype.
    - ``"hqq_ort"``: ORT's port (``HQQWeightOnlyQuantizer``, no
      optimisation): a constant group's range becomes qmax (scale 1),
      ``si = min(f32(1 / d) * qmax, 2e4)``, ``z = rint(-mn * si)``.
    - ``"awq"``: llm-awq ``pseudo_quantize_tensor`` (symmetric =
      ``zero_point=False``).
    - ``"gptq"``: GPTQ ``Quantizer.find_params`` + ``quantize`` (no error
      feedback).

    Computed in float32 (float16 / bfloat16 weights are exact in it; float64
    is rounded to float32 first).  Non-finite weights give a NaN / Inf scale
    for their group (a NaN group: integer zero point 0); NaN elements get
    the code qmin.

    Returns
    -------
    (q, scale, zero_point) : q has w's shape: uint8 codes for the unsigned
    ranges, int8 for the signed ones (symmetric awq / torchao / onnx_numpy);
    scale (float32) and zero_point have w's shape with ``axis`` replaced by
    ``ceil(K / group_size)``; zero_point is float32 for tinygemm and hqq,
    else q's dtype.
    """
    func = "group_quantize"
    arr, ax, g, qmin, qmax, mode = _group_args(w, bits, group_size, axis, symmetric, recipe,
                                               quant_min, quant_max, func)
    codes, _, _, scale, zp = _group_run(arr, ax, g, recipe, qmin, qmax, mode, True, False,
                                        False, func)
    code_dtype = np.int8 if qmin < 0 else np.uint8
    if recipe not in _FLOAT_ZP:  # (a group holding NaN has zero point 0)
        xp = A.array_module(zp)
        zp = xp.where(xp.isnan(zp), 0, zp).astype(code_dtype)
    return codes.view(code_dtype), scale, zp


@A.interop
def group_fake_quant(w, bits=4, group_size=128, *, axis=-1, symmetric=False, recipe="onnx",
                     quant_min=None, quant_max=None, return_mask=False):
    """``group_dequantize(*group_quantize(w, ...))`` in one pass, float32,
    with the reference's own dequantisation (AWQ / GPTQ keep the sign of a
    zero ``q``).  ``mask``: the rounded value lies in [qmin, qmax] (the
    straight-through estimator's mask).  Returns y (and the mask)."""
    func = "group_fake_quant"
    arr, ax, g, qmin, qmax, mode = _group_args(w, bits, group_size, axis, symmetric, recipe,
                                               quant_min, quant_max, func)
    _, y, mask, _, _ = _group_run(arr, ax, g, recipe, qmin, qmax, mode, False, True,
                                  return_mask, func)
    return (y, mask.view(np.bool_)) if return_mask else y


@A.interop
def group_dequantize(q, scale, zero_point, group_size, *, axis=-1, recipe="onnx", bits=4):
    """Dequantize group codes (float32)::

        y = (f32(q) - zero_point) * scale                 (every recipe but tinygemm)
        y = (f32(q) - 2**(bits-1)) * scale + zero_point    (tinygemm: float zero point)

    ``scale`` / ``zero_point`` as :func:`group_quantize` returns them."""
    func = "group_dequantize"
    xp, arr = _as_codes(q, "q", func)
    if arr.dtype.itemsize != 1:
        raise TypeError(f"{func}: q must be int8 / uint8 codes, got {arr.dtype}")
    if recipe not in GROUP_RECIPES:
        raise ValueError(f"{func}: recipe must be one of {list(GROUP_RECIPES)}, got {recipe!r}")
    ax = A.normalize_axis(axis, arr.ndim, func)
    g = A.as_int(group_size, "group_size", func)
    if g < 1:
        raise ValueError(f"{func}: group_size must be >= 1, got {g}")
    want = list(arr.shape)
    want[ax] = -(-arr.shape[ax] // g)
    s = xp.asarray(scale, dtype=F32)
    z = xp.asarray(zero_point, dtype=F32)
    if list(s.shape) != want or list(z.shape) != want:
        raise ValueError(f"{func}: scale and zero_point must have shape {tuple(want)}, got "
                         f"{s.shape} and {z.shape}")
    mode = 8 | (INT_SIGNED if arr.dtype.kind == "i" else 0)
    s = _to_last(s, ax).reshape(-1)
    z = _to_last(z, ax).reshape(-1)
    if recipe == "tinygemm":
        b = _group_bits(bits, func)
        params, mode = (s, xp.full(s.shape, 1 << (b - 1), F32), z), mode | INT_ADD_FLOAT
    else:
        params = (s, z, xp.zeros(s.shape, F32))

    def run(moved, rows, k):
        y = xp.empty(moved.shape, dtype=F32)
        flat = moved.reshape(-1)
        A.kernels_for(flat, func).decode_groups(_DEC["int"], flat, y.reshape(-1), rows, k, g,
                                                _param(params, F32, xp), 0.0, 0.0, mode,
                                                _nthreads(flat))
        return y
    return _blocked_call(arr, ax, run)


# ---------------------------------------------------------------- packing
_ORDERS = ("low_first", "high_first")


@A.interop
def pack_int4(q, *, order="low_first"):
    """Pack 4-bit values two per byte along the last axis.

    ``order="low_first"`` (ONNX INT4 / UINT4 raw data, ORT MatMulNBits):
    element 2i in the low nibble, 2i+1 in the high nibble; an odd last axis
    is padded with a zero nibble.  ``"high_first"``: tinygemm's CUDA order.
    Signed values are stored as two's-complement nibbles.  A 1-D array
    gives ONNX's raw data: ``pack_int4(q.reshape(-1))``.

    Returns uint8 of shape ``q.shape[:-1] + (ceil(q.shape[-1] / 2),)``.
    """
    func = "pack_int4"
    xp, arr = _as_codes(q, "q", func)
    if order not in _ORDERS:
        raise ValueError(f"{func}: order must be one of {list(_ORDERS)}, got {order!r}")
    if arr.ndim == 0:
        raise ValueError(f"{func}: q must have at least one dimension")
    v = arr.astype(np.int16)
    if bool(((v < -8) | (v > 15)).any()):
        raise ValueError(f"{func}: values must fit 4 bits (int4 -8..7 or uint4 0..15)")
    nib = (v & 0xF).astype(np.uint8)
    if nib.shape[-1] % 2:
        nib = xp.concatenate([nib, xp.zeros(nib.shape[:-1] + (1,), np.uint8)], axis=-1)
    first, second = nib[..., 0::2], nib[..., 1::2]
    if order == "high_first":
        first, second = second, first
    return xp.ascontiguousarray(first | (second << 4))


@A.interop
def unpack_int4(packed, n, *, signed=False, order="low_first"):
    """The inverse of :func:`pack_int4`: ``n`` values along the last axis,
    int8 (``signed``: two's-complement nibbles) or uint8."""
    func = "unpack_int4"
    xp, arr = _as_codes(packed, "packed", func)
    if order not in _ORDERS:
        raise ValueError(f"{func}: order must be one of {list(_ORDERS)}, got {order!r}")
    if arr.dtype.itemsize != 1:
        raise TypeError(f"{func}: packed must be uint8 / int8 bytes, got {arr.dtype}")
    if arr.ndim == 0:
        raise ValueError(f"{func}: packed must have at least one dimension")
    n = A.as_int(n, "n", func)
    if not 0 <= n <= 2 * arr.shape[-1]:
        raise ValueError(f"{func}: n = {n} does not fit {arr.shape[-1]} bytes")
    b = arr.view(np.uint8)
    lo, hi = b & 0xF, b >> 4
    if order == "high_first":
        lo, hi = hi, lo
    out = xp.stack([lo, hi], axis=-1).reshape(b.shape[:-1] + (2 * b.shape[-1],))[..., :n]
    if signed:
        return xp.ascontiguousarray(((out.astype(np.int16) ^ 8) - 8).astype(np.int8))
    return xp.ascontiguousarray(out)
