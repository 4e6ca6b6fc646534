"""Engine checkpoints (issue 45): ``quantcore.engines.quantize_model`` of a
Hugging Face directory, end to end (read, quantize, write the shards,
fsync, rename), against copying the same files in one run.

The model: a random Llama in BF16 written once per session under pytest's
temporary folder: hidden 1024, intermediate 2816, 2 layers, vocab 4096
(``model.safetensors`` ~59 MiB, 26 Mi quantized values; as a test,
``--benchmark-disable``: hidden 128, intermediate 384, vocab 256).
Baselines: ``shutil.copyfile`` of every file (the issue's "copying the
same files"), and the same with each file fsync-ed (what the writer's
atomic output does; the quantizer pays it).  Cases: compressed-tensors
FP8_DYNAMIC, NVFP4A16, W4A16, W4A16_ASYM; ModelOpt FP8_PER_CHANNEL_PER_TOKEN,
W4A16_NVFP4.  Each records ``peak_bytes`` (tracemalloc's peak of one extra
untimed run: numpy's buffers included) and ``largest_tensor_bytes``.

Run: ``pytest bench/test_bench_engines.py --benchmark-only``; in CI once
each as a test (nothing asserts a time).
"""
import json
import os
import shutil
import tracemalloc

import numpy as np
import pytest

from benchutil import annotate
from quantcore import engines
from quantcore.checkpoints import SafetensorsWriter

CASES = [("compressed-tensors", "FP8_DYNAMIC"), ("compressed-tensors", "NVFP4A16"),
         ("compressed-tensors", "W4A16"), ("compressed-tensors", "W4A16_ASYM"),
         ("modelopt", "FP8_PER_CHANNEL_PER_TOKEN"), ("modelopt", "W4A16_NVFP4")]


def _entries(hidden, inter, layers, vocab):
    out = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (hidden,)),
                (p + "self_attn.q_proj.weight", (hidden, hidden)),
                (p + "self_attn.k_proj.weight", (hidden // 4, hidden)),
                (p + "self_attn.v_proj.weight", (hidden // 4, hidden)),
                (p + "self_attn.o_proj.weight", (hidden, hidden)),
                (p + "post_attention_layernorm.weight", (hidden,)),
                (p + "mlp.gate_proj.weight", (inter, hidden)),
                (p + "mlp.up_proj.weight", (inter, hidden)),
                (p + "mlp.down_proj.weight", (hidden, inter))]
    return out + [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]


@pytest.fixture(scope="module")
def model(pytestconfig, tmp_path_factory):
    """(directory, values, bytes, largest tensor bytes) of the random Llama."""
    small = pytestconfig.getoption("benchmark_disable")
    hidden, inter, layers, vocab = (128, 384, 2, 256) if small else (1024, 2816, 2, 4096)
    d = tmp_path_factory.mktemp("llama")
    entries = _entries(hidden, inter, layers, vocab)
    rng = np.random.default_rng(0)
    with SafetensorsWriter(d / "model.safetensors", [(n, "BF16", s) for n, s in entries]) as w:
        for n, s in entries:
            x = (rng.standard_normal(s, dtype=np.float32) * 0.02).view(np.uint32)
            w.write(n, (x >> 16).astype(np.uint16))
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "vocab_size": vocab,
        "num_attention_heads": 8, "num_key_value_heads": 2, "torch_dtype": "bfloat16"}))
    (d / "tokenizer_config.json").write_text("{}")
    values = sum(int(np.prod(s)) for _, s in entries)
    return d, values, os.path.getsize(d / "model.safetensors"), \
        2 * max(int(np.prod(s)) for _, s in entries)


def _fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    return (), {}


def _copy(src, dst, fsync):
    os.makedirs(dst)
    for f in sorted(os.listdir(src)):
        shutil.copyfile(os.path.join(src, f), os.path.join(dst, f))
        if fsync:
            fd = os.open(os.path.join(dst, f), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


@pytest.mark.parametrize("fsync", [False, True], ids=["copy", "copy+fsync"])
def test_engines_roofline_copy(benchmark, model, fsync, tmp_path):
    src, values, nbytes, _ = model
    dst = tmp_path / "out"
    annotate(benchmark, "engines_dir", values, "copy+fsync" if fsync else "copy", 2 * nbytes)
    benchmark.pedantic(lambda: _copy(src, dst, fsync), setup=lambda: _fresh(dst), rounds=5)


@pytest.mark.parametrize("case", CASES, ids=[f"{f}-{s}" for f, s in CASES])
def test_engines_quantize(benchmark, model, case, tmp_path):
    fmt, scheme = case
    src, values, nbytes, largest = model
    dst = tmp_path / "out"
    run = lambda: engines.quantize_model(src, dst, scheme, fmt=fmt)  # noqa: E731
    tracemalloc.start()
    out = run()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    annotate(benchmark, "engines_dir", values, f"{fmt} {scheme}", nbytes + out["bytes_out"])
    benchmark.extra_info.update({"peak_bytes": int(peak), "largest_tensor_bytes": largest})
    benchmark.pedantic(run, setup=lambda: _fresh(dst), rounds=3)
