"""The compressed-tensors checkpoint layout (``quant_method:
"compressed-tensors"``), which llm-compressor writes and vLLM and
transformers load, and its producer's numerics, bit for bit
(compressed-tensors 0.20.0: ``quantization/utils/helpers.py``
``calculate_qparams``, ``quantization/lifecycle/forward.py``
``quantize`` / ``dequantize``, ``compressors/naive_quantized`` and
``compressors/pack_quantized``; docs/FORMATS.md, "compressed-tensors").

Schemes (llm-compressor's preset names, :data:`SCHEMES`):

- ``FP8_DYNAMIC`` (format ``float-quantized``): FP8 e4m3fn weights, one
  scale per output channel; activations quantized per token at run time
  (no tensor stored for them).  Per Linear ``X``: ``X.weight`` F8_E4M3
  ``[O, I]``, ``X.weight_scale`` ``[O, 1]`` in the weight's dtype.
- ``NVFP4A16`` (format ``nvfp4-pack-quantized``): FP4 e2m1 codes in
  groups of 16 along I with an FP8 e4m3fn scale each and one float32
  global scale per fused set (q/k/v, gate/up): ``X.weight_packed`` U8
  ``[O, I / 2]`` (element 2i in the low nibble), ``X.weight_scale``
  F8_E4M3 ``[O, I / 16]``, ``X.weight_global_scale`` F32 ``[1]``.
- ``W4A16`` / ``W8A16`` (format ``pack-quantized``): int4 / int8
  symmetric groups of ``group_size`` (128) along I: ``X.weight_packed``
  I32 ``[O, I * b / 32]`` (code + 2^(b-1) densely packed, low bits first:
  element n in bits b*n.. of the little-endian bit stream of the words;
  int4: eight nibbles per word, int8: four bytes), ``X.weight_scale``
  ``[O, I / g]`` in the weight's dtype, ``X.weight_shape`` I64 ``[2]``.
- ``W4A16_ASYM`` (``pack-quantized``): W4A16 with zero points:
  ``X.weight_zero_point`` I32 ``[O * 4 / 32, I / g]`` (the int8 zero
  points packed like the codes, but along O: ``pack_to_int32(zp,
  packed_dim=0)``).
- ``MXFP4A16`` (format ``mxfp4-pack-quantized``): FP4 e2m1 codes in
  groups of 32 along I with a power-of-two E8M0 scale each:
  ``X.weight_packed`` U8 ``[O, I / 2]`` (as NVFP4), ``X.weight_scale``
  U8 ``[O, I / 32]`` (the biased exponent, 2^(e - 127)).  ``MXFP4``: the
  same weights, and activations quantized to FP4 in groups of 32 at run
  time (configuration only: no tensor stored for them).

The arithmetic is torch's in the weight's dtype ``D`` (F32, F16 or BF16;
``r_D``: round to nearest even to ``D``; every torch F16 / BF16 operation
is the float32 operation rounded once to D, and a float32 result of two D
operands rounded to D is the correctly rounded D result)::

    amax = max(|min(x, 0)|, max(x, 0))           per row (FP8) or group (int)
    s    = r_D(amax / 448)  FP8_DYNAMIC          s = r_D(amax / (2^b - 1) * 2)  W4A16, W8A16
    s    = eps_D where s == 0                    (torch.finfo(D).eps)
    q    = e4m3fn(r_D(x / s))   (RNE, +-448)     q = clip(rint(r_D(x / s)), -2^(b-1), 2^(b-1) - 1)
    y    = r_D(decode(q) * s)                    y = r_D(q * s)

W4A16_ASYM (``lo = min(x, 0)``, ``hi = max(x, 0)`` per group; b = 4)::

    s  = r_D(r_D(hi - lo) / 15)
    zp = rint(clip(r_D(-8 - r_D(lo / s)), -8, 7))   (0 where s == 0: torch's NaN -> int8)
    s  = eps_D where s == 0
    q  = clip(rint(r_D(r_D(x / s) + zp)), -8, 7)
    y  = r_D(r_D(q - zp) * s)

MXFP4A16 (``p``: amax rounded to a power of two on D's bits, ``round_to_power_2``;
``e`` the biased exponent, ``generate_mx_scales``)::

    p = bits_D(amax) + 2^(mantissa_D - 2), mantissa bits cleared
    e = clip(127 + floor(log2 p) - 2, 0, 255)
    s = r_D(2^(e - 127)), 1 where 0 (then e = 127: F16's underflow)
    q = e2m1(r_D(x / s))
    y = r_BF16(q * s)                                (the decompressor's dtype)

NVFP4A16 (``a`` the absmax over the fused set, ``e4m3`` RNE with
clamp +-448, ``e2m1`` the thresholds of compressed-tensors'
``cast_to_fp4``: round half to even, the sign of a negative value kept
on a zero code)::

    g = f32(r_D(r_D(1 / max(a, tiny_D)) * 2688))   (1 where not finite)
    s = e4m3(f32(g * r_D(amax_group / 6)))          (0.125 where 0)
    q = e2m1(f32(x / f32(s / g)))
    y = r_BF16(q * f32(s / g))                       (the decompressor's dtype)

``y`` is what compressed-tensors' decompressors (and so transformers'
``from_pretrained``) give back for the stored tensors.
"""
import numpy as np

