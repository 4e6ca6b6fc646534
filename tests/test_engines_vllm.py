"""vLLM's loader rules for the compressed-tensors schemes quantcore.engines
writes, checked on its output (vLLM itself needs a GPU).  Each rule is
written after the vLLM source it follows (vllm-project/vllm, the v0.10 /
v0.11 line; paths under vllm/model_executor/layers/quantization/):

- compressed_tensors/compressed_tensors.py, ``CompressedTensorsConfig.
  from_config``: reads ``ignore``, ``format``, ``sparsity_config`` and
  ``config_groups`` (each group: ``targets``, ``weights``,
  ``input_activations``, ``format``), the arguments through
  compressed-tensors' ``QuantizationArgs.model_validate``;
  ``_is_fp8_w8a8`` + ``_is_dynamic_token_w8a8``: float 8-bit symmetric
  static weights per tensor / channel / block, symmetric dynamic
  per-token activations -> ``CompressedTensorsW8A8Fp8``;
  ``_is_wNa16_group_channel``: no input activations, static weights per
  channel or group -> ``CompressedTensorsWNA16`` for format
  ``pack-quantized`` with ``num_bits`` in ``WNA16_SUPPORTED_BITS`` (4, 8),
  passing ``symmetric``;
  ``_is_fp4a16_nvfp4``: no input activations, float 4-bit symmetric
  weights, strategy TENSOR_GROUP, group_size 16 -> ``CompressedTensorsW4A16Fp4``;
  ``_is_mxfp4`` (vLLM 0.11+, tested in ``_get_scheme_from_parts`` before
  the WNA16 branch): float 4-bit symmetric weights, strategy GROUP,
  group_size 32 -> ``CompressedTensorsW4A16Mxfp4`` (whatever the
  activations; later versions serve MXFP4's dynamic FP4 activations with
  schemes/compressed_tensors_w4a4_mxfp4.py ``CompressedTensorsW4A4MxFp4``,
  whose ``create_weights`` registers the same two tensors).
- compressed_tensors/utils.py, ``should_ignore_layer``: a layer is skipped
  when its name (or a ``re:`` pattern) is in ``ignore``; the shards of a
  fused layer (q/k/v -> qkv_proj, gate/up -> gate_up_proj) must all be
  ignored or none ("Found a different quantization schemes").
- compressed_tensors/schemes/compressed_tensors_w8a8_fp8.py,
  ``create_weights``: ``weight`` float8_e4m3fn ``[out, in]``;
  CHANNEL: ``weight_scale`` ``[out, 1]`` (ChannelQuantScaleParameter,
  float32: the checkpoint's dtype is converted by ``copy_``); no
  ``input_scale`` when activations are dynamic.
- compressed_tensors/schemes/compressed_tensors_wNa16.py,
  ``create_weights``: ``weight_packed`` int32 ``[out, in / (32 /
  num_bits)]`` (PackedvLLMParameter, packed_dim 1), ``weight_scale``
  ``[out, in / group_size]`` in the model dtype (GroupQuantScaleParameter),
  ``weight_shape`` int64 ``[2]``; ``weight_zero_point`` only when
  asymmetric; utils/marlin_utils.py ``MARLIN_SUPPORTED_GROUP_SIZES``
  (-1, 32, 64, 128) and ``check_marlin_supports_shape`` (in % group == 0).
  Asymmetric (vLLM 0.11+): ``num_bits`` in ``WNA16_ZP_SUPPORTED_TYPES_MAP``
  (4: uint4, 8: uint8), ``weight_packed`` int32 ``[out, ceil(in *
  num_bits / 32)]``, ``weight_zero_point`` int32 ``[ceil(out * num_bits /
  32), in / group_size]`` (PackedvLLMParameter, packed_dim 0): a fused
  layer's shards are placed at ``shard offset / pack_factor`` along it, so
  each shard's ``out`` is a multiple of ``32 / num_bits``.
- compressed_tensors/schemes/compressed_tensors_w4a16_mxfp4.py,
  ``create_weights``: ``weight_packed`` uint8 ``[out, in / 2]``
  (ModelWeightParameter), ``weight_scale`` uint8 ``[out, in / 32]`` (the
  E8M0 exponents, GroupQuantScaleParameter); no global scale, no
  ``weight_shape``.
- compressed_tensors/schemes/compressed_tensors_w4a16_nvfp4.py,
  ``create_weights``: ``weight_packed`` uint8 ``[out, in / 2]``,
  ``weight_global_scale`` float32, one per fused shard
  (PerTensorScaleParameter, ``[1]`` in the checkpoint), ``weight_scale``
  float8_e4m3fn ``[out, in / 16]``; ``process_weights_after_loading``
  takes ``weight_global_scale.max()`` over a fused layer's shards, so
  siblings must hold the same value.
- vllm/model_executor/parameter.py (``BasevLLMParameter`` loaders):
  ``assert param_data.shape == loaded_weight.shape``; a checkpoint key
  with no parameter is a KeyError in the model's ``load_weights``.
"""
import json
import os

