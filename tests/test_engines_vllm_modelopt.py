"""vLLM's loader rules for the ModelOpt checkpoints quantcore.engines
writes (vLLM itself needs a GPU), each after the vLLM source it follows:
vllm-project/vllm, vllm/model_executor/layers/quantization/modelopt.py
(the 2026 line, with W4A16_NVFP4):

- ``ModelOptQuantConfigBase.from_config``: either ``{"quantization":
  {"quant_algo", "kv_cache_quant_algo", "group_size", "exclude_modules"}}``
  (hf_quant_config.json) or the flat config.json form ``{"quant_algo",
  "ignore", "group_size", "quant_method": "modelopt"}``; ``quant_algo``
  upper-cased must be in ``QUANT_ALGOS``; ``exclude_modules`` a list,
  ``group_size`` an int; ``_extract_modelopt_quant_algo``: quant_method
  starts with "modelopt".
- ``is_layer_excluded``: exact name (with fused shards), substring, then
  ``fnmatch`` wildcards; ``is_layer_skipped`` (utils/quant_utils.py)
  refuses a fused layer whose shards are excluded only in part.
- ``ModelOptFp8LinearMethod.create_weights`` (quant_algo FP8): ``weight``
  float8_e4m3fn ``[out, in]``, ``weight_scale`` and ``input_scale``
  PerTensorScaleParameter (float32, one per fused shard: a scalar in the
  checkpoint; an absent input_scale stays at finfo.min);
  ``process_weights_after_loading`` requantizes fused shards to their max
  weight scale.
- ``ModelOptFp8PcPtLinearMethod`` (FP8_PER_CHANNEL_PER_TOKEN): ``weight``
  float8_e4m3fn ``[out, in]``, ``weight_scale`` float32 ``[out]``
  (ChannelQuantScaleParameter), no ``input_scale``.
- ``ModelOptNvFp4W4A16LinearMethod`` (W4A16_NVFP4): input width a
  multiple of 16; ``weight`` uint8 ``[out, in / 2]``, ``weight_scale``
  float8_e4m3fn ``[out, in / group_size]``, ``weight_scale_2`` float32
  per fused shard (a scalar in the checkpoint), the same over the shards
  of a fused layer (else "differs across fused parallel layers").
- vllm/model_executor/parameter.py: ``assert param_data.shape ==
  loaded_weight.shape`` (PerTensorScaleParameter takes a 0-d scalar).
"""
import json
import os
from fnmatch import fnmatch

import pytest

from quantcore import engines
from quantcore.checkpoints import SafetensorsReader

from test_engines_dir import _model_dir

QUANT_ALGOS = ["FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4",
               "MXFP8", "MIXED_PRECISION"]
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _from_config(config):
    """(quant_algo, exclude_modules, group_size) as vLLM's from_config reads."""
    if "quantization" in config:
        q = config["quantization"]
        assert isinstance(q, dict)
        algo, exclude, group = q.get("quant_algo"), q.get("exclude_modules", []), \
            q.get("group_size")
    else:
        assert config.get("quant_method", "").lower().startswith("modelopt")
        algo, exclude, group = config.get("quant_algo"), config.get("ignore", []), \
            config.get("group_size")
    assert algo and str(algo).upper() in QUANT_ALGOS
    assert isinstance(exclude, list)
    assert group is None or isinstance(group, int)
    return str(algo).upper(), exclude, group


def _excluded(prefix, exclude):
    return any(e == prefix or e in prefix or fnmatch(prefix, e) for e in exclude)


def _check(d, weights_in):
    with open(os.path.join(d, "config.json")) as fh:
        cfg = json.load(fh)
    with open(os.path.join(d, "hf_quant_config.json")) as fh:
        hq = json.load(fh)
    algo, exclude, group = _from_config(hq)
    assert _from_config(cfg["quantization_config"])[:2] == (algo, exclude)
    stored = {}
    with SafetensorsReader(os.path.join(d, "model.safetensors")) as r:
        stored = {n: r.info(n) for n in r}
        scale2 = {n: bytes(r.raw(n)) for n in r if n.endswith("weight_scale_2")}
    for name, (o, i) in weights_in.items():
        mod = name[:-len(".weight")]
        if _excluded(mod, exclude) or "embed" in mod:
            assert f"{mod}.weight_scale" not in stored
            continue
        params = {k[len(mod) + 1:]: v for k, v in stored.items() if k.startswith(mod + ".")}
        if algo == "FP8":
            assert params == {"weight": ("F8_E4M3", (o, i)), "weight_scale": ("F32", ()),
                              "input_scale": ("F32", ())}
        elif algo == "FP8_PER_CHANNEL_PER_TOKEN":
            assert params == {"weight": ("F8_E4M3", (o, i)), "weight_scale": ("F32", (o,))}
        else:
            assert algo == "W4A16_NVFP4" and group == 16 and i % 16 == 0
            assert params == {"weight": ("U8", (o, i // 2)),
                              "weight_scale": ("F8_E4M3", (o, i // group)),
                              "weight_scale_2": ("F32", ())}
    for n in [n for n in weights_in if n.endswith("q_proj.weight")]:
        base = n[:-len("q_proj.weight")]
        for shards in FUSED.values():
            parent = base if shards[0] == "q_proj" else base.replace("self_attn", "mlp")
            assert len({_excluded(parent + s, exclude) for s in shards}) == 1, parent
            if algo == "W4A16_NVFP4":
                assert len({scale2[f"{parent}{s}.weight_scale_2"] for s in shards}) == 1


@pytest.mark.parametrize("scheme", ["FP8", "FP8_PER_CHANNEL_PER_TOKEN", "W4A16_NVFP4"])
def test_modelopt_output_follows_vllms_loader_rules(tmp_path, scheme):
    src = _model_dir(tmp_path / "src", hidden=64)
    with SafetensorsReader(src / "model.safetensors") as r:
        weights = {n: r.info(n)[1] for n in r if len(r.info(n)[1]) == 2}
    amax = {n[:-len(".weight")]: 3.0 for n in weights} if scheme == "FP8" else None
    engines.quantize_model(src, tmp_path / "out", scheme, fmt="modelopt", input_amax=amax)
    _check(tmp_path / "out", weights)
    weights["model.layers.0.self_attn.q_proj.weight"] = (64, 32)  # the checker is not vacuous
    with pytest.raises(AssertionError):
        _check(tmp_path / "out", weights)


def test_nvfp4_width_not_multiple_of_16_refused_naming_the_layer(tmp_path):
    src = _model_dir(tmp_path / "src", hidden=40)
    with pytest.raises(ValueError, match=r"layer 'model\.layers\.0\.self_attn\.q_proj': input "
                                         r"width 40 is not a multiple of 16"):
        engines.quantize_model(src, tmp_path / "out", "W4A16_NVFP4", fmt="modelopt")
    assert not os.path.exists(tmp_path / "out")