from .. import _arrays as A
from .. import formats as F
from .selection import FUSED, WEIGHT_DTYPES, fused_sets, module_of, select, \
    select_checked  # noqa: F401 (the selection rules, here by their old names)

__all__ = ["SCHEMES", "select", "select_checked", "plan", "quantize_tensor", "dequantize_module",
           "quantization_config", "LAYOUT_VERSION", "round_to"]

#: the compressed-tensors release whose layout and numerics this module
#: follows (written as quantization_config.version)
LAYOUT_VERSION = "0.20.0"
F32 = np.float32
#: torch.finfo(D).eps: the scale that replaces a zero scale
EPS = {"F32": F32(2.0 ** -23), "F16": F32(2.0 ** -10), "BF16": F32(2.0 ** -7)}
#: scheme -> (format, weight bits, weight type, strategy, activations quantized at run
#: time: None, "fp8_token" (FP8 per token) or "mxfp4" (FP4 groups of 32, E8M0 scales))
SCHEMES = {
    "FP8_DYNAMIC": ("float-quantized", 8, "float", "channel", "fp8_token"),
    "W4A16": ("pack-quantized", 4, "int", "group", None),
    "W8A16": ("pack-quantized", 8, "int", "group", None),
    "W4A16_ASYM": ("pack-quantized", 4, "int", "group", None),
    "NVFP4A16": ("nvfp4-pack-quantized", 4, "float", "tensor_group", None),
    "MXFP4A16": ("mxfp4-pack-quantized", 4, "float", "group", None),
    "MXFP4": ("mxfp4-pack-quantized", 4, "float", "group", "mxfp4"),
}
#: the schemes with zero points (compressed-tensors' ``symmetric: false``)
ASYMMETRIC = ("W4A16_ASYM",)
#: MXFP4's group (fixed by the MX format; compressed-tensors' preset)
MX_GROUP = 32
#: NVFP4's group (compressed-tensors' preset; vLLM's kernels take only it)
NVFP4_GROUP = 16
#: torch.finfo(D).tiny: the least amax of a global scale
TINY = {"F32": F32(2.0 ** -126), "F16": F32(2.0 ** -14), "BF16": F32(2.0 ** -126)}
DEFAULT_GROUP_SIZE = 128
def fmt_of(scheme):
    """A scheme's compressed-tensors format."""
    return SCHEMES[scheme][0]


def is_int_group(scheme):
    """Whether ``scheme`` is an integer group scheme (``pack-quantized``:
    its group size is a choice)."""
    return SCHEMES[scheme][2:4] == ("int", "group")


#: the group sizes vLLM's Marlin kernels take (utils/marlin_utils.py
#: MARLIN_SUPPORTED_GROUP_SIZES, but -1: one group per row)
GROUP_SIZES = (32, 64, 128)
#: every tensor suffix a quantized module may store
STORED = ("weight", "weight_scale", "weight_packed", "weight_shape", "weight_zero_point",
          "weight_global_scale")


# ------------------------------------------------------------------ numerics
def round_to(x, dt):
    """float32 ``x`` rounded to nearest even to the dtype ``dt`` ("F32",
    "F16", "BF16"), as float32 values (finite x; overflow gives +-inf)."""
    x = np.asarray(x, F32)
    if dt == "F32":
        return x
    if dt == "F16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(F32)
    return _round_bf16(x.copy())