import pytest

from quantcore import engines
from quantcore.checkpoints import SafetensorsReader

ct = pytest.importorskip("compressed_tensors")
from compressed_tensors.quantization import QuantizationArgs  # noqa: E402

from test_engines_dir import _model_dir  # noqa: E402

FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
MODEL_DTYPES = ("F32", "F16", "BF16")


def _stored(d):
    out = {}
    for f in os.listdir(d):
        if f.endswith(".safetensors"):
            with SafetensorsReader(os.path.join(d, f)) as r:
                out.update({n: r.info(n) for n in r})
    return out


def _raw(d):
    out = {}
    for f in os.listdir(d):
        if f.endswith(".safetensors"):
            with SafetensorsReader(os.path.join(d, f)) as r:
                out.update({n: bytes(r.raw(n)) for n in r if n.endswith("global_scale")})
    return out


def _vllm_scheme(group):
    """The vLLM scheme class a config group selects, by its rules."""
    w = QuantizationArgs.model_validate(group["weights"])
    a = group.get("input_activations")
    a = QuantizationArgs.model_validate(a) if a is not None else None
    if w.type == "float" and w.num_bits == 8 and a is not None:
        assert w.symmetric and not w.dynamic and w.strategy in ("tensor", "channel", "block")
        assert a.type == "float" and a.num_bits == 8 and a.symmetric and a.dynamic is True
        assert a.strategy in ("tensor", "token")
        return "W8A8Fp8", w
    if a is None and w.type == "float" and w.num_bits == 4 and w.strategy == "tensor_group":
        assert w.symmetric and w.group_size == 16
        assert group.get("format") == "nvfp4-pack-quantized"
        return "W4A16Fp4", w
    if w.type == "float" and w.num_bits == 4 and w.strategy == "group":
        assert w.symmetric and w.group_size == 32
        assert group.get("format") == "mxfp4-pack-quantized"
        if a is not None:   # MXFP4: FP4 activations, quantized at run time
            assert a.type == "float" and a.num_bits == 4 and a.strategy == "group"
            assert a.group_size == 32 and a.dynamic is True and a.symmetric
        return "W4A16Mxfp4", w
    if a is None and not w.dynamic and w.strategy in ("channel", "group"):
        assert group.get("format") == "pack-quantized" and w.type == "int"
        assert w.num_bits in (4, 8)   # WNA16_SUPPORTED_BITS and WNA16_ZP_SUPPORTED_TYPES_MAP
        assert w.strategy == "channel" or w.group_size in (32, 64, 128)
        return "WNA16", w
    raise AssertionError(f"no vLLM scheme for {group}")


