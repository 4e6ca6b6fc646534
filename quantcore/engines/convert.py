"""``quantcore convert SRC_DIR -o DST_DIR --format compressed-tensors|modelopt``:
a quantized model directory rewritten in the other layout with the same
codes, never requantized (:func:`convert`).

What converts, and when it is exact (the destination's decoder gives the
source's values bit for bit):

- NVFP4 (compressed-tensors ``nvfp4-pack-quantized`` <-> ModelOpt
  ``W4A16_NVFP4``): packed codes and FP8 block scales copied; the global
  scale is inverted (compressed-tensors divides, ``f32(s8 / g)``, ModelOpt
  multiplies, ``f32(s8 * g2)``).  The reciprocal ``f32(1 / g)`` and its
  float32 neighbours (up to 64 ulps) are tried, the first that gives every
  block scale in use (over the fused set, whose members must keep one
  value) the same factor is written; where none does the layer is refused,
  named (quantize from the original weights instead).
- FP8 per channel (``FP8_DYNAMIC`` <-> ``FP8_PER_CHANNEL_PER_TOKEN``):
  codes copied, scales widened to float32 (``[O, 1]`` in
  compressed-tensors, ``[O]`` in ModelOpt): the same numbers, exact.  The
  two reference decoders round differently (compressed-tensors multiplies
  in the scale's dtype, ModelOpt in the model's): the stored values, not
  those roundings, are what is kept.
- Anything else (int4 groups, FP8 per tensor with static activations)
  is refused naming the scheme.
"""
import fnmatch
import time

import numpy as np

from .. import formats as F
from . import compressed_tensors as CT
from . import modelopt as MO
from .hf import HFModel, ModelDirError, nbytes, parse_size, plan_shards, write_model_dir

F32 = np.float32
_MAX_ULPS = 64


def _kind(model):
    """("nvfp4" | "fp8_channel", ignore list) of a quantized directory."""
    qc = model.config["quantization_config"]
    if model.quant_method == "modelopt":
        algo = MO.scheme_of(model.config)
        kinds = {"W4A16_NVFP4": "nvfp4", "FP8_PER_CHANNEL_PER_TOKEN": "fp8_channel"}
        if algo not in kinds:
            raise ValueError(f"modelopt {algo}: convert takes W4A16_NVFP4 and "
                             "FP8_PER_CHANNEL_PER_TOKEN (the schemes both layouts have)")
        return kinds[algo], list(qc.get("ignore") or [])
    groups = list((qc.get("config_groups") or {}).values())
    if len(groups) != 1:
        raise ValueError(f"compressed-tensors config with {len(groups)} config groups: convert "
                         "takes one")
    g = groups[0]
    fmt = g.get("format") or qc.get("format")
    w, a = g.get("weights") or {}, g.get("input_activations")
    if fmt == "nvfp4-pack-quantized" and a is None:
        kind = "nvfp4"
    elif fmt == "float-quantized" and w.get("strategy") == "channel" and a and \
            a.get("dynamic") is True and a.get("strategy") == "token":
        kind = "fp8_channel"
    else:
        raise ValueError(f"compressed-tensors format {fmt!r} (weights {w.get('strategy')}): "
                         "convert takes NVFP4A16 and FP8_DYNAMIC")
    return kind, list(qc.get("ignore") or [])


def _ignore_to(ignore, fmt):
    """The ignore list in the destination's syntax (ModelOpt: fnmatch
    wildcards; compressed-tensors: names or ``re:`` patterns)."""
    out = []
    for e in ignore:
        if fmt == "modelopt" and e.startswith("re:"):
            raise ValueError(f"ignore entry {e!r}: a regular expression has no ModelOpt "
                             "exclude_modules form")
        out.append("re:" + fnmatch.translate(e) if fmt == "compressed-tensors" and
                   any(c in e for c in "*?[") else e)
    return out


def _factor(s8, g, src):
    """f32 per-block factors of decoded FP8 scales ``s8`` under global ``g``."""
    with np.errstate(divide="ignore", over="ignore"):
        return (s8 / g if src == "compressed-tensors" else s8 * g).astype(F32)


def inverse_global(g, s8, src, name):
    """The destination's global scale keeping every factor of ``s8``."""
    want = _factor(s8, F32(g), src)
    dst = "modelopt" if src == "compressed-tensors" else "compressed-tensors"
    r0 = F32(F32(1) / F32(g))
    for k in range(_MAX_ULPS + 1):
        for r in ({r0} if k == 0 else (F32(r0 + k * np.spacing(r0)),
                                       F32(r0 - k * np.spacing(r0)))):
            if np.array_equal(_factor(s8, r, dst), want):
                return F32(r)
    raise ValueError(f"layer {name!r}: no float32 {dst} global scale near 1 / {float(g)!r} "
                     "keeps every block's factor (the reciprocal is not exact here): not "
                     "converted; quantize the original weights to this format instead")