def _round_bf16(x):
    """:func:`round_to` BF16 of a float32 array of the caller's own, in
    place (``x`` is returned): ``b + 0x7FFF + bit 16 of b``, the low 16
    bits cleared."""
    b = np.asarray(x).view(np.uint32)
    t = b >> np.uint32(16)
    t &= np.uint32(1)
    t += np.uint32(0x7FFF)
    b += t
    b &= np.uint32(0xFFFF0000)
    return x


def _round_own(x, dt):
    """:func:`round_to` of a float32 temporary the caller owns (BF16: in
    place, no copy)."""
    return _round_bf16(x) if dt == "BF16" and x.dtype == F32 and x.ndim else round_to(x, dt)


def as_dtype_bytes(x, dt):
    """float32 values exact in ``dt`` as the array safetensors stores for it."""
    x = np.ascontiguousarray(x, F32)
    if dt == "F32":
        return x
    if dt == "F16":
        return x.astype(np.float16)
    return (x.view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def _scale(amax, divisor, dt):
    s = round_to((amax / F32(divisor)).astype(F32), dt)
    return np.where(s == 0, EPS[dt], s).astype(F32)


def _amax(x):
    """max(|min(x, 0)|, max(x, 0)) = max |x| along the last axis (exact;
    finite x): halving maxima where that axis is a power of two (numpy's
    reduction over a short inner axis is ~10x slower)."""
    a = np.abs(x)
    n = a.shape[-1]
    if n & (n - 1) or n > 256:
        return a.max(axis=-1)
    while a.shape[-1] > 1:
        h = a.shape[-1] // 2
        a = np.maximum(a[..., :h], a[..., h:])
    return a[..., 0]


def _loops(x, func):
    """(the row loops for ``x``, ``x`` C-contiguous, threads): the CPU's
    ``_engines`` for numpy, its GPU twin ``quantcore_gpu.engine_kernels``
    (the same element rules; statistics returned to the host, codes on
    the device) for cupy."""
    if A.is_cupy_array(x):
        A.gpu_kernels(f"engines.{func}")  # (NotImplementedError when the GPU path cannot run)
        from quantcore_gpu import engine_kernels
        return engine_kernels, A.array_module(x).ascontiguousarray(x), 1
    from .._cpu import _engines, threads
    x = np.ascontiguousarray(x)
    return _engines, x, threads.effective_n_threads(x.size)


def on_device(quantize, x, dt, *args):
    """``quantize(x, dt, *args)`` ({name: array}: :func:`quantize_tensor`,
    ``modelopt.quantize_tensor``) with cupy ``x``: the same bytes as numpy
    input, every output a cupy array; the loops on the device (:func:`_loops`)
    except for an F16 weight (numpy's F16 roundings: on the host)."""
    if not A.is_cupy_array(x):
        return quantize(x, dt, *args)
    cp = A.array_module(x)
    return {k: cp.asarray(v) for k, v in
            quantize(x.get() if dt == "F16" else x, dt, *args).items()}


def row_absmax(w, name="weight"):
    """max |x| of each row of a 2-D weight given as float32 values or as
    its stored BF16 bits (uint16), in one pass (``_engines.absmax_rows``);
    ValueError naming ``name`` (:func:`hf.nonfinite_error`) when it holds a
    NaN or an inf."""
    loops, w, nt = _loops(w, "row_absmax")
    return _finite(loops.absmax_rows(w, nt), name)


def _finite(amax, name):
    """``amax``, or the ValueError naming ``name`` when one is NaN or inf."""
    if not np.isfinite(amax).all():
        from .hf import nonfinite_error
        raise nonfinite_error(name)
    return amax


def fp8_rows(w, s, dt_round):
    """e4m3fn codes (satfinite) of ``w / s`` (``s``: float32, one per row or
    one) rounded to ``dt_round`` first ("BF16", "F32", "F16" or None): the
    loop of ``qc_engines.h`` over float32 values or stored BF16 bits (uint16)
    for BF16 / F32 / None, else numpy (F16: :func:`round_to`)."""
    s = np.ascontiguousarray(s, F32).reshape(-1)
    if dt_round == "F16":
        with np.errstate(over="ignore"):
            v = _round_own(np.divide(w, s[:, None] if s.size > 1 else s[0], dtype=F32), "F16")
        return F.cast_fp8(v, "e4m3fn", overflow="satfinite")
    loops, w, nt = _loops(w, "fp8_rows")
    return loops.fp8_rows(w, s, dt_round == "BF16", nt)


def fp8_channel(x, dt, name="weight"):
    """FP8_DYNAMIC's weight: (uint8 e4m3fn codes [O, I], scales float32 [O])
    of rows ``x`` holding ``dt`` values (float32, or a BF16 weight's stored
    uint16 bits)."""
    s = _scale(row_absmax(x, name), 448, dt)
    return fp8_rows(x, s, dt), s


def int_group(x, dt, bits, group, symmetric=True, name="weight", loops=True, packed=False):
    """W4A16 / W8A16 (symmetric) and W4A16_ASYM groups: (int8 codes [O, I]
    (``packed``: :func:`pack_int32` of them, int32 words),
    scales float32 [O, I / group], int8 zero points [O, I / group]: zeros
    when symmetric) of rows ``x`` holding ``dt`` values (float32, or a BF16
    weight's stored uint16 bits) (compressed-tensors' ``calculate_qparams``
    then ``quantize``; the formulas in the module docstring).  The group
    statistics and the codes: the loops of ``qc_engines.h`` for BF16 / F32
    and a power-of-two group, which refuse NaN / inf naming ``name``
    (``_engines.group_minmax_rows``, ``int_rows``); else, or with
    ``loops=False`` (float32 ``x``), numpy."""
    rows, k = x.shape
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    fast = loops and dt != "F16" and group >= 2 and not group & (group - 1)
    if fast:
        eng, x, nt = _loops(x, "int_group")
    else:
        xg = A.to_host(x).reshape(rows, k // group, group)
    if symmetric:
        s = _scale(group_absmax(x, group, name) if fast else _amax(xg), (qmax - qmin) / 2, dt)
        zp = np.zeros(s.shape, np.int8)
    else:
        if fast:
            lo, hi = eng.group_minmax_rows(x, group, nt)
            if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
                from .hf import nonfinite_error
                raise nonfinite_error(name)
        else:
            lo, hi = xg.min(axis=-1), xg.max(axis=-1)
        lo = np.minimum(lo, F32(0))
        hi = np.maximum(hi, F32(0))
        with np.errstate(over="ignore"):
            s = round_to((round_to((hi - lo).astype(F32), dt) / F32(qmax - qmin)).astype(F32), dt)
        with np.errstate(divide="ignore", invalid="ignore"):
            z = round_to((F32(qmin) - round_to((lo / s).astype(F32), dt)).astype(F32), dt)
        zp = np.rint(np.clip(np.where(s == 0, F32(0), z), qmin, qmax)).astype(np.int8)
        s = np.where(s == 0, EPS[dt], s).astype(F32)
    if fast:
        q = eng.int_rows(x, s, zp.astype(F32), group, qmin, qmax, dt == "BF16", nt,
                         bits if packed else 0)
        return (_words(q) if packed else q), s, zp
    with np.errstate(over="ignore"):
        v = _round_own(np.divide(xg, s[..., None], dtype=F32), dt)
        if not symmetric:
            v += zp[..., None]  # (float32: the sum of int8 and a D value, then r_D)
            v = _round_own(v, dt)
    q = _int_codes(v, bits).reshape(rows, k)
    return (pack_int32(q, bits) if packed else q), s, zp


def _int_codes(v, bits):
    """int8 ``clip(rint(v), -2^(bits-1), 2^(bits-1) - 1)`` of float32 ``v``
    (its own: rounded in place)."""
    np.rint(v, out=v)
    np.clip(v, -(1 << (bits - 1)), (1 << (bits - 1)) - 1, out=v)
    return v.astype(np.int8)


def mx_exponents(amax, dt):
    """MXFP4's biased E8M0 exponents (uint8) and float32 scales of the
    per-group ``amax`` (``dt`` values): compressed-tensors'
    ``generate_mx_scales`` (``round_to_power_2`` on ``dt``'s bits, then
    ``127 + floor(log2 p) - 2``, clipped to 0..255), the scale ``2^(e -
    127)`` in ``dt`` (1 where that is 0, as ``calculate_qparams`` replaces
    a zero scale by its uint8 "eps"), and the exponent the compressor
    stores for that scale (``compress_mx_scale``)."""
    a = np.asarray(amax, F32)
    if dt == "F16":  # F16's own bits: 10 mantissa bits, 5 exponent bits
        b = a.astype(np.float16).view(np.uint16).astype(np.uint32)
        p = ((b + np.uint32(1 << 8)) & np.uint32(0xFC00)).astype(np.uint16).view(np.float16)
        p = p.astype(F32)
    else:  # F32 and BF16 (a BF16 value's float32 bits end in 16 zeros)
        p = ((a.view(np.uint32) + np.uint32(1 << 21)) & np.uint32(0xFF800000)).view(F32)
    with np.errstate(divide="ignore"):
        e = np.clip(F32(125) + np.floor(np.log2(p)), 0, 255).astype(np.int32)
    s = round_to(np.ldexp(F32(1), e - 127).astype(F32), dt)
    if not np.isfinite(s).all():
        raise ValueError(f"MXFP4: a group's absmax {float(a.max())} rounds to a power of two "
                         f"beyond {dt}'s range (an infinite scale)")
    e = np.where(s == 0, 127, e).astype(np.uint8)
    return e, np.where(s == 0, F32(1), s).astype(F32)


def group_absmax(x, group, name="weight"):
    """max |x| [O, I / group] of each group of ``group`` values along the rows
    of ``x`` (float32 values or a BF16 weight's stored uint16 bits), in one
    pass (``_engines.group_absmax_rows``; NaN / inf refused naming ``name``
    as :func:`row_absmax`)."""
    loops, x, nt = _loops(x, "group_absmax")
    return _finite(loops.group_absmax_rows(x, group, nt), name)


def fp4_codes(x, divisors, group, dt_round):
    """:func:`e2m1_codes` of ``r(x / divisors[:, j // group])`` packed two a
    byte (F.pack_int4's order), ``r`` rounding to ``dt_round`` ("BF16",
    "F32", "F16" or None: none): the loop of ``qc_engines.h``
    (``_engines.fp4_rows``, its e2m1 rule ``qc_eng_e2m1``) over float32
    values or stored BF16 bits (F16: numpy)."""
    rows, k = x.shape
    d = np.ascontiguousarray(divisors, F32)
    if dt_round == "F16":
        with np.errstate(over="ignore"):
            v = _round_own(np.divide(x.reshape(rows, k // group, group), d[..., None],
                                     dtype=F32), "F16")
        return F.pack_int4(e2m1_codes(v).reshape(rows, k))
    loops, x, nt = _loops(x, "fp4_codes")
    return loops.fp4_rows(x, d, group, dt_round == "BF16", nt)


def mxfp4(x, dt, name="weight"):
    """MXFP4A16's weight: (packed uint8 [O, I / 2], E8M0 exponents uint8
    [O, I / 32]) of rows ``x`` holding ``dt`` values (float32, or a BF16
    weight's stored uint16 bits)."""
    e, s = mx_exponents(group_absmax(x, MX_GROUP, name), dt)
    return fp4_codes(x, s, MX_GROUP, dt), e


def nvfp4_global_scale(amax, dt):
    """NVFP4's global scale of a fused set's absmax (compressed-tensors'
    ``generate_gparam``: ``2688 / a`` is torch's reciprocal, then product)."""
    a = np.maximum(np.asarray(amax, F32).reshape(1), TINY[dt])
    with np.errstate(over="ignore", divide="ignore"):
        g = round_to((round_to((F32(1) / a).astype(F32), dt) * F32(2688)).astype(F32), dt)
    return np.where(np.isfinite(g), g, F32(1)).astype(F32)


#: compressed-tensors' cast_to_fp4 thresholds on |v|: code k + 1 above the
#: k-th (a tie goes to the even code: > on one side, >= on the other)
_E2M1_UP = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False),
            (3.5, True), (5.0, False))
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], F32)


