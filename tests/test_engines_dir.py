"""quantcore.engines' model directories: the shards and index
(transformers' layout, loaded back by it), the command line, the output
built beside its path and renamed at the end, and the refusals (the
output is the input, a malformed config / index / shard named with its
field, a layer whose shape the scheme refuses)."""
import json
import os

import numpy as np
import pytest

from quantcore import engines
from quantcore.checkpoints import SafetensorsReader, SafetensorsWriter
from quantcore.cli import main
from quantcore.engines import compressed_tensors as CT
from quantcore.engines.hf import ModelDirError, parse_size


def _model_dir(path, hidden=64, layers=2, dtype="BF16", seed=0):
    """A Llama-shaped directory written without torch: config.json, one
    model.safetensors, a tokenizer file (float32 values of dtype)."""
    rng = np.random.default_rng(seed)
    names = [("model.embed_tokens.weight", (128, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        names += [(p + "input_layernorm.weight", (hidden,))]
        names += [(p + f"self_attn.{k}_proj.weight", (hidden, hidden)) for k in "qkvo"]
        names += [(p + f"mlp.{k}_proj.weight", (2 * hidden, hidden)) for k in ("gate", "up")]
        names += [(p + "mlp.down_proj.weight", (hidden, 2 * hidden))]
    names += [("model.norm.weight", (hidden,)), ("lm_head.weight", (128, hidden))]
    os.makedirs(path, exist_ok=True)
    with SafetensorsWriter(os.path.join(path, "model.safetensors"),
                           [(n, dtype, s) for n, s in names], {"format": "pt"}) as w:
        for n, s in names:
            w.write(n, CT.as_dtype_bytes(CT.round_to(rng.standard_normal(s).astype(np.float32),
                                                     dtype), dtype))
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, fh)
    with open(os.path.join(path, "tokenizer.json"), "w") as fh:
        fh.write('{"tokens": []}')
    return path


def _tensors(d):
    """{name: raw bytes} over a directory's shards."""
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with SafetensorsReader(os.path.join(d, f)) as r:
                out.update({n: (r.info(n), bytes(r.raw(n))) for n in r})
    return out


def test_shards_and_index_hold_the_same_tensors(tmp_path):
    src = _model_dir(tmp_path / "src")
    one = engines.quantize_model(src, tmp_path / "one", "FP8_DYNAMIC")
    many = engines.quantize_model(src, tmp_path / "many", "FP8_DYNAMIC",
                                  max_shard_size="40KB")
    assert one["shards"] == ["model.safetensors"] and len(many["shards"]) > 2
    assert many["shards"][0] == f"model-00001-of-{len(many['shards']):05d}.safetensors"
    assert _tensors(tmp_path / "one") == _tensors(tmp_path / "many")
    index = json.loads((tmp_path / "many" / "model.safetensors.index.json").read_text())
    stored = _tensors(tmp_path / "many")
    assert set(index["weight_map"]) == set(stored)
    assert index["metadata"]["total_size"] == sum(len(b) for _, b in stored.values())
    for f in many["shards"]:  # each shard at most the limit (no tensor here is larger)
        assert os.path.getsize(tmp_path / "many" / f) < 40_000 + 4096
    # a module's weight and scale stay in one shard
    wm = index["weight_map"]
    assert all(wm[n] == wm[n.replace("weight_scale", "weight")] for n in wm
               if n.endswith("weight_scale"))
    assert (tmp_path / "many" / "tokenizer.json").read_text() == '{"tokens": []}'
    # the sharded directory is read as input too
    again = engines.quantize_model(_model_dir(tmp_path / "src2"), tmp_path / "x", "W4A16",
                                   group_size=32)
    assert again["shards"] == ["model.safetensors"]


def test_sharded_output_loads_in_transformers(tmp_path):
    pytest.importorskip("compressed_tensors")
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=128, tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path / "src")
    rep = engines.quantize_model(tmp_path / "src", tmp_path / "out", max_shard_size="30KB")
    assert len(rep["shards"]) > 1 and rep["ignore"] == ["lm_head"]  # tied: no lm_head tensor
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 6)
    sd = model.state_dict()
    for n, (dt, y) in engines.load_dequantized(tmp_path / "out").items():
        if y.dtype == np.float32:
            assert np.array_equal(sd[n].float().numpy(), y), n


