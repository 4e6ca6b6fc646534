"""The NVIDIA ModelOpt checkpoint layout (``quant_method: "modelopt"``),
which ModelOpt's unified Hugging Face export writes and vLLM, SGLang and
TensorRT-LLM load, and that exporter's numerics, bit for bit
(nvidia-modelopt 0.47.0: ``torch/export/unified_export_hf.py``
``_export_quantized_weight``, ``torch/export/quant_utils.py``
``to_quantized_weight`` / ``get_quant_config``,
``torch/export/convert_hf_config.py``, ``torch/quantization/qtensor/
nvfp4_tensor.py`` / ``fp8_tensor.py``; docs/FORMATS.md, "ModelOpt").

Schemes (ModelOpt's ``quant_algo``, :data:`SCHEMES`); per Linear ``X``:

- ``FP8`` (``FP8_DEFAULT_CFG``: W8A8, static per-tensor activations):
  ``X.weight`` F8_E4M3 ``[O, I]``, ``X.weight_scale`` F32 ``[]``,
  ``X.input_scale`` F32 ``[]`` (from activation ranges given by the
  caller: quantcore is data-free, and vLLM's ModelOptFp8LinearMethod
  needs one).
- ``FP8_PER_CHANNEL_PER_TOKEN``: ``X.weight`` F8_E4M3 ``[O, I]``,
  ``X.weight_scale`` F32 ``[O]``; activations per token at run time.
- ``W4A16_NVFP4``: ``X.weight`` U8 ``[O, I / 2]`` (FP4 e2m1, element 2i
  in the low nibble), ``X.weight_scale`` F8_E4M3 ``[O, I / 16]``,
  ``X.weight_scale_2`` F32 ``[]``, one value per fused set (q/k/v,
  gate/up, experts' w1/w3: ModelOpt's ``preprocess_linear_fusion``).

The arithmetic (``D`` the weight's dtype, ``r_D`` its rounding; torch
divides a D tensor by a 0-d float32 tensor in float32 and rounds to D, by
a float32 tensor of more dimensions in float32)::

    FP8        a = max|x| (> 0)          s = f32(a / 448)   q = e4m3(r_D(f32(x / s)))
    FP8_PC_PT  a = max|x| per row, 0 -> 448, then >= tiny_D
                                         s = f32(a / 448)   q = e4m3(f32(x / s))
    input_scale = f32(max(amax, tiny) / 448)               (amax 0 -> 448)
    W4A16_NVFP4  g = f32(a_set / 2688)   (a_set: max|x| over the fused set, > 0)
                 quantcore.formats.nvfp4_quantize(x, g, recipe="modelopt")

Read back (ModelOpt's ``FP8QTensor.dequantize`` / ``NVFP4QTensor.
dequantize``, to the model's dtype D)::

    FP8     y = r_D(decode(q) * r_D(s))
    NVFP4   y = r_D(value(q) * f32(s8 * g))     (code 0x8 is +0)

transformers 5.24 has no ``modelopt`` quantizer (it warns "Unknown
quantization type" and loads nothing right): vLLM / SGLang / TensorRT-LLM
are its loaders, all GPU-only.
"""
import numpy as np

from .. import formats as F
from . import compressed_tensors as CT
from . import selection as S

__all__ = ["SCHEMES", "LAYOUT_VERSION", "plan", "quantize_tensor", "dequantize_module",
           "hf_quant_config", "quantization_config", "exclude_modules", "check_shape",
           "input_scale", "global_scale"]

#: the ModelOpt release whose export this module follows (written as
#: producer.version, as ModelOpt writes its own)
LAYOUT_VERSION = "0.47.0"
F32 = np.float32
#: quant_algo -> (weight kind, needs activation ranges)
SCHEMES = {
    "FP8": ("fp8_tensor", True),
    "FP8_PER_CHANNEL_PER_TOKEN": ("fp8_channel", False),
    "W4A16_NVFP4": ("nvfp4", False),
}
NVFP4_GROUP = 16
#: every tensor suffix a quantized module may store
STORED = ("weight", "weight_scale", "weight_scale_2", "input_scale")
#: safetensors dtype -> config.json's dtype name
_DTYPE_NAMES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


def check_shape(name, shape, scheme):
    """ValueError naming the layer for a shape the scheme refuses (ModelOpt
    pads an NVFP4 row to a multiple of 16; vLLM's kernels refuse it)."""
    if scheme == "W4A16_NVFP4" and shape[1] % NVFP4_GROUP:
        raise ValueError(f"layer {CT.module_of(name)!r}: input width {shape[1]} is not a "
                         "multiple of 16 (NVFP4's group); not padded: leave the layer out")


# ------------------------------------------------------------------ numerics
def _absmax(x):
    return F32(max(float(x.max(initial=0)), -float(x.min(initial=0))))