def nvfp4(x, dt, g, name="weight", group_amax=None):
    """NVFP4A16's weight: (packed uint8 [O, I / 2], FP8 scale codes uint8
    [O, I / 16], the float32 per-group divisors f32(s / g)) of rows ``x``
    holding ``dt`` values (float32, or a BF16 weight's stored uint16 bits),
    with the global scale ``g`` (``group_amax``: :func:`group_absmax` of
    ``x``, when already taken: ``fused.FusedSetReader``)."""
    if group_amax is None:
        group_amax = group_absmax(x, NVFP4_GROUP, name)
    if dt == "F16":  # (numpy's F16 rounding)
        s = _round_own(np.divide(group_amax, F32(6), dtype=F32), dt)
        codes = F.cast_fp8(np.multiply(g, s, dtype=F32), "e4m3fn")
        codes[codes == 0] = _E4M3_EIGHTH  # (g * s >= 0: a zero scale is 0.125)
        t = np.divide(F.fp8_decode(codes, "e4m3fn"), g, dtype=F32)
    else:  # the same steps in C (qc_eng_nvfp4_scale), on the host's group maxima
        codes, t = nvfp4_scales(group_amax, g, "compressed-tensors" +
                                ("-bf16" if dt == "BF16" else ""))
    return fp4_codes(x, t, NVFP4_GROUP, None), codes, t