def test_command_line_quantize_and_dequantize(tmp_path, capsys):
    src = _model_dir(tmp_path / "src", dtype="F16")
    assert main(["quantize", str(src), "-o", str(tmp_path / "out"), "--max-shard-size",
                 "50KB"]) == 0
    text = capsys.readouterr().out
    assert "FP8_DYNAMIC" in text and "ignore" in text
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["quantization_config"]["format"] == "float-quantized"
    assert main(["dequantize", str(tmp_path / "out"), "-o", str(tmp_path / "d.safetensors")]) == 0
    back = engines.load_dequantized(tmp_path / "out")
    with SafetensorsReader(tmp_path / "d.safetensors") as r:
        for n, (dt, y) in back.items():
            assert r.info(n)[0] == dt
            if y.dtype == np.float32:
                assert np.array_equal(r.float32(n), y)
            else:
                assert bytes(r.raw(n)) == y.tobytes()
    assert main(["quantize", str(src), "-o", str(tmp_path / "w4"), "--scheme", "W4A16",
                 "--group-size", "64"]) == 0
    cfg = json.loads((tmp_path / "w4" / "config.json").read_text())["quantization_config"]
    assert cfg["config_groups"]["group_0"]["weights"]["group_size"] == 64


@pytest.mark.parametrize("argv, msg", [
    (["--recipe", "awq"], "--recipe applies to a .safetensors file"),
    (["--format", "int4"], "--format must be one of"),
    (["--scheme", "W4A16", "--group-size", "48"], "group size 48 is not one vLLM's WNA16 "
                                                  "kernels take (32, 64, 128"),
    (["--scheme", "MXFP4A16", "--group-size", "32"], "group size applies to the integer group "
                                                     "schemes, not MXFP4A16"),
    (["--max-shard-size", "lots"], "max shard size 'lots'"),
])
def test_command_line_refusals(tmp_path, capsys, argv, msg):
    src = _model_dir(tmp_path / "src")
    assert main(["quantize", str(src), "-o", str(tmp_path / "out"), *argv]) != 0
    assert msg in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "out")
    assert os.listdir(tmp_path) == ["src"]


@pytest.mark.parametrize("scheme, group, msg", [
    ("W4A16", 64, "96 is not a multiple of the group size 64"),
    ("W8A16", 64, "96 is not a multiple of the group size 64"),
    ("W4A16_ASYM", 64, "96 is not a multiple of the group size 64"),
    ("MXFP4A16", None, "96 is not a multiple of 32 .MXFP4's group."),
])
def test_a_layer_the_groups_do_not_fit_is_refused_by_name(tmp_path, scheme, group, msg):
    src = _model_dir(tmp_path / "src", hidden=96 if scheme != "MXFP4A16" else 48)
    msg = msg.replace("96", "48") if scheme == "MXFP4A16" else msg
    with pytest.raises(ValueError, match="layer 'model.layers.0.self_attn.q_proj': input width "
                                         + msg):
        engines.quantize_model(src, tmp_path / "out", scheme, group_size=group)
    assert os.listdir(tmp_path) == ["src"]


@pytest.mark.parametrize("scheme", ["W8A16", "W4A16_ASYM", "MXFP4A16"])
def test_nan_or_inf_weights_are_refused_by_name(tmp_path, scheme):
    src = _model_dir(tmp_path / "src")
    path = src / "model.safetensors"
    with SafetensorsReader(path) as r:
        tensors = {n: (r.info(n), bytearray(r.raw(n))) for n in r}
    bad = "model.layers.1.mlp.up_proj.weight"
    tensors[bad][1][6:8] = bytes([0x80, 0x7F])  # element 3: BF16 +inf
    os.unlink(path)
    with SafetensorsWriter(path, [(n, dt, sh) for n, ((dt, sh), _) in tensors.items()]) as w:
        for n, (_, b) in tensors.items():
            w.write_bytes(n, bytes(b))
    with pytest.raises(ValueError, match=f"tensor {bad!r} holds NaN or inf"):
        engines.quantize_model(src, tmp_path / "out", scheme,
                               group_size=32 if scheme != "MXFP4A16" else None)
    assert os.listdir(tmp_path) == ["src"]


def test_nvfp4_width_not_a_multiple_of_16_is_refused_by_name(tmp_path):
    src = _model_dir(tmp_path / "src", hidden=72)
    with pytest.raises(ValueError, match="layer 'model.layers.0.self_attn.q_proj': input width "
                                         "72 is not a multiple of 16"):
        engines.quantize_model(src, tmp_path / "out", "NVFP4A16")
    assert os.listdir(tmp_path) == ["src"]


def test_fused_sets():
    names = [f"model.layers.0.self_attn.{k}_proj.weight" for k in "qkvo"] + \
        ["model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.down_proj.weight",
         "model.layers.1.block_sparse_moe.experts.0.w1.weight",
         "model.layers.1.block_sparse_moe.experts.0.w3.weight"]
    sets = CT.fused_sets(names)
    qkv = tuple(names[:3])
    assert sets[names[0]] == sets[names[2]] == qkv and names[3] not in sets
    assert names[4] not in sets    # gate_proj without its up_proj: alone
    assert sets[names[6]] == (names[6], names[7])