def fp8_tensor(x, dt, name="weight", tensor=None):
    """FP8's weight: (uint8 e4m3fn codes, float32 scale) of 2-D ``x``
    holding ``dt`` values (float32, or a BF16 weight's stored uint16 bits);
    ``name`` (the module) and ``tensor`` in errors."""
    rows = CT.row_absmax(x, tensor or name)
    a = F32(rows.max()) if rows.size else F32(0)
    if a == 0:
        raise ValueError(f"{name}: all zero; ModelOpt's FP8 export divides by its amax (scale "
                         "0, NaN codes): not quantized")
    s = F32(a / F32(448))
    return CT.fp8_rows(x, s, dt), s


def fp8_channel(x, dt, name="weight"):
    """FP8_PER_CHANNEL_PER_TOKEN's weight: (uint8 e4m3fn codes [O, I],
    float32 scales [O]) of ``x`` as :func:`fp8_tensor`'s."""
    a = CT.row_absmax(x, name)
    a = np.where(a == 0, F32(448), a)  # TensorQuantizer._sanitize_export_amax
    a = np.maximum(a, CT.TINY[dt]).astype(F32)  # export_amax's clamp(min=finfo(D).tiny)
    s = (a / F32(448)).astype(F32)
    return CT.fp8_rows(x, s, None), s


def input_scale(amax, module):
    """``X.input_scale`` of an activation range (ModelOpt's export_amax:
    0 -> 448, at least float32's tiny; then amax / 448)."""
    a = F32(amax)
    if not np.isfinite(a) or a < 0:
        raise ValueError(f"input amax of {module!r}: {amax!r} is not a finite value >= 0")
    a = F32(448) if a == 0 else max(a, CT.TINY["F32"])
    return F32(a / F32(448))


def global_scale(amax, module):
    """NVFP4's ``weight_scale_2`` of a fused set's absmax: f32(a / 2688)."""
    a = F32(amax)
    if a == 0:
        raise ValueError(f"{module}: all zero over its fused set; ModelOpt's NVFP4 export "
                         "divides by it (NaN scales): not quantized")
    return F32(a / F32(2688))


def nvfp4(x, g, name="weight", group_amax=None):
    """W4A16_NVFP4's weight: (packed uint8 [O, I / 2], FP8 scale codes uint8
    [O, I / 16]) of rows ``x`` (float32 values, or a BF16 weight's stored
    uint16 bits) with the set's ``weight_scale_2`` ``g``: the modelopt
    recipe of ``quantcore.formats.nvfp4_quantize`` (its formula is stated
    there), here with the block scales on the group maxima (``_engines.
    nvfp4_scales``: bs = amax / f32(6 g), 1 where 0, clipped to [2^-9, 448],
    its e4m3 code, the divisor decode(code) * g) and the
    codes by the loop of ``compressed_tensors.fp4_codes`` (e2m1
    nearest even, saturating, the sign from ``v < 0``: ModelOpt's rule too).
    NaN / inf refused naming ``name``; ``group_amax``: the group maxima
    when already taken (``fused.FusedSetReader``)."""
    g = F32(g)
    bamax = CT.group_absmax(x, NVFP4_GROUP, name) if group_amax is None else group_amax
    scodes, divisors = CT.nvfp4_scales(bamax, g, "modelopt")
    return CT.fp4_codes(x, divisors, NVFP4_GROUP, None), scodes