#: the e4m3fn code of 0.125, NVFP4A16's scale where the group's is zero
_E4M3_EIGHTH = F.cast_fp8(np.float32([0.125]), "e4m3fn")[0]


def nvfp4_scales(group_amax, g, recipe):
    """(e4m3fn codes uint8, float32 divisors) of NVFP4 groups from their
    maxima (host arrays) and the global scale ``g``, by ``recipe``
    (``_engines.NVFP4_RECIPES``: this module's NVFP4A16, or ModelOpt's)."""
    from .._cpu import _engines, threads
    return _engines.nvfp4_scales(group_amax, F32(np.asarray(g, F32).reshape(-1)[0]), recipe,
                                 threads.effective_n_threads(group_amax.size * NVFP4_GROUP))


def e2m1_codes(v):
    """compressed-tensors' ``cast_to_fp4`` of float32 ``v`` as 4-bit codes
    (uint8, sign in bit 3; saturating at 6)."""
    a = np.abs(v)
    code = np.zeros(v.shape, np.uint8)
    hit = np.empty(v.shape, np.bool_)  # (one mask buffer for every threshold)
    for edge, inclusive in _E2M1_UP:
        (np.greater_equal if inclusive else np.greater)(a, F32(edge), out=hit)
        code += hit.view(np.uint8)
    del a
    np.less(v, F32(0), out=hit)
    code |= hit.view(np.uint8) << np.uint8(3)
    return code


