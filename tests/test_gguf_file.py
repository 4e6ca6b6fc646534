"""GGUF files from a Hugging Face directory (issue 39, files part):
quantcore.engines.gguf_file against llama.cpp's own converter
(convert_hf_to_gguf.py of the llama-cpp-python 0.3.36 sdist, run by
tests/ggml_oracle.convert_hf: the whole files' bytes), the mixes' type
tables against llama-quant.cpp's rules (written out below from the source),
each quantized tensor against gguf_quantize of the converter's F32 tensor,
dequantize, and bad input."""
import os
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
torch = pytest.importorskip("torch")

from quantcore.checkpoints import SafetensorsReader  # noqa: E402
from quantcore.cli import main  # noqa: E402
from quantcore.engines import gguf_file as GF  # noqa: E402
from quantcore.gguf import gguf_dequantize, gguf_quantize, mixes  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import ggml_oracle  # noqa: E402

#: the tiny tokenizer's probe hash is no released model's: named for both sides
PRE = "qwen2"


def _spm_tokenizer(path):
    """A SentencePiece tokenizer as Llama 2 / Mistral ship one: tokenizer.model
    (a BPE with byte fallback, trained here: fewer pieces than the config's
    300 ids, so the rest are padding), added_tokens.json and
    tokenizer_config.json's added_tokens_decoder (a special token, a
    special-looking one, a user-defined one with U+2581, an id past the
    vocabulary)."""
    import json

    import sentencepiece as spm
    os.makedirs(path, exist_ok=True)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(["hello world the quick brown fox jumps over the lazy dog"] * 50),
        model_prefix=os.path.join(path, "sp"), vocab_size=290, model_type="bpe",
        byte_fallback=True, hard_vocab_limit=False, minloglevel=2,
        user_defined_symbols=["<|user|>"], control_symbols=["<ctrl>"])
    os.replace(os.path.join(path, "sp.model"), os.path.join(path, "tokenizer.model"))
    os.remove(os.path.join(path, "sp.vocab"))
    with open(os.path.join(path, "added_tokens.json"), "w") as fh:
        json.dump({"<extra_a>": 296, "<too_far>": 400}, fh)
    decoder = {"0": {"content": "<unk>", "special": True},
               "1": {"content": "<s>", "special": True},
               "2": {"content": "</s>", "special": True},
               "297": {"content": "<|im_end|>", "special": False},
               "298": {"content": "\u2581hi\u2581there", "special": False},
               "500": {"content": "<far>", "special": True}}
    with open(os.path.join(path, "tokenizer_config.json"), "w") as fh:
        json.dump({"added_tokens_decoder": decoder, "bos_token": "<s>", "eos_token": "</s>",
                   "add_bos_token": True, "add_eos_token": False}, fh)


def _tiny(kind, path, hidden=256, layers=2, tie=False):
    """A random transformers model saved with a byte-level BPE tokenizer
    (``llama_spm``: a Llama with a SentencePiece one)."""
    from tokenizers import decoders, models, pre_tokenizers, trainers
    if kind == "llama_spm":
        _spm_tokenizer(path)
        return _tiny_weights("llama", path, hidden, layers, tie)
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=290, special_tokens=["<|endoftext|>", "<|im_start|>",
                                                             "<|im_end|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             show_progress=False)
    tok.train_from_iterator(["hello world the quick brown fox jumps over the lazy dog"] * 50, tr)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                         eos_token="<|im_end|>").save_pretrained(path)
    return _tiny_weights(kind, path, hidden, layers, tie)