# -------------------------------------------------------------------- layout
def plan(name, dt, shape, scheme, with_input=False):
    """[(name, dtype, shape)] stored for one quantized weight ``name``."""
    m = CT.module_of(name)
    o, i = shape
    if scheme == "W4A16_NVFP4":
        return [(f"{m}.weight", "U8", (o, i // 2)),
                (f"{m}.weight_scale", "F8_E4M3", (o, i // NVFP4_GROUP)),
                (f"{m}.weight_scale_2", "F32", ())]
    out = [(f"{m}.weight", "F8_E4M3", (o, i)),
           (f"{m}.weight_scale", "F32", (o,) if scheme != "FP8" else ())]
    if with_input:
        out.append((f"{m}.input_scale", "F32", ()))
    return out


def quantize_tensor(x, dt, scheme, name, *, g=None, in_amax=None, group_amax=None):
    """{stored name suffix: array} of one weight: ``x`` its float32 values,
    or its stored bits when ``dt`` is BF16 (uint16; ``hf.read_weight``);
    numpy or cupy (``compressed_tensors.on_device``)."""
    return CT.on_device(_quantize_tensor, x, dt, scheme, name, g, in_amax, group_amax)


def _quantize_tensor(x, dt, scheme, name, g, in_amax, group_amax):
    m = CT.module_of(name)
    if scheme == "W4A16_NVFP4":
        packed, scodes = nvfp4(x, g, name, group_amax)
        return {"weight": packed, "weight_scale": scodes,
                "weight_scale_2": np.asarray(g, F32).reshape(())}
    if scheme == "FP8_PER_CHANNEL_PER_TOKEN":
        q, s = fp8_channel(x, dt, name)
        return {"weight": q, "weight_scale": s}
    q, s = fp8_tensor(x, dt, m, name)
    out = {"weight": q, "weight_scale": np.asarray(s, F32).reshape(())}
    if in_amax is not None:
        out["input_scale"] = np.asarray(input_scale(in_amax, m), F32).reshape(())
    return out


def exclude_modules(model, ignore):
    """ModelOpt's ``exclude_modules``: the modules left unquantized that an
    engine might otherwise take as quantized (lm_head, routers, towers,
    other Linear outside the blocks: :func:`compressed_tensors.select`'s
    ``ignore``) and the embeddings (ModelOpt 0.47 lists them too), exact
    names, sorted."""
    out = set(ignore)
    for n in model.names:
        if n.endswith(".weight") and len(model.info(n)[1]) == 2 and S.is_embedding(n):
            out.add(CT.module_of(n))
    return sorted(out)


def hf_quant_config(scheme, exclude):
    """``hf_quant_config.json`` as ModelOpt's ``get_quant_config`` writes it."""
    q = {"quant_algo": scheme, "kv_cache_quant_algo": None}
    if scheme == "W4A16_NVFP4":
        q["group_size"] = NVFP4_GROUP
    q["exclude_modules"] = list(exclude)
    return {"producer": {"name": "modelopt", "version": LAYOUT_VERSION}, "quantization": q}


def quantization_config(hf_cfg):
    """config.json's ``quantization_config`` of an ``hf_quant_config``:
    ModelOpt's ``convert_hf_quant_config_format`` for these schemes."""
    q = hf_cfg["quantization"]
    algo = q["quant_algo"]
    out = {}
    if algo == "FP8":
        out["config_groups"] = {"group_0": {
            "input_activations": {"dynamic": False, "num_bits": 8, "type": "float"},
            "weights": {"dynamic": False, "num_bits": 8, "type": "float"},
            "targets": ["Linear"]}}
    elif algo == "W4A16_NVFP4":
        out["config_groups"] = {"group_0": {
            "weights": {"dynamic": False, "num_bits": 4, "type": "float",
                        "group_size": q.get("group_size", NVFP4_GROUP)},
            "targets": ["Linear"]}}
    out["ignore"] = list(q.get("exclude_modules") or [])
    out["quant_algo"] = algo
    out["producer"] = dict(hf_cfg["producer"])
    out["quant_method"] = "modelopt"
    return out


def scheme_of(config):
    """The quant_algo of a ModelOpt config.json (its quantization_config)."""
    qc = config.get("quantization_config") or {}
    algo = qc.get("quant_algo") or (qc.get("quantization") or {}).get("quant_algo")
    if algo not in SCHEMES:
        raise ValueError(f"quantization_config.quant_algo {algo!r}: quantcore reads "
                         f"{list(SCHEMES)}")
    return algo


def model_dtype(config):
    """The safetensors name of config.json's ``dtype`` (``torch_dtype``),
    BF16 when absent."""
    name = config.get("dtype") or config.get("torch_dtype") or "bfloat16"
    return _DTYPE_NAMES.get(str(name).replace("torch.", ""), "BF16")


# ---------------------------------------------------------------- read back
def dequantize_module(get, module, dt):
    """(dtype, float32 values) of one ModelOpt module's weight, as
    ModelOpt's dequantize gives it in the model's dtype ``dt``; ``get(name)``
    returns a stored tensor's (dtype, shape, raw uint8 bytes) or None."""
    wdt, wshape, raw = get(f"{module}.weight")
    sdt, sshape, raw_scale = get(f"{module}.weight_scale")
    g2 = get(f"{module}.weight_scale_2")
    if g2 is not None:
        if wdt != "U8" or sdt != "F8_E4M3" or g2[0] != "F32":
            raise ValueError(f"{module}: weight {wdt} / weight_scale {sdt} / weight_scale_2 "
                             f"{g2[0]}, expected U8 / F8_E4M3 / F32 (NVFP4)")
        g = F32(g2[2].view("<f4").reshape(-1)[0])
        y = F.nvfp4_dequantize(raw.reshape(wshape), raw_scale.reshape(sshape), g,
                               recipe="modelopt")
        return dt, CT.round_to(np.asarray(y, F32), dt)
    if wdt != "F8_E4M3" or sdt != "F32":
        raise ValueError(f"{module}: weight {wdt} / weight_scale {sdt}, expected F8_E4M3 / F32")
    s = CT.round_to(raw_scale.view("<f4").astype(F32).reshape(-1), dt)
    q = F.fp8_decode(raw.reshape(wshape), "e4m3fn")
    y = q * (s[:, None] if s.size > 1 else s[0])
    return dt, CT.round_to(y.astype(F32), dt)