def e2m1_values(packed):
    """float32 values [O, 2 * cols] of packed e2m1 codes (element 2i in
    the low nibble)."""
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(packed.shape[0], -1)
    return E2M1_VALUES[codes & 7] * np.where(codes & 8, F32(-1), F32(1))


def pack_int32(q, bits):
    """compressed-tensors' ``pack_to_int32`` of int4 / int8 codes ``q`` [R,
    C] along the last axis: ``q + 2^(bits-1)`` densely in the bit stream of
    little-endian words (element n at bit bits * n: int4 nibbles low
    first, int8 bytes), zero-padded to ``ceil(C * bits / 32)`` words."""
    if bits not in (4, 8):
        raise ValueError(f"packing of {bits}-bit codes is not written (4 or 8)")
    u = (q.astype(np.int16) + (1 << (bits - 1))).astype(np.uint8)
    return _words(F.pack_int4(u) if bits == 4 else u)


def _words(b):
    """uint8 bytes [..., n] as little-endian int32 words, zero-padded to a
    multiple of 4 bytes."""
    xp = A.array_module(b)
    pad = -b.shape[-1] % 4
    if pad:
        b = xp.concatenate([b, xp.zeros(b.shape[:-1] + (pad,), np.uint8)], axis=-1)
    return xp.ascontiguousarray(b).view("<i4")


def unpack_int32(packed, bits, k):
    """int8 codes [R, k] of :func:`pack_int32`'s words."""
    if bits not in (4, 8):
        raise ValueError(f"packing of {bits}-bit codes is not written (4 or 8)")
    b = np.ascontiguousarray(packed).view(np.uint8)
    u = F.unpack_int4(b, k) if bits == 4 else b[:, :k]
    return (u.astype(np.int16) - (1 << (bits - 1))).astype(np.int8)


def check_shape(name, shape, scheme, group):
    """A shape and group the engines' kernels take, or ValueError naming
    the layer (never padded)."""
    if scheme == "NVFP4A16" and shape[1] % NVFP4_GROUP:
        raise ValueError(f"layer {module_of(name)!r}: input width {shape[1]} is not a multiple "
                         f"of 16 (NVFP4's group, the only one vLLM takes); not padded: leave "
                         "the layer out")
    if fmt_of(scheme) == "mxfp4-pack-quantized" and shape[1] % MX_GROUP:
        raise ValueError(f"layer {module_of(name)!r}: input width {shape[1]} is not a multiple "
                         f"of 32 (MXFP4's group); not padded: leave the layer out")
    if not is_int_group(scheme):
        return
    if group not in GROUP_SIZES:
        raise ValueError(f"{scheme}: group size {group} is not one vLLM's WNA16 kernels take "
                         f"({', '.join(map(str, GROUP_SIZES))}: MARLIN_SUPPORTED_GROUP_SIZES)")
    if shape[1] % group:
        raise ValueError(f"layer {module_of(name)!r}: input width {shape[1]} is not a multiple "
                         f"of the group size {group} ({scheme}); not padded: leave the layer "
                         "out or choose another group size")


