"""Block-scaled formats: OCP Microscaling (MXFP8 / MXFP6 / MXFP4 / MXINT8)
and NVIDIA's NVFP4, on numpy (CPU) and cupy (GPU).

Exact semantics: the project's formats specification, §4 (MX) and §5 (NVFP4).  Every
per-block and per-element rule is one recipe of ``include/qc_mx.h``
(``QcBlockMx``, ``QcBlockNvfp4``) run by the CPU extension and the CUDA
kernel alike (``block_scaled_quant``); this module validates arguments,
computes the per-tensor scale of NVFP4 and lays the data out.  The codes are
dequantised by the decode families of :mod:`quantcore.formats`.

Computed in float32 (float16 / bfloat16 input is exact in it; float64 is
rounded to float32 first); fake-quant results are float32.
"""
import math
import sys

import numpy as np

from .. import _arrays as A
from .._cpu import _kernels as K
from .._cpu.threads import effective_n_threads
from ._common import (_DEC, F8_DEQ_MUL, FMT_COUNT, _as_codes, _blocked_input, _from_last, _param,
                      _to_last, formats_for)
from .fp8 import fp8_decode
from .groups import pack_int4

__all__ = ["MX_ELEMENTS", "MX_SCALE_MODES", "mx_quantize", "mx_dequantize", "mx_fake_quant",
           "nvfp4_quantize", "nvfp4_dequantize", "nvfp4_fake_quant"]

F32 = np.float32

# Ids and mode bits mirrored from qc_mx.h (tests/test_mx.py checks them
# against the header).
#: the MX element id of int8: the first id after the minifloats' (QC_MX_INT8)
MX_INT8 = FMT_COUNT
#: MX element types -> element id: the minifloat formats of the "mx" role in
#: formats._common.MINIFLOATS (named without their "fn" suffix), then int8
MX_ELEMENTS = {**{name.removesuffix("fn"): fid for name, fid in formats_for("mx").items()},
               "int8": MX_INT8}
_ALIASES = {"fp8_e4m3": "e4m3", "e4m3fn": "e4m3", "float8_e4m3fn": "e4m3",
            "fp8_e5m2": "e5m2", "float8_e5m2": "e5m2",
            "fp6_e2m3": "e2m3", "e2m3fn": "e2m3", "float6_e2m3fn": "e2m3",
            "fp6_e3m2": "e3m2", "e3m2fn": "e3m2", "float6_e3m2fn": "e3m2",
            "fp4_e2m1": "e2m1", "e2m1fn": "e2m1", "float4_e2m1fn": "e2m1"}
#: E8M0 scale rules (spec §4.2) -> QC_MX_* id
MX_SCALE_MODES = {"floor": 0, "ceil": 1, "even": 2, "rceil": 3, "rceil_exact": 4,
                  "floor_log2": 5}
MX_HALF_AWAY, MX_TORCHAO, MX_MXS, MX_INT8_FULL = 8, 16, 32, 64
NV_TORCHAO, NV_NO_GLOBAL = 1, 2
_ROUNDINGS = ("rne", "half_away")
_COMPATS = (None, "torchao", "microxcaling")
_NVFP4_RECIPES = ("modelopt", "torchao")
NVFP4_BLOCK = 16
E2M1_ID = MX_ELEMENTS["e2m1"]


def _elem_name(elem, func):
    name = _ALIASES.get(elem, elem) if isinstance(elem, str) else elem
    if not isinstance(name, str) or name not in MX_ELEMENTS:
        raise ValueError(f"{func}: elem must be one of {sorted(MX_ELEMENTS)} (or an alias such as "
                         f"'fp4_e2m1' / 'float8_e4m3fn'), got {elem!r}")
    return name


