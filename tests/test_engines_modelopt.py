"""quantcore.engines' ModelOpt layout, checked against the live producer:
nvidia-modelopt 0.47.0's own ``mtq.quantize`` + ``export_hf_checkpoint``
on tiny transformers models (Llama, Qwen3, a Mixtral-like MoE, a Gemma
with tied embeddings; the same weights): every tensor's bytes, dtype and
shape, ``hf_quant_config.json`` and config.json's ``quantization_config``
(ModelOpt's own ``convert_hf_quant_config_format`` of ours), and the
excluded modules under vLLM's matching rule; the numerics under
hypothesis against ModelOpt's ``to_quantized_weight`` / ``NVFP4QTensor``
in F32 / F16 / BF16.  transformers 5.24 has no modelopt quantizer (it
warns and loads the packed weights as plain ones), so the read-back check
is ModelOpt's own dequantize against ``quantcore dequantize``."""
import json
import os
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    mtq = pytest.importorskip("modelopt.torch.quantization")
    from modelopt.torch.export import export_hf_checkpoint  # noqa: E402
    from modelopt.torch.export.convert_hf_config import convert_hf_quant_config_format  # noqa
    from modelopt.torch.export.quant_utils import to_quantized_weight  # noqa: E402
    from modelopt.torch.quantization.qtensor import FP8QTensor, NVFP4QTensor  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from quantcore import engines  # noqa: E402
from quantcore.engines import compressed_tensors as CT  # noqa: E402
from quantcore.engines import modelopt as MO  # noqa: E402
from quantcore.engines.hf import ModelDirError  # noqa: E402
from tiny_models import tiny_model  # noqa: E402

TORCH_DT = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
ORACLE = {"FP8": "FP8_DEFAULT_CFG", "FP8_PER_CHANNEL_PER_TOKEN": "FP8_PER_CHANNEL_PER_TOKEN_CFG",
          "W4A16_NVFP4": "W4A16_NVFP4_CFG"}