def _tiny_weights(kind, path, hidden, layers, tie):
    """The random model of :func:`_tiny`, saved (BF16, N(0, 0.5))."""
    torch.manual_seed(0)
    common = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
                  max_position_embeddings=64, tie_word_embeddings=tie)
    if kind == "qwen3":
        cfg, cls = (transformers.Qwen3Config(head_dim=hidden // 4, **common),
                    transformers.Qwen3ForCausalLM)
    elif kind == "qwen2":  # (q / k / v biases)
        cfg, cls = transformers.Qwen2Config(**common), transformers.Qwen2ForCausalLM
    else:
        cfg, cls = transformers.LlamaConfig(**common), transformers.LlamaForCausalLM
    cfg.architectures = [cls.__name__]
    model = cls(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf_models")
    return {k: _tiny(k, root / k) for k in ("llama", "qwen3", "qwen2", "llama_spm")}


@pytest.fixture(scope="module")
def converted(models, tmp_path_factory):
    """{(model, outtype): path} of the converter's files (skip without the sdist)."""
    root = tmp_path_factory.mktemp("gguf_converted")
    try:
        ggml_oracle.converter_dir()
    except Exception:
        if os.environ.get("QC_REQUIRE_ORACLES") == "1":
            raise
        pytest.skip("llama.cpp's converter (llama-cpp-python sdist) not available")
    out = {(kind, t): str(root / f"{kind}_{t}.gguf") for kind in models
           for t in (("f32", "f16", "q8_0") if kind in ("llama", "qwen3") else ("q8_0",))}
    ggml_oracle.convert_hf([(models[k], t, f) for (k, t), f in out.items()], tokenizer_pre=PRE)
    return out


@pytest.mark.parametrize("kind,outtype", [(k, t) for k in ("llama", "qwen3")
                                           for t in ("f32", "f16", "q8_0")] +
                         [("qwen2", "q8_0"), ("llama_spm", "q8_0")])
def test_file_equals_converter(models, converted, kind, outtype, tmp_path):
    """The whole file, bytes for bytes: key/values and their order, tensor
    names, order, shapes, types, data (Llama's q / k permuted)."""
    ours = tmp_path / "ours.gguf"
    rep = GF.write_gguf(models[kind], ours, outtype.upper(), tokenizer_pre=PRE)
    ref = open(converted[(kind, outtype)], "rb").read()
    got = ours.read_bytes()
    if got != ref:  # say where
        a, b = gguf.GGUFReader(converted[(kind, outtype)]), gguf.GGUFReader(ours)
        assert list(a.fields) == list(b.fields)
        assert [(t.name, t.tensor_type.name) for t in a.tensors] == \
            [(t.name, t.tensor_type.name) for t in b.tensors]
    assert got == ref
    assert rep["bytes_out"] == len(ref)


# llama-quant.cpp's rules written out for an 8-layer model (use_more_bits(i, 8):
# i < 1 or i >= 7 or (i - 1) % 3 == 2 -> layers 0, 3, 6, 7; llama_tensor_get_type_impl
# lines 490-505 (output), 589-593 (attn_v), 630-647 (ffn_down); Q4_K_S: attn_v < 4,
# ffn_down < n/8)
_MORE = {0, 3, 6, 7}
_TABLE = {
    "Q4_K_M": lambda cat, i: "Q6_K" if cat in ("attn_v", "ffn_down") and i in _MORE else "Q4_K",
    "Q5_K_M": lambda cat, i: "Q6_K" if cat in ("attn_v", "ffn_down") and i in _MORE else "Q5_K",
    "Q4_K_S": lambda cat, i: ("Q5_K" if (cat == "attn_v" and i < 4) or
                              (cat == "ffn_down" and i < 1) else "Q4_K"),
    "Q6_K": lambda cat, i: "Q6_K",
    "Q8_0": lambda cat, i: "Q8_0",
}
_BLOCK = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _tensors(n_layer, row=256, tied=False):
    t = [("token_embd.weight", (300, row)), ("output_norm.weight", (row,))]
    if not tied:
        t.append(("output.weight", (300, row)))
    for i in range(n_layer):
        t += [(f"blk.{i}.{k}.weight", (row, row)) for k in _BLOCK]
        t += [(f"blk.{i}.attn_norm.weight", (row,)), (f"blk.{i}.ffn_norm.weight", (row,))]
    return t


@pytest.mark.parametrize("mix", list(_TABLE))
def test_mix_types_table(mix):
    cfg = {"num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2}
    got = mixes.tensor_types("llama", _tensors(8), mix, cfg)
    want = {"token_embd.weight": mixes.DEFAULT_TYPES[mix], "output_norm.weight": "F32",
            "output.weight": "Q8_0" if mix == "Q8_0" else "Q6_K"}
    for i in range(8):
        want.update({f"blk.{i}.{k}.weight": _TABLE[mix](k, i) for k in _BLOCK})
        want.update({f"blk.{i}.attn_norm.weight": "F32", f"blk.{i}.ffn_norm.weight": "F32"})
    assert got == want
    # tied embeddings: token_embd takes output's rule (line 490)
    tied = mixes.tensor_types("llama", _tensors(8, tied=True), mix, cfg)
    assert tied["token_embd.weight"] == want["output.weight"]


def test_mix_fallbacks_and_70b():
    """tensor_type_fallback (lines 390-444): a row of 64 is no multiple of
    256: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, output Q8_0 (line 496);
    a row of 48 neither of 32: F16.  LLM_TYPE_70B (line 1456: llama, 80
    layers, GQA): attn_v left at Q4_K becomes Q5_K (line 593)."""
    cfg = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    for mix, fb in (("Q4_K_S", "Q5_0"), ("Q5_K_M", "Q5_1"), ("Q6_K", "Q8_0")):
        got = mixes.tensor_types("llama", _tensors(2, row=64), mix, cfg)
        assert got["blk.0.attn_q.weight"] == fb
        assert got["output.weight"] == "Q8_0"
        assert mixes.tensor_types("llama", _tensors(2, row=48), mix,
                                  cfg)["blk.0.attn_q.weight"] == "F16"
    cfg80 = {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8}
    t = _tensors(80, row=256)
    got = mixes.tensor_types("llama", t, "Q4_K_M", cfg80)
    # (use_more_bits(20, 80) is false: 20 >= 10, 20 < 70, (20 - 10) % 3 == 1)
    assert got["blk.20.attn_v.weight"] == "Q5_K" and got["blk.20.attn_q.weight"] == "Q4_K"
    assert got["blk.1.attn_v.weight"] == "Q6_K"
    assert mixes.tensor_types("qwen2", t, "Q4_K_M", cfg80)["blk.20.attn_v.weight"] == "Q4_K"
    assert mixes.quantize_order(["blk.10.a", "output.weight", "blk.2.b", "blk.2.a"]) == \
        ["output.weight", "blk.2.a", "blk.2.b", "blk.10.a"]


def _f32_tensors(path):
    r = gguf.GGUFReader(path)
    return {t.name: np.array(t.data, np.float32).reshape(
        [int(n) for n in reversed([int(x) for x in t.shape])]) for t in r.tensors}


@pytest.mark.parametrize("kind,mix", [("llama", "Q4_K_M"), ("qwen3", "Q4_K_S"),
                                      ("llama", "Q5_K_M"), ("qwen3", "Q6_K")])
def test_mix_bytes(models, converted, kind, mix, tmp_path):
    """Each tensor's bytes == gguf_quantize of the converter's F32 tensor
    with the type of the table; the key/values are the F32 file's with
    general.quantization_version and general.file_type moved last
    (llama-quant.cpp 1024-1026), the tensors in weights_map order."""
    ours = tmp_path / "mix.gguf"
    rep = GF.write_gguf(models[kind], ours, mix, tokenizer_pre=PRE)
    src = _f32_tensors(converted[(kind, "f32")])
    f32 = gguf.GGUFReader(converted[(kind, "f32")])
    r = gguf.GGUFReader(ours)
    assert [t.name for t in r.tensors] == mixes.quantize_order(list(src))
    cfg = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    table = mixes.tensor_types(kind, [(n, a.shape) for n, a in src.items()], mix, cfg)
    assert rep["tensors"] == table
    for t in r.tensors:
        assert t.tensor_type.name == table[t.name]
        if table[t.name] == "F32":
            assert np.array_equal(np.array(t.data), src[t.name].reshape(t.data.shape))
        else:
            assert bytes(t.data) == gguf_quantize(src[t.name], table[t.name]), t.name
    keys = [k for k in f32.fields if not k.startswith("GGUF.")]
    moved = ["general.quantization_version", "general.file_type"]
    assert [k for k in r.fields if not k.startswith("GGUF.")] == \
        [k for k in keys if k not in moved] + moved
    assert r.fields["general.file_type"].contents() == GF.FILE_TYPES[mix]
    for k in keys:
        if k not in moved:
            assert r.fields[k].contents() == f32.fields[k].contents(), k


def test_small_rows_fall_back(tmp_path):
    """hidden 64: every K-quant falls back as llama-quantize does; the file
    reads back (dequantize) to the fallback types' values."""
    d = _tiny("qwen3", tmp_path / "small", hidden=64)
    out = tmp_path / "small.gguf"
    rep = GF.write_gguf(d, out, "Q4_K_M", tokenizer_pre=PRE)
    assert rep["tensors"]["blk.0.attn_q.weight"] == "Q5_0"
    assert rep["tensors"]["output.weight"] == "Q8_0"
    tensors, kv = GF.read_gguf(out)
    assert kv["general.architecture"] == "qwen3"
    with SafetensorsReader(os.path.join(d, "model.safetensors")) as r:
        w = r.float32("model.layers.0.self_attn.q_proj.weight")
    q = gguf_quantize(w, "Q5_0")
    assert np.array_equal(tensors["blk.0.attn_q.weight"], gguf_dequantize(q, "Q5_0", w.shape))


def _cli(capsys, *args):
    """(exit status, stderr) of ``quantcore ARGS`` run in this process."""
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


def test_cli_quantize_and_dequantize(models, tmp_path, capsys):
    out = tmp_path / "m.gguf"
    code, err = _cli(capsys, "quantize", models["llama"], "--format", "gguf", "--type",
                     "Q8_0", "--tokenizer-pre", PRE, "-o", out)
    assert code == 0, err
    ref = tmp_path / "ref.gguf"
    GF.write_gguf(models["llama"], ref, "Q8_0", tokenizer_pre=PRE)
    assert out.read_bytes() == ref.read_bytes()
    back = tmp_path / "back.safetensors"
    code, err = _cli(capsys, "dequantize", out, "-o", back)
    assert code == 0, err
    r = gguf.GGUFReader(out)
    with SafetensorsReader(back) as sr:
        for t in r.tensors:
            a = sr.float32(t.name)
            if t.tensor_type.name == "Q8_0":
                assert np.array_equal(a.reshape(-1, a.shape[-1]), gguf_dequantize(
                    bytes(t.data), "Q8_0", (a.size // a.shape[-1], a.shape[-1])))
            else:
                assert np.array_equal(a.ravel(), np.array(t.data, np.float32).ravel())
    # bad input on the command line: type not in the table, --type without gguf
    code, err = _cli(capsys, "quantize", models["llama"], "--format", "gguf", "--type",
                     "Q3_K_L", "-o", out)
    assert code == 2 and "Q3_K_L" in err
    code, err = _cli(capsys, "quantize", models["llama"], "--type", "Q8_0", "-o",
                     tmp_path / "x")
    assert code == 2 and "--format gguf only" in err
    code, err = _cli(capsys, "quantize", models["llama"], "--format", "gguf", "-o",
                     tmp_path / "x.safetensors")
    assert code == 2 and ".gguf" in err


def test_bad_input(models, tmp_path):
    d = models["llama"]
    with pytest.raises(GF.GGUFFileError, match="Q3_K_L"):
        GF.write_gguf(d, tmp_path / "a.gguf", "Q3_K_L")
    with pytest.raises(GF.GGUFFileError, match="BPE pre-tokenizer"):
        GF.write_gguf(d, tmp_path / "a.gguf", "F16")
    with pytest.raises(ValueError, match="is the input file"):
        GF.write_gguf(d, os.path.join(d, "model.safetensors"), "F16", tokenizer_pre=PRE)
    # an architecture not supported, named
    import json
    import shutil
    other = tmp_path / "gpt2"
    shutil.copytree(d, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(GF.GGUFFileError, match="GPT2LMHeadModel"):
        GF.write_gguf(other, tmp_path / "a.gguf", "F16", tokenizer_pre=PRE)
    assert sorted(os.listdir(tmp_path)) == ["gpt2"]
    # a failure while writing leaves nothing behind (nor a previous file changed)
    (tmp_path / "b.gguf").write_bytes(b"old")
    orig = GF._tensor

    def boom(*a):
        raise OSError(28, "No space left on device")
    GF._tensor = boom
    try:
        with pytest.raises(OSError):
            GF.write_gguf(d, tmp_path / "b.gguf", "Q4_K_M", tokenizer_pre=PRE)
    finally:
        GF._tensor = orig
    assert sorted(os.listdir(tmp_path)) == ["b.gguf", "gpt2"]
    assert (tmp_path / "b.gguf").read_bytes() == b"old"


def test_bad_tokenizers(models, tmp_path, monkeypatch):
    """A tokenizer the converter would read another way, or cannot: a clear
    error naming the directory and what to do, and no file written."""
    import json
    import shutil
    spm_dir, bpe_dir = tmp_path / "spm", tmp_path / "bpe"
    shutil.copytree(models["llama_spm"], spm_dir)
    shutil.copytree(models["llama"], bpe_dir)
    out = tmp_path / "out"
    out.mkdir()
    # a corrupt tokenizer.model
    (spm_dir / "tokenizer.model").write_bytes(b"not a sentencepiece model")
    with pytest.raises(GF.GGUFFileError, match="tokenizer.model is not a SentencePiece model"):
        GF.write_gguf(spm_dir, out / "a.gguf", "Q8_0")
    # without the sentencepiece package
    monkeypatch.setitem(sys.modules, "sentencepiece", None)
    with pytest.raises(GF.GGUFFileError, match="pip install sentencepiece"):
        GF.write_gguf(spm_dir, out / "a.gguf", "Q8_0")
    monkeypatch.undo()
    # a Llama tokenizer.json the converter reads as LlamaHfVocab (byte-fallback BPE)
    tj = json.loads((bpe_dir / "tokenizer.json").read_text())
    tj["model"]["byte_fallback"] = True
    tj["decoder"] = {"type": "Sequence", "decoders": []}
    (bpe_dir / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(GF.GGUFFileError, match="LlamaHfVocab"):
        GF.write_gguf(bpe_dir, out / "a.gguf", "Q8_0", tokenizer_pre=PRE)
    # CodeLlama's vocabulary size (the converter's special FIM tokens)
    cfg = json.loads((bpe_dir / "config.json").read_text())
    cfg["vocab_size"] = 32016
    (bpe_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(GF.GGUFFileError, match="32016"):
        GF.write_gguf(bpe_dir, out / "a.gguf", "Q8_0", tokenizer_pre=PRE)
    # neither tokenizer
    (bpe_dir / "tokenizer.json").unlink()
    with pytest.raises(GF.GGUFFileError, match="neither tokenizer.model nor tokenizer.json"):
        GF.write_gguf(_copy_without(models["qwen3"], tmp_path), out / "a.gguf", "Q8_0",
                      tokenizer_pre=PRE)
    assert os.listdir(out) == []


def _copy_without(src, tmp_path, name="tokenizer.json"):
    import shutil
    dst = tmp_path / "no_tokenizer"
    shutil.copytree(src, dst)
    (dst / name).unlink()
    return dst


def test_malformed_gguf(models, tmp_path, capsys):
    good = tmp_path / "good.gguf"
    GF.write_gguf(models["qwen3"], good, "Q8_0", tokenizer_pre=PRE)
    data = good.read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUX" + data[4:])
    with pytest.raises(GF.GGUFFileError, match="magic"):
        GF.read_gguf(bad)
    bad.write_bytes(data[:len(data) // 2])
    with pytest.raises(GF.GGUFFileError):
        GF.read_gguf(bad)
    bad.write_bytes(data[:100])
    with pytest.raises(GF.GGUFFileError):
        GF.read_gguf(bad)
    code, err = _cli(capsys, "dequantize", bad, "-o", tmp_path / "x.safetensors")
    assert code == 2 and "bad.gguf" in err


def test_mix_types_recorded():
    """quantcore.gguf.mixes == llama.cpp's own llama_quant_compute_types
    (llama-quant.cpp compiled from the sdist by tests/llama_quant_types.py,
    recorded in tests/data/gguf_mix_types.json): 3 architectures x 10
    shapes (fallback rows, tied embeddings, the 70B rule, 2-80 layers) x 5
    mixes, every tensor."""
    import json
    import llama_quant_types as LQ
    with open(LQ.OUT, encoding="utf-8") as fh:
        table = json.load(fh)["table"]
    assert len(table) == len(LQ.ARCHS) * len(LQ.CONFIGS) * len(LQ.FTYPES)
    for row in table:
        nl, _, _, nh, nkv, _ = row["config"]
        t = LQ.tensors(*row["config"])
        got = mixes.tensor_types(row["arch"], t, row["mix"], {
            "num_hidden_layers": nl, "num_attention_heads": nh, "num_key_value_heads": nkv})
        order = mixes.quantize_order([n for n, _ in t])
        assert " ".join(got[n] for n in order) == row["types"], (row["arch"], row["config"],
                                                                  row["mix"])


# ------------------------------------------------------------------ imatrix files
def _write_legacy_imatrix(path, entries, chunks=None, dataset=None):
    """llama-imatrix's legacy binary (common/imatrix-loader.cpp's reader):
    entries [(name, ncall, float32 sums)], then the optional trailer."""
    import struct
    out = [struct.pack("<i", len(entries))]
    for name, ncall, sums in entries:
        b = name.encode()
        out += [struct.pack("<i", len(b)), b, struct.pack("<ii", ncall, len(sums)),
                np.asarray(sums, "<f4").tobytes()]
    if chunks is not None:
        out.append(struct.pack("<i", chunks))
        d = (dataset or "").encode()
        out += [struct.pack("<i", len(d)), d]
    path.write_bytes(b"".join(out))


def _write_gguf_imatrix(path, entries, meta=True, chunk_count=7, datasets=("wiki.train",)):
    """The current format: W.in_sum2 (n_mat rows of ne0) and W.counts F32
    tensors, imatrix.* keys (tools/imatrix/imatrix.cpp's layout)."""
    w = gguf.GGUFWriter(str(path), arch="llama")
    if meta:
        w.add_array("imatrix.datasets", list(datasets))
        w.add_uint32("imatrix.chunk_count", chunk_count)
        w.add_uint32("imatrix.chunk_size", 512)
    for name, sums, counts in entries:
        if sums is not None:
            w.add_tensor(name + ".in_sum2", np.asarray(sums, np.float32))
        if counts is not None:
            w.add_tensor(name + ".counts", np.asarray(counts, np.float32).reshape(-1, 1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_imatrix_files_read_as_llama_quantize(tmp_path):
    """Both formats, normalised as tools/quantize/quantize.cpp load_imatrix:
    legacy sums / ncall (ncall 0: as stored), GGUF sums / lround(count) per
    expert row (count 0: weights 1); the trailer's chunk count and dataset;
    the keys written to the output; bad files refused naming the field."""
    from quantcore.gguf.imatrix import ImatrixError, read_imatrix
    rng = np.random.default_rng(0)
    a, b = (rng.random(8).astype(np.float32) * 50 for _ in range(2))
    leg = tmp_path / "im.dat"
    _write_legacy_imatrix(leg, [("blk.0.attn_q.weight", 3, a), ("blk.0.ffn_up.weight", 0, b)],
                          chunks=11, dataset="calib.txt")
    im = read_imatrix(leg)
    assert im.legacy and im.chunk_count == 11 and im.datasets == ["calib.txt"]
    assert np.array_equal(im.entries["blk.0.attn_q.weight"], a / np.float32(3))
    assert np.array_equal(im.entries["blk.0.ffn_up.weight"], b)
    assert im.keys() == [("quantize.imatrix.file", str(leg), "str"),
                         ("quantize.imatrix.dataset", "calib.txt", "str"),
                         ("quantize.imatrix.entries_count", 2, "u32"),
                         ("quantize.imatrix.chunks_count", 11, "u32")]
    _write_legacy_imatrix(leg, [("x.weight", 2, a)])  # no trailer
    assert read_imatrix(leg).chunk_count == 0 and read_imatrix(leg).keys()[-1][0] == \
        "quantize.imatrix.entries_count"
    g = tmp_path / "im.gguf"
    sums = rng.random((3, 8)).astype(np.float32) * 100
    _write_gguf_imatrix(g, [("blk.0.ffn_down.weight", sums, [2.5, 0.0, 4.0])])
    im = read_imatrix(g)
    assert not im.legacy and im.chunk_count == 7 and im.datasets == ["wiki.train"]
    want = np.concatenate([sums[0] / np.float32(3), np.ones(8, np.float32),
                           sums[2] / np.float32(4)])  # lround(2.5) = 3
    assert np.array_equal(im.entries["blk.0.ffn_down.weight"], want)
    assert im.for_tensor("blk.0.ffn_down.weight", 8, n_expert=3) is im.entries[
        "blk.0.ffn_down.weight"]
    with pytest.raises(ImatrixError, match=r"'blk.0.ffn_down.weight' has 24 values, the tensor "
                                           r"needs 8"):
        im.for_tensor("blk.0.ffn_down.weight", 8)
    assert im.for_tensor("blk.9.ffn_down.weight", 8) is None
    for entries, meta, match in (
            ([("w", sums[0], None)], True, "'w' has sums only"),
            ([("w", None, [1.0])], True, "'w' has counts only"),
            ([("w", sums[0], [1.0])], False, "missing imatrix metadata imatrix.datasets"),
            ([("w", np.array([1, np.inf] * 4, np.float32), [1.0])], True, "'w' holds a "
             "non-finite")):
        _write_gguf_imatrix(g, entries, meta=meta)
        with pytest.raises(ImatrixError, match=match):
            read_imatrix(g)
    leg.write_bytes(leg.read_bytes()[:30])
    with pytest.raises(ImatrixError, match="ends inside the 8 values of entry 'x.weight'"):
        read_imatrix(leg)
    leg.write_bytes(b"\0\0\0\0")
    with pytest.raises(ImatrixError, match="no data"):
        read_imatrix(leg)
    with pytest.raises(ImatrixError, match="cannot read"):
        read_imatrix(tmp_path / "absent.dat")


@pytest.mark.parametrize("fmt", ["legacy", "gguf"])
def test_mix_with_imatrix(models, converted, fmt, tmp_path, capsys):
    """Q4_K_M with an imatrix file: each quantized weight with an entry has
    ggml's own bytes for its imatrix weights (the oracle: quantize_<type> of
    ggml-quants.c), one without an entry the plain bytes; the file's keys as
    llama-quantize's overrides, after general.file_type; the command line."""
    src = _f32_tensors(converted[("llama", "f32")])
    rng = np.random.default_rng(1)
    names = [n for n, a in src.items() if a.ndim == 2 and not n.startswith("token_embd")]
    skipped = "blk.1.ffn_up.weight"
    raw = {n: rng.random(src[n].shape[-1]).astype(np.float32) * 20 for n in names
           if n != skipped}
    path = tmp_path / ("im.dat" if fmt == "legacy" else "im.gguf")
    if fmt == "legacy":
        _write_legacy_imatrix(path, [(n, 4, s) for n, s in raw.items()], chunks=5,
                              dataset="d.txt")
    else:
        _write_gguf_imatrix(path, [(n, s, [4.0]) for n, s in raw.items()], chunk_count=5,
                            datasets=("d.txt",))
    weights = {n: s / np.float32(4) for n, s in raw.items()}  # (ncall 4 / count 4)
    out = tmp_path / "m.gguf"
    rep = GF.write_gguf(models["llama"], out, "Q4_K_M", tokenizer_pre=PRE, imatrix=str(path))
    r = gguf.GGUFReader(out)
    oracle = ggml_oracle.get()
    checked = 0
    for t in r.tensors:
        typ = t.tensor_type.name
        if typ in ("F32", "F16"):
            continue
        qw = weights.get(t.name)
        assert bytes(t.data) == gguf_quantize(src[t.name], typ, imatrix=qw), t.name
        if qw is not None and oracle is not None and checked < 4:
            assert bytes(t.data) == oracle.quantize(typ, src[t.name], qw,
                                                    GF.gguf_row_bytes(typ, qw.size)), t.name
            checked += 1
    assert skipped not in rep["imatrix"] and set(rep["imatrix"]) == {
        n for n in weights if rep["tensors"][n] not in ("F32", "F16")}
    assert bytes(r.get_tensor(list(rep["tensors"]).index(skipped)).data) == gguf_quantize(
        src[skipped], rep["tensors"][skipped])
    keys = [k for k in r.fields if not k.startswith("GGUF.")]
    assert keys[-5:] == ["general.file_type", "quantize.imatrix.file",
                         "quantize.imatrix.dataset", "quantize.imatrix.entries_count",
                         "quantize.imatrix.chunks_count"]
    assert r.fields["quantize.imatrix.file"].contents() == str(path)
    assert r.fields["quantize.imatrix.entries_count"].contents() == len(raw)
    assert r.fields["quantize.imatrix.chunks_count"].contents() == 5
    # the command line: the same file; --imatrix refused where it cannot apply
    cli_out = tmp_path / "cli.gguf"
    code, err = _cli(capsys, "quantize", models["llama"], "--format", "gguf", "--type",
                     "Q4_K_M", "--imatrix", path, "--tokenizer-pre", PRE, "-o", cli_out)
    assert code == 0, err
    assert cli_out.read_bytes() == out.read_bytes()
    code, err = _cli(capsys, "quantize", models["llama"], "--format", "gguf", "--type",
                     "F16", "--imatrix", path, "--tokenizer-pre", PRE, "-o", tmp_path / "f.gguf")
    assert code == 2 and "takes no importance matrix" in err
    code, err = _cli(capsys, "quantize", models["llama"], "--imatrix", path, "-o",
                     tmp_path / "x.safetensors")
    assert code == 2 and "--format gguf only" in err
    # an entry of another length: refused naming it, nothing written
    bad = tmp_path / "bad.dat"
    _write_legacy_imatrix(bad, [("blk.0.attn_q.weight", 1, np.ones(5, np.float32))])
    with pytest.raises(ValueError, match="'blk.0.attn_q.weight' has 5 values"):
        GF.write_gguf(models["llama"], tmp_path / "n.gguf", "Q4_K_M", tokenizer_pre=PRE,
                      imatrix=str(bad))
    assert not (tmp_path / "n.gguf").exists()