def _mx_mode(name, scale_mode, elem_rounding, compat, int8_min, func):
    """The QC_MX_* mode word; scale_mode / elem_rounding default to what
    ``compat`` reproduces (microxcaling: floor_log2, half_away; else floor,
    rne)."""
    if compat not in _COMPATS:
        raise ValueError(f"{func}: compat must be one of {list(_COMPATS)}, got {compat!r}")
    mxs = compat == "microxcaling"
    scale_mode = ("floor_log2" if mxs else "floor") if scale_mode is None else scale_mode
    elem_rounding = ("half_away" if mxs else "rne") if elem_rounding is None else elem_rounding
    if scale_mode not in MX_SCALE_MODES:
        raise ValueError(f"{func}: scale_mode must be one of {list(MX_SCALE_MODES)}, got "
                         f"{scale_mode!r}")
    if elem_rounding not in _ROUNDINGS:
        raise ValueError(f"{func}: elem_rounding must be one of {list(_ROUNDINGS)}, got "
                         f"{elem_rounding!r}")
    if compat == "torchao":
        if name == "int8":
            raise ValueError(f"{func}: compat='torchao' has no int8 elements (torchao's MX "
                             "types are e4m3, e5m2, e2m3, e3m2, e2m1)")
        if scale_mode not in ("floor", "ceil", "even", "rceil"):
            raise ValueError(f"{func}: compat='torchao' takes scale_mode floor, ceil, even or "
                             f"rceil, got {scale_mode!r}")
    if mxs and scale_mode != "floor_log2":
        raise ValueError(f"{func}: compat='microxcaling' computes its scale as "
                         f"scale_mode='floor_log2', got {scale_mode!r}")
    if int8_min not in (-127, -128):
        raise ValueError(f"{func}: int8_min must be -127 or -128, got {int8_min!r}")
    if int8_min == -128 and name != "int8":
        raise ValueError(f"{func}: int8_min applies to elem='int8' only")
    return (MX_SCALE_MODES[scale_mode] | (MX_HALF_AWAY if elem_rounding == "half_away" else 0)
            | (MX_TORCHAO if compat == "torchao" else 0) | (MX_MXS if mxs else 0)
            | (MX_INT8_FULL if int8_min == -128 else 0))