def _check_directory(d, weights_in):
    """Every rule above on one output directory; ``weights_in``: the input's
    2-D weights {name: shape}."""
    cfg = json.loads(open(os.path.join(d, "config.json")).read())
    q = cfg["quantization_config"]
    assert q["quant_method"] == "compressed-tensors"
    assert isinstance(q["ignore"], list) and q["sparsity_config"] == {}
    assert q["format"] in ("float-quantized", "pack-quantized", "nvfp4-pack-quantized",
                           "mxfp4-pack-quantized")
    (group,) = q["config_groups"].values()
    assert group["targets"] == ["Linear"]
    kind, w = _vllm_scheme(group)
    stored = _stored(d)
    blobs = _raw(d)
    ignore = set(q["ignore"])
    for name, (o, i) in weights_in.items():
        mod = name[:-len(".weight")]
        if "embed" in mod:
            continue  # an Embedding, not a Linear target
        if mod in ignore:
            assert f"{mod}.weight_scale" not in stored
            continue
        params = {k[len(mod) + 1:]: v for k, v in stored.items() if k.startswith(mod + ".")}
        if kind == "W8A8Fp8":
            assert params == {"weight": ("F8_E4M3", (o, i)),
                              "weight_scale": (params["weight_scale"][0], (o, 1))}
        elif kind == "W4A16Fp4":
            assert i % 16 == 0
            assert params == {"weight_packed": ("U8", (o, i // 2)),
                              "weight_scale": ("F8_E4M3", (o, i // 16)),
                              "weight_global_scale": ("F32", (1,))}
            continue
        elif kind == "W4A16Mxfp4":
            assert i % 32 == 0
            assert params == {"weight_packed": ("U8", (o, i // 2)),
                              "weight_scale": ("U8", (o, i // 32))}
            continue
        else:
            assert i % w.group_size == 0
            want = {"weight_packed": ("I32", (o, -(-i * w.num_bits // 32))),
                    "weight_scale": (params["weight_scale"][0], (o, i // w.group_size)),
                    "weight_shape": ("I64", (2,))}
            if not w.symmetric:
                assert o % (32 // w.num_bits) == 0   # the packed_dim-0 shard offsets
                want["weight_zero_point"] = ("I32", (o * w.num_bits // 32, i // w.group_size))
            assert params == want
        assert params["weight_scale"][0] in MODEL_DTYPES
    for n in [n for n in weights_in if n.endswith("q_proj.weight")]:  # fused siblings agree
        base = n[:-len("q_proj.weight")]
        for names in FUSED:
            parent = base if names[0] == "q_proj" else base.replace("self_attn", "mlp")
            flags = {f"{parent}{s}" in ignore for s in names}
            assert len(flags) == 1, parent
            if kind == "W4A16Fp4":
                scales = {blobs[f"{parent}{s}.weight_global_scale"] for s in names}
                assert len(scales) == 1, parent


@pytest.mark.parametrize("scheme, group", [("FP8_DYNAMIC", None), ("W4A16", 32),
                                           ("W4A16", 128), ("NVFP4A16", None),
                                           ("W8A16", 64), ("W4A16_ASYM", 128),
                                           ("MXFP4A16", None), ("MXFP4", None)])
def test_output_follows_vllms_loader_rules(tmp_path, scheme, group):
    src = _model_dir(tmp_path / "src", hidden=128)
    with SafetensorsReader(src / "model.safetensors") as r:
        weights = {n: r.info(n)[1] for n in r if len(r.info(n)[1]) == 2}
    engines.quantize_model(src, tmp_path / "out", scheme, group_size=group,
                           max_shard_size="100KB")
    _check_directory(tmp_path / "out", weights)


@pytest.mark.parametrize("scheme, group", [("FP8_DYNAMIC", None), ("W4A16_ASYM", 32),
                                           ("MXFP4A16", None)])
def test_the_checker_catches_a_broken_layout(tmp_path, scheme, group):
    """The checker is not vacuous: a layer whose stored tensors do not
    have the shapes its weight demands fails it, in each layout family."""
    src = _model_dir(tmp_path / "src")
    with SafetensorsReader(src / "model.safetensors") as r:
        weights = {n: r.info(n)[1] for n in r if len(r.info(n)[1]) == 2}
    engines.quantize_model(src, tmp_path / "out", scheme, group_size=group)
    weights["model.layers.0.self_attn.q_proj.weight"] = (64, 32)
    with pytest.raises(AssertionError):
        _check_directory(tmp_path / "out", weights)