def convert(src, dst, fmt, *, max_shard_size="50GB", progress=None):
    """Rewrite the quantized model directory ``src`` in layout ``fmt`` at
    ``dst`` (see the module's docstring).  Returns {"converted": modules,
    "kind", "shards", "seconds"}."""
    if fmt not in ("compressed-tensors", "modelopt"):
        raise ValueError(f"format {fmt!r}: convert writes compressed-tensors or modelopt")
    limit = parse_size(max_shard_size)
    t0 = time.perf_counter()
    with HFModel(src, quantized=True) as model:
        if model.quant_method == fmt:
            raise ValueError(f"{src} is already {fmt}")
        kind, ignore = _kind(model)
        ignore = _ignore_to(ignore, fmt)
        to_mo = fmt == "modelopt"
        mods = [n[:-len(".weight_scale")] for n in model.names if n.endswith(".weight_scale")]

        def raw(n):
            if n not in model:
                raise ModelDirError(f"{src}: tensor {n!r} is missing")
            return model.reader(n).raw(n)

        globals_ = {}
        if kind == "nvfp4":
            gname = "weight_global_scale" if to_mo else "weight_scale_2"
            sets = CT.fused_sets([f"{m}.weight" for m in mods])
            for m in mods:
                if m in globals_:
                    continue
                members = [CT.module_of(n) for n in sets.get(f"{m}.weight", (f"{m}.weight",))]
                g = {raw(f"{k}.{gname}").view("<f4").reshape(-1)[0] for k in members}
                if len(g) != 1:
                    raise ValueError(f"layer {m!r}: its fused set {members} holds different "
                                     "global scales (an engine needs one)")
                s8 = np.unique(np.concatenate([raw(f"{k}.weight_scale") for k in members]))
                s8 = F.fp8_decode(s8, "e4m3fn")
                if not np.isfinite(s8).all():
                    raise ValueError(f"layer {m!r}: a block scale is not finite")
                r = inverse_global(g.pop(), s8[s8 != 0], model.quant_method, m)
                globals_.update({k: r for k in members})
        rename, out_entry = {}, {}
        for m in mods:
            if kind == "nvfp4":
                pairs = (("weight_packed", "weight"), ("weight_scale", "weight_scale"),
                         ("weight_global_scale", "weight_scale_2"))
                pairs = pairs if to_mo else tuple((b, a) for a, b in pairs)
            else:
                pairs = (("weight", "weight"), ("weight_scale", "weight_scale"))
            for a, b in pairs:
                rename[f"{m}.{a}"] = f"{m}.{b}"
        groups = []
        for n in model.names:
            dt, shape = model.info(n)
            new = rename.get(n, n)
            leaf = new.rpartition(".")[2]
            if n in rename and leaf in ("weight_scale_2", "weight_global_scale"):
                dt, shape = "F32", (() if to_mo else (1,))
            elif n in rename and kind == "fp8_channel" and leaf == "weight_scale":
                dt, shape = "F32", ((shape[0],) if to_mo else (shape[0], 1))
            out_entry[new] = n
            groups.append([(new, dt, shape)])
        shards = plan_shards(groups, limit)
        extra = {}
        config = dict(model.config)
        if to_mo:
            hq = MO.hf_quant_config("W4A16_NVFP4" if kind == "nvfp4" else
                                    "FP8_PER_CHANNEL_PER_TOKEN", ignore)
            config["quantization_config"] = MO.quantization_config(hq)
            extra["hf_quant_config.json"] = hq
        else:
            config["quantization_config"] = CT.quantization_config(
                "NVFP4A16" if kind == "nvfp4" else "FP8_DYNAMIC", ignore)

        def write_tensor(writer, name):
            n = out_entry[name]
            leaf = name.rpartition(".")[2]
            m = CT.module_of(name) if leaf == "weight" else name.rpartition(".")[0]
            if n in rename and leaf in ("weight_scale_2", "weight_global_scale"):
                writer.write(name, np.asarray(globals_[m], F32).reshape(-1))
            elif n in rename and kind == "fp8_channel" and leaf == "weight_scale":
                writer.write(name, CT._read_float(raw(n), model.info(n)[0]))
            else:
                writer.write_bytes(name, raw(n))

        write_model_dir(model, dst, config, shards, write_tensor, progress=progress,
                        extra_files=extra)
    return {"converted": mods, "kind": kind, "shards": [f for f, _ in shards],
            "bytes_out": sum(nbytes(dt, s) for _, e in shards for _, dt, s in e),
            "seconds": time.perf_counter() - t0}