# -------------------------------------------------------------------- layout
def plan(name, dt, shape, scheme, group):
    """[(name, dtype, shape)] stored for one quantized weight ``name``."""
    m = module_of(name)
    o, i = shape
    if scheme == "FP8_DYNAMIC":
        return [(f"{m}.weight", "F8_E4M3", (o, i)), (f"{m}.weight_scale", dt, (o, 1))]
    if scheme == "NVFP4A16":
        return [(f"{m}.weight_packed", "U8", (o, i // 2)),
                (f"{m}.weight_scale", "F8_E4M3", (o, i // NVFP4_GROUP)),
                (f"{m}.weight_global_scale", "F32", (1,))]
    if fmt_of(scheme) == "mxfp4-pack-quantized":
        return [(f"{m}.weight_packed", "U8", (o, i // 2)),
                (f"{m}.weight_scale", "U8", (o, i // MX_GROUP))]
    bits = SCHEMES[scheme][1]
    out = [(f"{m}.weight_packed", "I32", (o, -(-i * bits // 32))),
           (f"{m}.weight_scale", dt, (o, i // group)), (f"{m}.weight_shape", "I64", (2,))]
    if scheme in ASYMMETRIC:
        out.append((f"{m}.weight_zero_point", "I32", (-(-o * bits // 32), i // group)))
    return out


def quantize_tensor(x, dt, scheme, group, global_scale=None, name="weight", group_amax=None):
    """{stored name suffix: array} of one weight (float32 ``x`` holding its
    ``dt`` values, or a BF16 weight's stored uint16 bits;
    NVFP4A16: with its fused set's ``global_scale`` and, when taken
    already, its group maxima ``group_amax``), in :func:`plan`'s
    order (``name`` in errors); numpy or cupy ``x`` (:func:`on_device`)."""
    return on_device(_quantize_tensor, x, dt, scheme, group, global_scale, name, group_amax)


def _quantize_tensor(x, dt, scheme, group, global_scale, name, group_amax):
    if scheme == "NVFP4A16":
        packed, scodes, _ = nvfp4(x, dt, global_scale, name, group_amax)
        return {"weight_packed": packed, "weight_scale": scodes,
                "weight_global_scale": np.asarray(global_scale, F32).reshape(1)}
    if scheme == "FP8_DYNAMIC":
        q, s = fp8_channel(x, dt, name)
        return {"weight": q, "weight_scale": as_dtype_bytes(s.reshape(-1, 1), dt)}
    if fmt_of(scheme) == "mxfp4-pack-quantized":
        packed, e = mxfp4(x, dt, name)
        return {"weight_packed": packed, "weight_scale": e}
    bits, sym = SCHEMES[scheme][1], scheme not in ASYMMETRIC
    packed, s, zp = int_group(x, dt, bits, group, sym, name, packed=True)
    out = {"weight_packed": packed, "weight_scale": as_dtype_bytes(s, dt),
           "weight_shape": np.array(x.shape, np.int64)}
    if not sym:  # packed along O (compressed-tensors' packed_dim=0)
        out["weight_zero_point"] = np.ascontiguousarray(pack_int32(zp.T, bits).T)
    return out


def _args(bits, typ, strategy, group, dynamic, symmetric=True):
    out = {"num_bits": bits, "type": typ, "symmetric": symmetric, "group_size": group,
           "strategy": strategy, "dynamic": dynamic}
    if strategy == "tensor_group":
        out["scale_dtype"] = "torch.float8_e4m3fn"
    elif typ == "float" and strategy == "group":  # MX: E8M0 exponents
        out["scale_dtype"] = "torch.uint8"
    return out


def quantization_config(scheme, ignore, group=None):
    """config.json's ``quantization_config`` for a scheme: what
    compressed-tensors' ``ModelCompressor.update_config`` writes for
    llm-compressor's preset (its ``QuantizationConfig.model_dump()``, which
    leaves out the arguments at their defaults, plus the version,
    ``quant_method`` and the empty sparsity / transform configs)."""
    fmt, bits, typ, strategy, act = SCHEMES[scheme]
    weights = _args(bits, typ, strategy, NVFP4_GROUP if strategy == "tensor_group" else
                    group if is_int_group(scheme) else MX_GROUP if strategy == "group" else None,
                    False, scheme not in ASYMMETRIC)
    acts = _args(8, "float", "token", None, True) if act == "fp8_token" else \
        _args(4, "float", "group", MX_GROUP, True) if act == "mxfp4" else None
    return {
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                      "input_activations": acts, "output_activations": None,
                                      "format": fmt}},
        "format": fmt, "global_compression_ratio": None, "ignore": list(ignore),
        "kv_cache_scheme": None, "moe_sparsity_config": None,
        "quant_method": "compressed-tensors", "quantization_status": "compressed",
        "sparsity_config": {}, "transform_config": {}, "version": LAYOUT_VERSION,
    }


# ---------------------------------------------------------------- read back
def dequantize_module(get, module):
    """(dtype, float32 values) of one quantized module's weight, as
    compressed-tensors' decompressor gives it; ``get(name)`` returns a
    stored tensor's (dtype, shape, raw uint8 bytes), or None."""
    sdt, sshape, raw_scale = get(f"{module}.weight_scale")
    packed = get(f"{module}.weight_packed")
    gs = get(f"{module}.weight_global_scale")
    if gs is not None or sdt == "U8":  # nvfp4- / mxfp4-pack-quantized
        if gs is not None:
            g = _read_float(gs[2], "F32").reshape(1)
            if sdt != "F8_E4M3":
                raise ValueError(f"{module}.weight_scale: dtype {sdt}, expected F8_E4M3 (NVFP4)")
            t = (F.fp8_decode(raw_scale.reshape(sshape), "e4m3fn") / g).astype(F32)
        else:  # decompress_mx_scale: 2^(e - 127) in BF16
            e = raw_scale.reshape(sshape).astype(np.int32) - 127
            t = round_to(np.ldexp(F32(1), e).astype(F32), "BF16")
        q = e2m1_values(packed[2].reshape(packed[1]))
        rows, k = q.shape
        y = q.reshape(rows, t.shape[-1], -1) * t[..., None]
        return "BF16", round_to(y.reshape(rows, k).astype(F32), "BF16")
    if packed is None:  # float-quantized
        dt, shape, raw = get(f"{module}.weight")
        if dt != "F8_E4M3" or sdt not in WEIGHT_DTYPES:
            raise ValueError(f"{module}: weight {dt} / weight_scale {sdt}, expected F8_E4M3 / "
                             "F32, F16 or BF16")
        s = _read_float(raw_scale, sdt).reshape(sshape)
        y = F.fp8_decode(raw.reshape(shape), "e4m3fn") * s.reshape(-1, 1)
        return sdt, round_to(y.astype(F32), sdt)
    if sdt not in WEIGHT_DTYPES:
        raise ValueError(f"{module}.weight_scale: dtype {sdt}, expected F32, F16 or BF16")
    s = _read_float(raw_scale, sdt).reshape(sshape)
    _, _, raw_shape = get(f"{module}.weight_shape")
    shape = tuple(int(v) for v in raw_shape.view("<i8"))
    bits = {-(-shape[1] * b // 32): b for b in (8, 4)}.get(packed[1][-1])
    if bits is None or shape[1] < 32:
        raise ValueError(f"{module}.weight_packed: {packed[1][-1]} words a row for "
                         f"{shape[1]} inputs: only int4 and int8 pack-quantized weights are read")
    q = unpack_int32(packed[2].view("<i4").reshape(packed[1]), bits, shape[1])
    zp = get(f"{module}.weight_zero_point")
    g = shape[1] // s.shape[-1]
    v = q.reshape(shape[0], -1, g).astype(F32)
    if zp is not None:  # packed along O
        z = unpack_int32(zp[2].view("<i4").reshape(zp[1]).T, bits, shape[0]).T
        v = round_to(v - z[..., None].astype(F32), sdt)
    y = v * s[..., None]
    return sdt, round_to(y.reshape(shape).astype(F32), sdt)


def _read_float(raw, dt):
    """float32 values of raw F32 / F16 / BF16 bytes."""
    if dt == "BF16":
        return (raw.view("<u2").astype(np.uint32) << np.uint32(16)).view(F32)
    return raw.view("<f2" if dt == "F16" else "<f4").astype(F32)