def _block_run(arr, ax, bs, recipe, elem, mode, p0, p1, want_codes, want_y, func, out=None):
    """The block driver over arr with blocks of bs along ax (the last block
    of a row may be shorter: the same as zero padding, which changes no
    amax): (scale codes, element codes, y) with the block axis moved last
    (None for what was not asked).  y is written into ``out`` (checked:
    float32 of arr's shape) when ax is the last axis and out is
    C-contiguous (out may be x itself: each block is read before it is
    written); :func:`_result` copies it there otherwise."""
    xp = A.array_module(arr)
    if out is not None:
        A.check_out(out, arr.shape, np.dtype(F32), func, xp=xp)
    moved = xp.ascontiguousarray(_to_last(arr, ax)).astype(F32, copy=False)
    rows, k = math.prod(moved.shape[:-1]), moved.shape[-1]
    nb = -(-k // bs)
    scodes = xp.empty(moved.shape[:-1] + (nb,), np.uint8)
    codes = xp.empty(moved.shape, np.uint8) if want_codes else None
    direct = out is not None and ax == arr.ndim - 1 and out.flags.c_contiguous and \
        A.can_write_into(out, moved)  # (out overlapping x otherwise: through a temporary)
    y = (out if direct else xp.empty(moved.shape, F32)) if want_y else None
    flat = moved.reshape(-1)
    if flat.size:
        A.kernels_for(flat, func).block_scaled_quant(
            K.BLOCK_RECIPES[recipe], flat, scodes.reshape(-1),
            None if codes is None else codes.reshape(-1), None if y is None else y.reshape(-1),
            rows, k, bs, elem, mode, *((0.0, 0.0) if isinstance(p0, _DeviceScale) else
                                       (float(p0), float(p1))),
            effective_n_threads(flat.shape[0]),
            **({"scale_from": p0} if isinstance(p0, _DeviceScale) else {}))
    return scodes, codes, y


def _result(y, ax, out):
    """The fake-quant result in x's layout, in ``out`` when given."""
    res = _back(y, ax)
    if out is not None and res is not out:
        out[...] = res
        return out
    return res


def _pack_fp4(codes):
    """FP4 codes (uint8 < 16, the block axis last) two per byte, element 2i
    in the low nibble (:func:`pack_int4`'s order; without its checks, the
    codes being the kernel's)."""
    if codes.shape[-1] % 2 or sys.byteorder != "little":
        return pack_int4(codes)
    pair = codes.view(np.uint16)  # (element 2i in the low byte: little-endian)
    return ((pair & 0x0F) | ((pair >> 4) & 0xF0)).astype(np.uint8)


def _unpack_fp4(packed, n):
    """The inverse of :func:`_pack_fp4`: n codes along the last axis."""
    xp = A.array_module(packed)
    b = packed.view(np.uint8)
    out = xp.empty(b.shape[:-1] + (2 * b.shape[-1],), np.uint8)
    out[..., 0::2] = b & 15
    out[..., 1::2] = b >> 4
    return out if n == out.shape[-1] else xp.ascontiguousarray(out[..., :n])


def _back(a, ax):
    return None if a is None else A.array_module(a).ascontiguousarray(_from_last(a, ax))


# --------------------------------------------------------------------- MX
@A.interop
def mx_quantize(x, elem, *, axis=-1, block_size=32, scale_mode=None, elem_rounding=None,
                compat=None, int8_min=-127):
    """OCP microscaling (MX) quantization (spec §4): blocks of ``block_size``
    consecutive elements along ``axis`` share one E8M0 scale ``2**(c - 127)``.

    Per block (amax = max |x|, NaN when the block holds a NaN; E(a) the
    float32 exponent field of a minus 127, emax the element's largest power
    of two: e4m3 8, e5m2 15, e2m3 2, e3m2 4, e2m1 2, int8 0)::

        floor        e = E(amax) - emax                  (OCP, torchao default)
        ceil         e = E(amax) + (mantissa != 0) - emax
        even         e = E(amax rounded half up to the element's mantissa) - emax
                     (int8: 6 fraction bits)
        rceil        e = ceil(f32 log2(amax / max_elem))    (torchao RCEIL, eager)
        rceil_exact  e = exact ceil(log2(amax / max_elem))  (NVIDIA cvt.rp.ue8m0)
        floor_log2   e = floor(f32 log2(amax or 2**-126)) - emax   (microxcaling)
        c = clamp(e, -127, 128 (rceil: 127)) + 127;  NaN amax -> 255; rceil:
            Inf -> 254; floor_log2: Inf -> 255

    (``f32 log2`` is torch's float32 log2, reproduced exactly by the
    per-binade tables of §4.2.)  Elements::

        v = x / 2**(c - 127)                           (exact)
        q = element(v)   RNE (elem_rounding="rne") or ties away from zero,
                         saturating at +-max (+-Inf too); int8: clamp(round(v * 64),
                         int8_min, 127)

    ``compat="torchao"`` reproduces torchao's ``to_mx`` quirks: floor / ceil /
    even divide by ``max(2**(c - 127), 2**-126)`` (a code-0 block comes back
    halved), rceil leaves a code-0 block unscaled, NaN elements get torchao's
    codes (0x7F, e2m3 12, e3m2 14, e2m1 3) and a NaN block's other elements
    are 0 (floor / ceil / even) or NaN codes (rceil); in floor / ceil / even
    a -NaN and +-Inf in a NaN block get the NaN code with the sign bit set
    (0xFF, 0x2C, 0x2E, 0xB: torchao on the CPU multiplies them by 0, and
    x86's NaN of Inf * 0 has its sign bit set).
    ``compat="microxcaling"`` (defaults: ``scale_mode="floor_log2"``,
    ``elem_rounding="half_away"``) reproduces microxcaling's ``_quantize_mx``:
    a block holding +-Inf is NaN, ``+-0`` elements give +0.  Without compat a
    NaN block's elements get the NaN code (FP8 0x7F; FP6 / FP4 / int8 0).

    The last block along ``axis`` may be shorter (as zero padding).

    Parameters
    ----------
    x : array_like of float16 / float32 / float64 / bfloat16 (numpy or cupy)
    elem : {"e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "int8"}
    axis : int, the block axis
    block_size : int (32 in the OCP spec)
    scale_mode : {"floor", "ceil", "even", "rceil", "rceil_exact", "floor_log2"}
    elem_rounding : {"rne", "half_away"}
    compat : {None, "torchao", "microxcaling"}
    int8_min : {-127, -128} (int8 elements: the spec's symmetric range, or the
        full two's complement one)

    Returns
    -------
    (scales, codes) : scales: uint8 E8M0 codes, x's shape with ``axis``
    replaced by ``ceil(n / block_size)``.  codes: FP8 codes (uint8) and int8
    values (int8) of x's shape; FP6 one code per byte (low 6 bits); FP4
    packed two per byte along ``axis`` (element 2i in the low nibble), that
    axis ``ceil(n / 2)`` long.
    """
    func = "mx_quantize"
    arr, ax, bs = _blocked_input(x, axis, block_size, func)
    name = _elem_name(elem, func)
    mode = _mx_mode(name, scale_mode, elem_rounding, compat, int8_min, func)
    scodes, codes, _ = _block_run(arr, ax, bs, "mx", MX_ELEMENTS[name], mode, 0.0, 0.0, True,
                                  False, func)
    if name == "e2m1":
        codes = _pack_fp4(codes)
    elif name == "int8":
        codes = codes.view(np.int8)
    return _back(scodes, ax), _back(codes, ax)


@A.interop
def mx_fake_quant(x, elem, *, axis=-1, block_size=32, scale_mode=None, elem_rounding=None,
                  compat=None, int8_min=-127, out=None):
    """``mx_dequantize(*mx_quantize(x, ...))`` in one pass (float32, x's
    shape): ``y = q * 2**(c - 127)`` (NaN for a NaN block).  Arguments as
    :func:`mx_quantize`; ``out``: a float32 array of x's shape to write y
    into (may be x itself)."""
    func = "mx_fake_quant"
    arr, ax, bs = _blocked_input(x, axis, block_size, func)
    name = _elem_name(elem, func)
    mode = _mx_mode(name, scale_mode, elem_rounding, compat, int8_min, func)
    _, _, y = _block_run(arr, ax, bs, "mx", MX_ELEMENTS[name], mode, 0.0, 0.0, False, True,
                         func, out)
    return _result(y, ax, out)


def _e8m0_values(scodes, xp):
    """float32 2**(c - 127) of E8M0 codes (code 0: 2**-127; 255: NaN)."""
    c = scodes.astype(np.uint32)
    v = xp.where(c == 0, np.uint32(0x00400000), c << 23)
    v = xp.where(c == 255, np.uint32(0x7FC00000), v)
    return v.astype(np.uint32).view(F32)


def _decode_blocks(xp, codes_moved, factors, fmt_mode, family, rows, k, bs, func):
    """y = decode(code) * factor of its block (decode_groups)."""
    y = xp.empty(codes_moved.shape, dtype=F32)
    flat = codes_moved.reshape(-1)
    if flat.size:
        params = (factors,) if family == "fp8" else (factors, xp.zeros_like(factors),
                                                       xp.zeros_like(factors))
        A.kernels_for(flat, func).decode_groups(_DEC[family], flat, y.reshape(-1), rows, k, bs,
                                                _param(params, F32, xp), 0.0, 0.0, fmt_mode,
                                                effective_n_threads(flat.shape[0]))
    return y


def _unpacked_codes(arr, ax, packed4, length, func):
    """The codes with ``ax`` moved last, FP4 unpacked to ``length`` (default
    twice the packed length)."""
    xp = A.array_module(arr)
    moved = xp.ascontiguousarray(_to_last(arr, ax))
    if packed4:
        n = 2 * moved.shape[-1] if length is None else A.as_int(length, "length", func)
        if not 2 * moved.shape[-1] - 1 <= n <= 2 * moved.shape[-1]:
            raise ValueError(f"{func}: length {n} does not fit {moved.shape[-1]} packed bytes")
        moved = _unpack_fp4(moved, n)
    elif length is not None and A.as_int(length, "length", func) != moved.shape[-1]:
        raise ValueError(f"{func}: length {length} differs from codes.shape[axis] = "
                         f"{moved.shape[-1]}")
    return xp, moved


def _check_scales(scodes, moved_shape, bs, ax, what, func):
    xp, s = _as_codes(scodes, what, func)
    if s.dtype.itemsize != 1:
        raise TypeError(f"{func}: {what} must be uint8 codes, got {s.dtype}")
    s = xp.ascontiguousarray(_to_last(s, ax)) if s.ndim == len(moved_shape) else s
    want = tuple(moved_shape[:-1]) + (-(-moved_shape[-1] // bs),)
    if tuple(s.shape) != want:
        raise ValueError(f"{func}: {what} must have {want[-1]} blocks of {bs} along the block axis "
                         f"(shape {want} with the axis last), got {tuple(s.shape)}")
    return s.view(np.uint8).reshape(-1)


@A.interop
def mx_dequantize(scales, codes, elem, *, axis=-1, block_size=32, length=None):
    """Dequantize MX codes (float32)::

        y = f32(value(q) * 2**(c - 127))      (c = 255: NaN)

    ``scales`` / ``codes`` as :func:`mx_quantize` returns them; ``length``:
    the element count along ``axis`` of FP4 codes when it is odd (default:
    twice the packed length)."""
    func = "mx_dequantize"
    name = _elem_name(elem, func)
    bs = A.as_int(block_size, "block_size", func)
    if bs < 1:
        raise ValueError(f"{func}: block_size must be >= 1, got {bs}")
    _, arr = _as_codes(codes, "codes", func)
    if arr.ndim == 0:
        raise ValueError(f"{func}: codes must have at least one dimension")
    if arr.dtype.itemsize != 1:
        raise TypeError(f"{func}: codes must be one byte each, got {arr.dtype}")
    ax = A.normalize_axis(axis, arr.ndim, func)
    xp, moved = _unpacked_codes(arr, ax, name == "e2m1", length, func)
    s = _check_scales(scales, moved.shape, bs, ax, "scales", func)
    f = _e8m0_values(s, xp)
    rows, k = math.prod(moved.shape[:-1]), moved.shape[-1]
    if name == "int8":  # q * 2**(c - 133): exactly f32(f32(q / 64) * 2**(c - 127))
        f = A.channel_arith("multiply", f, F32(1 / 64)).astype(F32, copy=False)
        y = _decode_blocks(xp, moved.view(np.uint8), f, 8 | 32, "int", rows, k, bs, func)
    else:
        y = _decode_blocks(xp, moved.view(np.uint8), f, MX_ELEMENTS[name] | F8_DEQ_MUL, "fp8",
                           rows, k, bs, func)
    return _back(y, ax)


# ------------------------------------------------------------------ NVFP4
class _DeviceScale(tuple):
    """(range, div, mul, gout): NVFP4 modelopt's default global scale
    formed by the block kernel from x's range on the device
    (``block_scaled_quant``'s ``scale_from``)."""

    def __new__(cls, *items):
        return super().__new__(cls, items)


def _nvfp4_scales(arr, global_scale, recipe, func):
    """(mode, p0, p1, g): the recipe's mode word and parameters, and the
    per-tensor scale g (None for torchao without one).  modelopt's default
    g = f32(amax(|x|) / 2688)."""
    if recipe not in _NVFP4_RECIPES:
        raise ValueError(f"{func}: recipe must be one of {list(_NVFP4_RECIPES)}, got {recipe!r}")
    given = global_scale is not None
    if global_scale is None and recipe == "modelopt" and arr.size and \
            A.is_cupy_array(arr) and arr.dtype != np.float64:
        # on the device: the range and the scale stay there (no synchronisation)
        xp = A.array_module(arr)
        rng, gout = xp.empty(2, F32), xp.empty(1, F32)
        A.gpu_kernels(func).minmax_device(A.Layout(arr, np.dtype(F32)).flat, 1, 1, arr.size,
                                          rng[0:1], rng[1:2], finish=1)
        return 0, _DeviceScale(rng, 2688.0, 6.0, gout), 0.0, gout.reshape(())
    if global_scale is None and recipe == "modelopt":
        from ..ops import minmax
        lo, hi = (np.asarray(A.to_host(v), F32) for v in minmax(arr, None))
        amax = F32(np.nan) if np.isnan(lo) or np.isnan(hi) else max(abs(lo), abs(hi))
        global_scale = F32(amax) / F32(2688)
    if global_scale is None:
        return NV_TORCHAO | NV_NO_GLOBAL, 1.0, 1.0, None
    g = np.asarray(A.to_host(global_scale), dtype=F32)
    if g.size != 1:
        raise ValueError(f"{func}: global_scale must be one value, got shape {g.shape}")
    g = F32(g.reshape(()))
    if given and not (np.isfinite(g) and g > 0):  # (the default g of a zero x is 0)
        raise ValueError(f"{func}: global_scale must be finite and > 0, got {g}")
    if recipe == "modelopt":
        return 0, F32(F32(6) * g), g, g
    with np.errstate(divide="ignore"):
        return NV_TORCHAO, g, F32(F32(1) / g), g


@A.interop
def nvfp4_quantize(x, global_scale=None, *, recipe="modelopt"):
    """NVFP4 quantization (spec §5): e2m1 elements, blocks of 16 along the
    last axis with an e4m3 scale, one float32 per-tensor scale g.

    ``"modelopt"`` (default; NVFP4QTensor.quantize, the checkpoint
    exporter)::

        g  = f32(amax(|x|) / 2688)  unless given
        bs = f32(bamax / f32(6 g)); 0 -> 1
        s8 = e4m3(clamp(bs, 2**-9, 448))           (RNE)
        q  = e2m1(f32(x / f32(s8 g)))              (RNE, saturating; sign from
                                                    v < 0: -0 -> +0, NaN -> +6)

    ``"torchao"`` (NVFP4Tensor.to_nvfp4; g optional, the caller's)::

        b  = f32(bamax / 6)
        s8 = e4m3(clamp(f32(b / g), 2**-6, 448)); r = f32(f32(1 / g) / s8)
             (without g: s8 = e4m3(clamp(b, 2**-6, 448)), r = f32(1 / s8))
        q  = e2m1(clamp(f32(x r), -6, 6))          (RNE, sign kept; a NaN block: 0x4)

    The last block may be shorter (as zero padding).

    Returns
    -------
    (codes, block_scales, global_scale) : codes: uint8, e2m1 packed two per
    byte along the last axis (element 2i in the low nibble); block_scales:
    uint8 e4m3 codes, x's shape with the last axis ``ceil(n / 16)``;
    global_scale: float32 (None for torchao without one).
    """
    func = "nvfp4_quantize"
    arr, ax, bs = _blocked_input(x, -1, NVFP4_BLOCK, func)
    mode, p0, p1, g = _nvfp4_scales(arr, global_scale, recipe, func)
    scodes, codes, _ = _block_run(arr, ax, bs, "nvfp4", E2M1_ID, mode, p0, p1, True, False,
                                  func)
    return _pack_fp4(codes), scodes, g


@A.interop
def nvfp4_fake_quant(x, global_scale=None, *, recipe="modelopt", out=None):
    """``nvfp4_dequantize(*nvfp4_quantize(x, ...))`` in one pass (float32);
    ``out`` as in :func:`mx_fake_quant`."""
    func = "nvfp4_fake_quant"
    arr, ax, bs = _blocked_input(x, -1, NVFP4_BLOCK, func)
    mode, p0, p1, _ = _nvfp4_scales(arr, global_scale, recipe, func)
    y = _block_run(arr, ax, bs, "nvfp4", E2M1_ID, mode, p0, p1, False, True, func, out)[2]
    return _result(y, ax, out)


@A.interop
def nvfp4_dequantize(codes, block_scales, global_scale=None, *, recipe="modelopt", length=None):
    """Dequantize NVFP4 (float32)::

        y = f32(value(q) * f32(s8 * g))       (without g: value(q) * s8)

    modelopt's value of the code 0x8 is +0 (its table), torchao's -0.

    ``length``: the element count of the last axis when it is odd."""
    func = "nvfp4_dequantize"
    if recipe not in _NVFP4_RECIPES:
        raise ValueError(f"{func}: recipe must be one of {list(_NVFP4_RECIPES)}, got {recipe!r}")
    _, arr = _as_codes(codes, "codes", func)
    if arr.ndim == 0 or arr.dtype.itemsize != 1:
        raise TypeError(f"{func}: codes must be packed uint8 codes with at least one dimension, "
                        f"got {A.describe(codes)}")
    xp, moved = _unpacked_codes(arr, arr.ndim - 1, True, length, func)
    s = _check_scales(block_scales, moved.shape, NVFP4_BLOCK, arr.ndim - 1, "block_scales", func)
    if recipe == "modelopt":  # its table's 0x8 is +0: decoded as the code 0x0 (+0 * factor)
        moved = moved ^ ((moved == 8).view(np.uint8) << 3)
    f = fp8_decode(s, "e4m3fn")
    if global_scale is not None:
        g = np.asarray(A.to_host(global_scale), dtype=F32)
        if g.size != 1:
            raise ValueError(f"{func}: global_scale must be one value, got shape {g.shape}")
        f = A.channel_arith("multiply", f, F32(g.reshape(()))).astype(F32, copy=False)
    rows, k = math.prod(moved.shape[:-1]), moved.shape[-1]
    return _decode_blocks(xp, moved.view(np.uint8), f, E2M1_ID | F8_DEQ_MUL, "fp8", rows, k,
                          NVFP4_BLOCK, func)