def modelopt_export(model, scheme, path):
    """ModelOpt's own export of ``model`` (quantized in place; one
    calibration batch), and {module: input amax} of its input quantizers."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(1)
        batch = torch.randint(0, 128, (1, 8))
        mtq.quantize(model, getattr(mtq, ORACLE[scheme]), lambda m: m(batch))
        amax = {n: float(m.input_quantizer.amax) for n, m in model.named_modules()
                if getattr(getattr(m, "input_quantizer", None), "amax", None) is not None
                and m.input_quantizer.is_enabled}
        export_hf_checkpoint(model, dtype=torch.bfloat16, export_dir=path)
    return amax


def _raw(t):
    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.dim() else \
        t.reshape(1).view(torch.uint8).numpy().tobytes()


def vllm_excluded(prefix, exclude):
    """vLLM's ModelOptQuantConfigBase.is_layer_excluded (vllm/model_executor/
    layers/quantization/modelopt.py): exact, substring, then fnmatch."""
    from fnmatch import fnmatch
    return any(e == prefix or e in prefix or fnmatch(prefix, e) for e in exclude)


@pytest.mark.parametrize("kind,scheme", [
    ("llama", "FP8_PER_CHANNEL_PER_TOKEN"), ("qwen3", "FP8"), ("qwen3", "W4A16_NVFP4"),
    ("mixtral", "W4A16_NVFP4"), ("gemma", "W4A16_NVFP4")])
def test_bytes_and_config_as_modelopt_exports(tmp_path, kind, scheme):
    model = tiny_model(kind, tmp_path / "src")
    amax = modelopt_export(model, scheme, tmp_path / "ref")
    rep = engines.quantize_model(tmp_path / "src", tmp_path / "out", scheme, fmt="modelopt",
                                 input_amax=amax if scheme == "FP8" else None)
    ref = load_file(tmp_path / "ref" / "model.safetensors")
    out = load_file(tmp_path / "out" / "model.safetensors")
    assert sorted(out) == sorted(ref)
    for n, t in ref.items():
        assert (out[n].dtype, tuple(out[n].shape)) == (t.dtype, tuple(t.shape)), n
        assert _raw(out[n]) == _raw(t), n
    with open(tmp_path / "ref" / "hf_quant_config.json") as fh:
        ref_hq = json.load(fh)
    with open(tmp_path / "out" / "hf_quant_config.json") as fh:
        hq = json.load(fh)
    ref_ex, ex = ref_hq["quantization"].pop("exclude_modules"), hq["quantization"].pop(
        "exclude_modules")
    assert hq == ref_hq
    # the same layers left alone under vLLM's rule (ModelOpt lists the
    # embeddings of some architectures only; an excluded embedding is no-op)
    quantized = {CT.module_of(n) for n in rep["quantized"]}
    assert all(not vllm_excluded(m, ex) for m in quantized)
    assert all(vllm_excluded(m, ex) for m in ref_ex)
    with open(tmp_path / "out" / "config.json") as fh:
        cfg = json.load(fh)
    hq["quantization"]["exclude_modules"] = ex
    assert cfg["quantization_config"] == convert_hf_quant_config_format(hq)


def test_moe_router_left_alone_and_w1_w3_share_scale(tmp_path):
    tiny_model("mixtral", tmp_path / "src")
    rep = engines.quantize_model(tmp_path / "src", tmp_path / "out", "W4A16_NVFP4",
                                 fmt="modelopt")
    out = load_file(tmp_path / "out" / "model.safetensors")
    p = "model.layers.0.block_sparse_moe."
    assert out[p + "gate.weight"].dtype == torch.bfloat16 and p + "gate" in rep["ignore"]
    for e in range(4):
        w1, w3 = (out[f"{p}experts.{e}.{w}.weight_scale_2"] for w in ("w1", "w3"))
        assert torch.equal(w1, w3)
    assert not torch.equal(out[p + "experts.0.w1.weight_scale_2"],
                           out[p + "experts.1.w1.weight_scale_2"])


def _weights(draw_dt, rows, cols, data):
    x = np.asarray(data, np.float32).reshape(rows, cols)
    return CT.round_to(x, draw_dt)


_vals = st.floats(-1e3, 1e3, allow_nan=False, width=32) | st.sampled_from(
    [0.0, -0.0, 1e-6, -3e-5, 448.0, 2.5, -0.75])


@settings(max_examples=40, deadline=None)
@given(dt=st.sampled_from(["F32", "F16", "BF16"]), scheme=st.sampled_from(list(ORACLE)),
       data=st.lists(_vals, min_size=64, max_size=64))
def test_numerics_match_modelopt(dt, scheme, data):
    x = _weights(dt, 2, 32, data)
    w = torch.from_numpy(x).to(TORCH_DT[dt])
    if scheme == "W4A16_NVFP4":
        a = MO._absmax(x)
        if a == 0:
            return
        g = MO.global_scale(a, "w")
        assert g == (torch.tensor(a).float() / 2688.0).item()  # get_weights_scaling_factor_2
        s, _ = NVFP4QTensor.get_weights_scaling_factor(w, 16, torch.tensor(g))
        ref = to_quantized_weight(w, s, "w4a16_nvfp4", torch.tensor(g), 16)
        packed, scodes = MO.nvfp4(x, g)
        assert np.array_equal(packed, ref.numpy()) and np.array_equal(scodes, _u8(s))
        y = NVFP4QTensor(w.shape, w.dtype, ref).dequantize(
            scale=s, double_scale=torch.tensor(g), block_sizes={-1: 16})
        got = MO.dequantize_module(_getter({"weight": ("U8", packed), "weight_scale": (
            "F8_E4M3", scodes), "weight_scale_2": ("F32", np.float32(g).reshape(()))}), "m", dt)
        assert np.array_equal(got[1], y.float().numpy())
        return
    if scheme == "FP8":
        if not np.any(x):
            return
        q, s = MO.fp8_tensor(x, dt)
        sref = torch.tensor(float(MO._absmax(x)) / 448.0)  # _export_quantized_weight
        assert s == sref.item()
        ref = to_quantized_weight(w, sref, "fp8")
    else:
        q, s = MO.fp8_channel(x, dt)
        amax = w.abs().amax(dim=1)
        amax = torch.where(amax == 0, torch.full_like(amax, 448.0), amax).clamp(
            min=torch.finfo(w.dtype).tiny)
        sref = amax.float() / 448.0
        assert np.array_equal(s, sref.numpy())
        ref = to_quantized_weight(w, sref, "fp8_pc_pt")
    assert np.array_equal(q, _u8(ref))
    y = FP8QTensor(w.shape, w.dtype, ref).dequantize(
        scale=sref if sref.dim() == 0 else sref[:, None])
    got = MO.dequantize_module(_getter({"weight": ("F8_E4M3", q), "weight_scale": (
        "F32", np.asarray(s, np.float32))}), "m", dt)
    assert np.array_equal(got[1], y.float().numpy())


_wide = st.floats(-2.0 ** 127, 2.0 ** 127, width=32) | st.sampled_from(
    [0.0, -0.0, 1e-30, -1e-38, 6e-8, 448.0, -2.5, 0.75, 1.25])


@settings(max_examples=60, deadline=None)
@given(scheme=st.sampled_from(list(ORACLE)), data=st.lists(_wide, min_size=128, max_size=128),
       g_scale=st.sampled_from([1.0, 1e-3, 1e3]), zero_block=st.integers(-1, 7))
def test_stored_bf16_bits_give_the_float32_bytes(scheme, data, g_scale, zero_block):
    """The loops over a BF16 weight's stored bits (the directory writer's
    input) give the bytes of the same weight's float32 values; W4A16_NVFP4's
    also those of ``formats.nvfp4_quantize``'s modelopt recipe (its one
    statement), with a set scale off the weight's own (blocks clamped at
    2**-9 and at 448; an all-zero block: its scale 1)."""
    x = _weights("BF16", 2, 64, data)
    if zero_block >= 0:
        x.reshape(-1, 16)[zero_block] = 0
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)
    a_set = float(MO._absmax(x)) * g_scale
    if a_set == 0 or a_set > float(np.finfo(np.float32).max):
        return
    g = MO.global_scale(a_set, "w")
    kw = {"g": g} if scheme == "W4A16_NVFP4" else {"in_amax": 3.0} if scheme == "FP8" else {}
    ref = MO.quantize_tensor(x, "BF16", scheme, "m.weight", **kw)
    got = MO.quantize_tensor(bits, "BF16", scheme, "m.weight", **kw)
    assert ref.keys() == got.keys()
    for k in ref:
        assert np.array_equal(ref[k], got[k]) and ref[k].dtype == got[k].dtype, k
    if scheme == "W4A16_NVFP4":
        from quantcore import formats as F
        packed, scodes, _ = F.nvfp4_quantize(x, global_scale=g, recipe="modelopt")
        assert np.array_equal(got["weight"], packed)
        assert np.array_equal(got["weight_scale"], scodes)


def _u8(t):
    return t.contiguous().view(torch.uint8).numpy()


def _getter(parts):
    def get(name):
        k = name.rpartition(".")[2]
        if k not in parts:
            return None
        dt, a = parts[k]
        a = np.ascontiguousarray(a)
        return dt, a.shape, a.reshape(-1).view(np.uint8)
    return get


def test_refusals_name_the_layer(tmp_path):
    tiny_model("llama", tmp_path / "src")
    with pytest.raises(ValueError, match="input amax of 7 layer"):
        engines.quantize_model(tmp_path / "src", tmp_path / "o1", "FP8", fmt="modelopt")
    with pytest.raises(ValueError, match="modelopt takes one of"):
        engines.quantize_model(tmp_path / "src", tmp_path / "o2", "NVFP4A16", fmt="modelopt")
    with pytest.raises(ValueError, match="input amax applies to modelopt FP8"):
        engines.quantize_model(tmp_path / "src", tmp_path / "o3", "W4A16_NVFP4", fmt="modelopt",
                               input_amax={})
    assert not os.path.exists(tmp_path / "o1")
    with open(tmp_path / "src" / "config.json") as fh:
        cfg = json.load(fh)
    cfg["quantization_config"] = {"quant_method": "gptq"}
    with open(tmp_path / "src" / "config.json", "w") as fh:
        json.dump(cfg, fh)
    with pytest.raises(ModelDirError, match="quant_method is 'gptq'"):
        engines.load_dequantized(tmp_path / "src")


def test_dequantize_reads_modelopt_export(tmp_path):
    """quantcore dequantize of ModelOpt's own export gives ModelOpt's
    dequantized weights (NVFP4QTensor.dequantize in BF16)."""
    from quantcore.cli import main
    model = tiny_model("llama", tmp_path / "src")
    modelopt_export(model, "W4A16_NVFP4", tmp_path / "ref")
    ref = load_file(tmp_path / "ref" / "model.safetensors")
    assert main(["dequantize", str(tmp_path / "ref"), "-o", str(tmp_path / "d.safetensors")]) == 0
    got = load_file(tmp_path / "d.safetensors")
    m = "model.layers.0.self_attn.q_proj"
    w = ref[m + ".weight"]
    y = NVFP4QTensor((w.shape[0], w.shape[1] * 2), torch.bfloat16, w).dequantize(
        scale=ref[m + ".weight_scale"], double_scale=ref[m + ".weight_scale_2"],
        block_sizes={-1: 16})
    assert got[m + ".weight"].dtype == torch.bfloat16
    assert torch.equal(got[m + ".weight"].view(torch.int16), y.view(torch.int16))