def test_device_gpu_refused_where_the_gpu_path_cannot_run(tmp_path, capsys):
    import quantcore_gpu
    if quantcore_gpu.can_use()[0]:
        pytest.skip("a GPU path runs here (tests/test_gpu_engines.py covers device='gpu')")
    src = _model_dir(tmp_path / "src")
    assert main(["quantize", str(src), "-o", str(tmp_path / "out"), "--device", "gpu"]) != 0
    assert "device 'gpu': the GPU path cannot run here" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["src"]
    with pytest.raises(ValueError, match="device 'tpu': expected one of"):
        engines.quantize_model(src, tmp_path / "out", device="tpu")
    assert main(["quantize", str(src), "-o", str(tmp_path / "m.gguf"), "--format", "gguf",
                 "--device", "gpu"]) != 0
    assert "device 'gpu': the GPU path cannot run here" in capsys.readouterr().err


def test_file_options_refused_for_a_file(tmp_path, capsys):
    src = _model_dir(tmp_path / "src")
    assert main(["quantize", str(src / "model.safetensors"), "-o", str(tmp_path / "q.safetensors"),
                 "--scheme", "W4A16"]) != 0
    assert "--scheme applies to a model directory" in capsys.readouterr().err
    assert main(["quantize", str(src / "model.safetensors"), "-o", str(tmp_path / "q.safetensors"),
                 "--device", "gpu"]) != 0
    assert "--device applies to a model directory" in capsys.readouterr().err


def test_output_is_not_the_input_and_not_a_full_directory(tmp_path):
    src = _model_dir(tmp_path / "src")
    with pytest.raises(ValueError, match="is the input directory"):
        engines.quantize_model(src, src)
    with pytest.raises(ValueError, match="inside the input directory"):
        engines.quantize_model(src, src / "sub")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(FileExistsError):
        engines.quantize_model(src, tmp_path / "full")
    (tmp_path / "empty").mkdir()
    engines.quantize_model(src, tmp_path / "empty")
    assert "model.safetensors" in os.listdir(tmp_path / "empty")


def test_an_interrupted_run_leaves_nothing(tmp_path, monkeypatch):
    src = _model_dir(tmp_path / "src")
    calls = []

    def failing(*args):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*args)
    real = CT.quantize_tensor
    monkeypatch.setattr(CT, "quantize_tensor", failing)
    with pytest.raises(KeyboardInterrupt):
        engines.quantize_model(src, tmp_path / "out", max_shard_size="20KB")
    assert sorted(os.listdir(tmp_path)) == ["src"]


@pytest.mark.parametrize("break_it, msg", [
    (lambda d: (d / "config.json").write_text("{nope"), "config.json: config.json is not JSON"),
    (lambda d: (d / "config.json").write_text(json.dumps(
        {"quantization_config": {"quant_method": "fp8"}})), "quantization_config is already"),
    (lambda d: (d / "model.safetensors").write_bytes(b"\x01"), "not a safetensors file"),
    (lambda d: (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "../x.safetensors"}})), "weight_map['a']"),
    (lambda d: (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}})),
     "field 'weight_map'"),
    (lambda d: (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.norm.weight": "other.safetensors"}})), "is missing"),
])
def test_malformed_directories_are_named(tmp_path, break_it, msg):
    src = _model_dir(tmp_path / "src")
    break_it(src)
    with pytest.raises(ModelDirError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        engines.quantize_model(src, tmp_path / "out")
    assert not os.path.exists(tmp_path / "out")


def test_parse_size():
    assert parse_size("5GB") == 5 * 10**9 and parse_size("2MiB") == 2 * 2**20
    assert parse_size(1000) == 1000 and parse_size("1.5KB") == 1500
    with pytest.raises(ValueError, match="at least 1 byte"):
        parse_size(0)


def test_dequantize_refuses_what_it_cannot_read(tmp_path):
    """A pack-quantized weight of a bit width other than 4 and 8 (here 2:
    4 words a row for 64 inputs) is refused, not decoded as int4."""
    src = _model_dir(tmp_path / "src")
    engines.quantize_model(src, tmp_path / "out", "W4A16", group_size=32)
    m = "model.layers.0.self_attn.q_proj"
    path = tmp_path / "out" / "model.safetensors"
    with SafetensorsReader(path) as r:
        tensors = {n: (r.info(n), bytes(r.raw(n))) for n in r}
    tensors[f"{m}.weight_packed"] = (("I32", (64, 4)), bytes(64 * 4 * 4))
    os.unlink(path)
    with SafetensorsWriter(path, [(n, dt, sh) for n, ((dt, sh), _) in tensors.items()]) as w:
        for n, (_, b) in tensors.items():
            w.write_bytes(n, b)
    with pytest.raises(ValueError, match=f"{m}.weight_packed: 4 words a row for 64 inputs: "
                                         "only int4 and int8"):
        engines.load_dequantized(tmp_path / "out")

