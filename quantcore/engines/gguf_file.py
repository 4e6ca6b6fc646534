"""A GGUF file from a Hugging Face model directory, as llama.cpp's converter
(``convert_hf_to_gguf.py``) and ``llama-quantize`` write it (issue 39).

    quantcore quantize MODEL_DIR --format gguf --type Q4_K_M -o model.gguf

:func:`write_gguf` reproduces the vendored converter of llama.cpp 0c1e57098bba
(llama-cpp-python 0.3.36's ``vendor/llama.cpp/conversion/base.py``,
``llama.py``, ``qwen.py``) for the Llama, Qwen2 and Qwen3 families: the
same key/values in the same order (``general.*`` from gguf-py's
``Metadata.load``, the architecture's hyper-parameters as
``TextModel.set_gguf_parameters`` writes them, the GPT-2 BPE tokenizer of
``tokenizer.json`` as ``_set_vocab_gpt2`` reads it through transformers'
``AutoTokenizer`` and gguf-py's ``SpecialVocab``), the same tensor names
(gguf-py's ``get_tensor_name_map``), order (the shards' order), shapes and
values (Llama's q / k rows permuted as ``LlamaModel.permute``).  Types:
``F32`` / ``F16`` / ``Q8_0`` as the converter's ``--outtype``; the mixes
``Q4_K_M``, ``Q4_K_S``, ``Q5_K_M``, ``Q6_K`` choose each tensor's type as
``llama-quantize`` does (:mod:`quantcore.gguf.mixes`) and quantize the
float32 weights the converter's F32 file holds with
:func:`quantcore.gguf.gguf_quantize` (ggml's bytes).

Needs gguf-py (``pip install gguf``) and transformers (the tokenizer), as
the converter does.  Streamed: tensor infos first, then one tensor at a
time read, converted and written; the file appears at its path only when
complete (:func:`quantcore._files.atomic_path`).
"""
import hashlib
import json
import os
import time

import numpy as np

from .. import _files
from ..gguf import GGUF_TYPES, gguf_quantize, gguf_row_bytes
from ..gguf import mixes as _mixes
from ..gguf.imatrix import Imatrix, read_imatrix
from .hf import HFModel

__all__ = ["write_gguf", "read_gguf", "ARCHITECTURES", "FILE_TYPES", "GGUFFileError"]

#: HF ``architectures[0]`` -> (gguf architecture, converter class): the families
#: supported (conversion/llama.py LlamaModel, conversion/qwen.py Qwen2Model /
#: Qwen3Model)
ARCHITECTURES = {
    "LlamaForCausalLM": ("llama", "LlamaModel"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2Model"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3Model"),
}

#: --type -> llama_ftype (gguf-py LlamaFileType; llama.h) written as general.file_type
FILE_TYPES = {"F32": 0, "F16": 1, "Q8_0": 7, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_M": 17,
              "Q6_K": 18}

#: --type values that are llama-quantize mixes (the rest: the converter's --outtype)
MIXES = tuple(m for m in _mixes.MIXES if m != "Q8_0")  # (Q8_0: the converter's, same types)

#: the converter's pre-tokenizer probe (conversion/base.py get_vocab_base_pre, line 1635)
CHKTXT = '\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български \'\'\'\'\'\'```````""""......!!!!!!?????? I\'ve been \'told he\'s there, \'RE you sure? \'M not sure I\'ll make it, \'D you like some tea? We\'Ve a\'lL'  # noqa: E501
#: sha256 of str(tokenizer.encode(CHKTXT)) -> tokenizer.ggml.pre, the Llama / Qwen entries of
#: get_vocab_base_pre (conversion/base.py lines 1690, 1714, 1759)
PRE_TOKENIZERS = {
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",
}


class GGUFFileError(ValueError):
    """A model directory or a GGUF file that cannot be converted / read,
    naming the field."""


def _gguf():
    try:
        import gguf
    except ImportError:
        raise GGUFFileError("--format gguf needs gguf-py: pip install gguf (or the extra "
                            "[gguf])") from None
    return gguf


def _hparam(cfg, keys):
    """The converter's ``find_hparam(keys, optional=True)``: the first key present."""
    for k in keys:
        if k in cfg:
            return cfg[k]
    return None


def _permute(w, n_head, n_head_kv):
    """conversion/llama.py ``LlamaModel.permute``: the rows of each head
    reordered from HF's rotate-half layout to ggml's interleaved pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _check_config(path, cfg):
    archs = cfg.get("architectures")
    hf_arch = archs[0] if isinstance(archs, list) and archs else None
    if hf_arch not in ARCHITECTURES:
        raise GGUFFileError(f"{path}: config.json architectures[0] is {hf_arch!r}: --format gguf "
                            f"supports {sorted(ARCHITECTURES)}")
    rope = cfg.get("rope_parameters", cfg.get("rope_scaling")) or {}
    rope_type = rope.get("rope_type", rope.get("type"))
    if rope_type not in (None, "default"):
        raise GGUFFileError(f"{path}: config.json rope_scaling / rope_parameters rope_type "
                            f"{rope_type!r} is not supported (only the default rope)")
    if _hparam(cfg, ["num_local_experts", "num_experts"]) is not None:
        raise GGUFFileError(f"{path}: config.json num_experts: mixture-of-experts models are "
                            "not supported")
    for f in ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size"):
        if not isinstance(cfg.get(f), int) or cfg[f] <= 0:
            raise GGUFFileError(f"{path}: config.json field {f!r} must be a positive integer, "
                                f"got {cfg.get(f)!r}")
    return hf_arch


def _plan(model, hf_arch, gg, type):
    """[(hf name, gguf name, numpy shape, ggml type name)] in the converter's
    order (conversion/base.py prepare_tensors: 1-D and ``*_norm.weight``
    F32, the rest the --outtype; Q8_0 on a row not a multiple of 32 falls
    back to F16 as its QuantError handler)."""
    arch = ARCHITECTURES[hf_arch][0]
    n_layers = model.config["num_hidden_layers"]
    tmap = gg.get_tensor_name_map(getattr(gg.MODEL_ARCH, arch.upper()), n_layers)
    plan = []
    for name in model.names:
        if name.endswith((".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")):
            continue
        new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise GGUFFileError(f"{model.path}: tensor {name!r} has no GGUF name for "
                                f"architecture {arch}")
        dt, shape = model.info(name)
        if not model.reader(name).is_float(name):
            raise GGUFFileError(f"{model.path}: tensor {name!r} is {dt}, not a float tensor")
        shape = tuple(shape)
        if len(shape) <= 1 or new.endswith("_norm.weight") or not new.endswith(".weight"):
            t = "F32"
        elif type in ("F32", "F16"):
            t = type
        elif type == "Q8_0":
            t = "Q8_0" if shape[-1] % 32 == 0 else "F16"
        else:
            t = None  # chosen by the mix below
        plan.append([name, new, shape, t])
    if type in MIXES:  # llama-quantize on the converter's F32 file: its order and types
        types = _mixes.tensor_types(arch, [(n, s) for _, n, s, _ in plan], type, model.config)
        where = {p[1]: p for p in plan}
        plan = [where[n] for n in _mixes.quantize_order(list(where))]
        for p in plan:
            p[3] = types[p[1]]
    return plan


def _tensor(model, hf_arch, name, t, qw=None, device="cpu"):
    """The tensor as the converter hands it on (float32, or float16 for an F16
    source as torch keeps it), permuted for Llama's q / k, then converted to
    the GGUF type ``t`` (with the importance weights ``qw`` of its imatrix
    entry, or None; quantized on the cupy device for ``device="gpu"``): a
    numpy array GGUFWriter writes as is."""
    cfg = model.config
    w = model.reader(name).float32(name)
    if hf_arch == "LlamaForCausalLM":
        n_head = cfg["num_attention_heads"]
        n_kv = cfg.get("num_key_value_heads")
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            w = _permute(w, n_head, n_head)
        elif name.endswith(("k_proj.weight", "k_proj.bias")):
            w = _permute(w, n_head, n_kv)
    if t == "F32":
        return np.ascontiguousarray(w, np.float32)
    if t == "F16":
        return np.ascontiguousarray(w.astype(np.float16))
    if w.ndim != 2:
        w = w.reshape(-1, w.shape[-1])
    if device == "gpu":
        import cupy
        q = cupy.asnumpy(gguf_quantize(cupy.asarray(w), t, imatrix=qw))
    else:
        q = np.frombuffer(gguf_quantize(np.ascontiguousarray(w), t, imatrix=qw), np.uint8)
    return q.reshape(*w.shape[:-1], gguf_row_bytes(t, w.shape[-1]))


def _vocab_base(dir_model, cfg, gg, tokenizer_pre):
    """conversion/base.py ``get_vocab_base`` (+ ``get_vocab_base_pre``):
    tokens, token types and the pre-tokenizer name."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise GGUFFileError("--format gguf reads the tokenizer with transformers: "
                            "pip install transformers") from None
    tokenizer = AutoTokenizer.from_pretrained(dir_model)
    vocab = tokenizer.vocab
    vocab_size = cfg.get("vocab_size", len(vocab))
    if max(vocab.values()) >= vocab_size:
        raise GGUFFileError(f"{dir_model}: the tokenizer has token id {max(vocab.values())}, "
                            f"config.json vocab_size is {vocab_size}")
    if tokenizer_pre is None:
        chkhsh = hashlib.sha256(str(tokenizer.encode(CHKTXT)).encode()).hexdigest()
        tokenizer_pre = PRE_TOKENIZERS.get(chkhsh)
        if tokenizer_pre is None:
            raise GGUFFileError(f"{dir_model}: the BPE pre-tokenizer (chkhsh {chkhsh}) is not "
                                f"one of {sorted(set(PRE_TOKENIZERS.values()))}; pass "
                                "tokenizer_pre= to name it")
    reverse = {i: t for t, i in vocab.items()}
    added = tokenizer.get_added_vocab()
    decoder = tokenizer.added_tokens_decoder
    tokens, toktypes = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            toktypes.append(gg.TokenType.UNUSED)
            continue
        token = reverse[i]
        if token in added:
            if not decoder[i].normalized:
                token = tokenizer.decode(tokenizer.encode(token, add_special_tokens=False))
            if decoder[i].special or _looks_special(token):
                toktypes.append(gg.TokenType.CONTROL)
            else:
                token = token.replace("\u2581", " ")
                toktypes.append(gg.TokenType.USER_DEFINED)
        else:
            toktypes.append(gg.TokenType.NORMAL)
        tokens.append(token)
    return tokens, toktypes, tokenizer_pre


def _looks_special(t):
    """conversion/base.py ``does_token_look_special``."""
    return (t in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (t.startswith("<|") and t.endswith("|>"))
            or (t.startswith("<\uff5c") and t.endswith("\uff5c>"))
            or (t.startswith("<unused") and t.endswith(">")))


def _set_vocab(w, model, hf_arch, gg, tokenizer_pre):
    """LlamaModel.set_vocab / Qwen2Model.set_vocab: a SentencePiece
    ``tokenizer.model`` when there is one, else a tokenizer.json (GPT-2 BPE)."""
    d = model.path
    cfg = model.config
    if hf_arch == "LlamaForCausalLM":
        if cfg.get("vocab_size") in (32016, 49152):   # CodeLlama's FIM tokens, Granite's BOS
            raise GGUFFileError(f"{d}: vocab_size {cfg['vocab_size']} (CodeLlama / Granite: the "
                                "converter's special cases) is not supported")
        tc = os.path.join(d, "tokenizer_config.json")
        if os.path.isfile(tc):
            with open(tc, encoding="utf-8") as fh:
                tcj = json.load(fh)
            if (aps := tcj.get("add_prefix_space")) is not None:
                w.add_add_space_prefix(aps)
    if os.path.isfile(os.path.join(d, "tokenizer.model")):
        tokens, scores, toktypes = _vocab_sentencepiece(d, cfg, gg)
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(toktypes)
        gg.SpecialVocab(d, n_vocab=len(tokens)).add_to_gguf(w)
        return
    tokenizer_json = os.path.join(d, "tokenizer.json")
    if not os.path.isfile(tokenizer_json):
        raise GGUFFileError(f"{d}: neither tokenizer.model nor tokenizer.json")
    if hf_arch == "LlamaForCausalLM" and _llama_hf_bpe(tokenizer_json):
        raise GGUFFileError(f"{d}: tokenizer.json is a SentencePiece-style BPE (byte fallback) "
                            "without its tokenizer.model; the converter's LlamaHfVocab for it "
                            "is not supported: add the tokenizer.model")
    tokens, toktypes, pre = _vocab_base(d, cfg, gg, tokenizer_pre)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(toktypes)
    gg.SpecialVocab(d, load_merges=True).add_to_gguf(w)


def _llama_hf_bpe(tokenizer_json):
    """Whether the converter's ``LlamaHfVocab`` takes this tokenizer.json
    (gguf-py vocab.py: a BPE with byte fallback and a Sequence decoder;
    Llama 3's ignore_merges BPE, which it refuses, has no byte fallback)."""
    with open(tokenizer_json, encoding="utf-8") as fh:
        tj = json.load(fh)
    m = tj.get("model") or {}
    return (m.get("type") == "BPE" and bool(m.get("byte_fallback", False))
            and (tj.get("decoder") or {}).get("type") == "Sequence")


def _vocab_sentencepiece(d, cfg, gg):
    """conversion/base.py ``_create_vocab_sentencepiece``: (tokens as UTF-8
    bytes, scores, token types) of ``d/tokenizer.model`` over the config's
    vocabulary size (ids past the model's pieces ``[PAD<i>]``, score
    -10000, unused), then the ids of ``added_tokens.json`` (user-defined,
    score -1000) and of tokenizer_config.json's ``added_tokens_decoder``
    (control when special or special-looking, else user-defined with
    U+2581 as a space; score -1000); ids past the vocabulary are ignored."""
    try:
        from sentencepiece import SentencePieceProcessor
    except ImportError:
        raise GGUFFileError(f"{d}: reading tokenizer.model (SentencePiece) needs the "
                            "sentencepiece package: pip install sentencepiece") from None
    sp = SentencePieceProcessor()
    try:
        sp.LoadFromFile(os.path.join(d, "tokenizer.model"))
    except (OSError, RuntimeError) as exc:
        raise GGUFFileError(f"{d}: tokenizer.model is not a SentencePiece model ({exc})") \
            from None
    T = gg.TokenType
    size = _hparam(cfg, ["vocab_size_per_layer_input", "vocab_size"]) or sp.vocab_size()
    tokens = [f"[PAD{i}]".encode() for i in range(size)]
    scores = [-10000.0] * size
    toktypes = [T.UNUSED] * size
    for i in range(min(sp.vocab_size(), size)):
        tokens[i] = sp.IdToPiece(i).encode("utf-8")
        scores[i] = sp.GetScore(i)
        toktypes[i] = (T.UNKNOWN if sp.IsUnknown(i) else T.CONTROL if sp.IsControl(i)
                       else T.UNUSED if sp.IsUnused(i) else T.BYTE if sp.IsByte(i)
                       else T.NORMAL)
    added = os.path.join(d, "added_tokens.json")
    if os.path.isfile(added):
        with open(added, encoding="utf-8") as fh:
            for text, i in json.load(fh).items():
                if i < size:
                    tokens[i], scores[i], toktypes[i] = text.encode("utf-8"), -1000.0, \
                        T.USER_DEFINED
    tc = os.path.join(d, "tokenizer_config.json")
    if os.path.isfile(tc):
        with open(tc, encoding="utf-8") as fh:
            decoder = json.load(fh).get("added_tokens_decoder", {})
        for key, data in decoder.items():
            i, text = int(key), data["content"]
            if i >= size:
                continue
            if data.get("special") or _looks_special(text):
                toktypes[i] = T.CONTROL
            else:
                text = text.replace("\u2581", " ")
                toktypes[i] = T.USER_DEFINED
            tokens[i], scores[i] = text.encode("utf-8"), -1000.0
    return tokens, scores, toktypes


def _set_parameters(w, cfg, hf_arch, file_type):
    """conversion/base.py ``TextModel.set_gguf_parameters`` for the keys a
    dense Llama / Qwen config has, then LlamaModel's vocab size and rope
    dimension."""
    w.add_block_count(cfg["num_hidden_layers"])
    for keys, add in (
            (["max_position_embeddings", "n_ctx", "n_positions", "max_length",
              "max_sequence_length", "model_max_length"], w.add_context_length),
            (["hidden_size", "n_embd", "dim"], w.add_embedding_length),
            (["prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size",
              "n_inner", "hidden_dim"], w.add_feed_forward_length),
            (["num_attention_heads", "n_head", "n_heads"], w.add_head_count),
            (["num_key_value_heads", "n_kv_heads"], w.add_head_count_kv)):
        if (v := _hparam(cfg, keys)) is not None:
            add(v)
    if cfg.get("is_causal") is False:
        w.add_causal_attention(False)
    rope = dict(cfg.get("rope_parameters", cfg.get("rope_scaling")) or {})
    theta = _hparam(cfg, ["global_rope_theta", "rope_global_theta", "rope_theta_global",
                          "rope_theta", "rotary_emb_base"])
    if "rope_theta" not in rope and theta is not None:
        rope["rope_theta"] = theta
    if (v := rope.get("rope_theta")) is not None:
        w.add_rope_freq_base(v)
    if (v := _hparam(cfg, ["rms_norm_eps", "norm_eps"])) is not None:
        w.add_layer_norm_rms_eps(v)
    if (v := _hparam(cfg, ["layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"])) is not None:
        w.add_layer_norm_eps(v)
    if (v := cfg.get("head_dim")) is not None:
        w.add_key_length(v)
        w.add_value_length(v)
    w.add_file_type(file_type)
    if hf_arch == "LlamaForCausalLM":
        w.add_vocab_size(cfg["vocab_size"])
        rope_dim = cfg.get("head_dim")
        if rope_dim is None:
            rope_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
        w.add_rope_dimension_count(rope_dim)


def write_gguf(model_dir, out, type="F16", *, tokenizer_pre=None, progress=None,
               imatrix=None, device="cpu"):
    """Write a Hugging Face model directory as a GGUF file.

    Parameters
    ----------
    model_dir : str
        A Llama / Qwen2 / Qwen3 ``*ForCausalLM`` directory (config.json,
        model.safetensors or its shards, tokenizer.json).
    out : str
        The .gguf file (replaced atomically; never the input).
    type : str
        ``F32``, ``F16``, ``Q8_0`` (the converter's --outtype) or a
        llama-quantize mix ``Q4_K_M``, ``Q4_K_S``, ``Q5_K_M``, ``Q6_K``.
    tokenizer_pre : str, optional
        ``tokenizer.ggml.pre`` when the tokenizer's probe hash is not one
        of :data:`PRE_TOKENIZERS` (the converter refuses such a tokenizer).
    progress : callable, optional
        ``progress(iterable)`` -> an iterable (a progress bar) over tensors.
    imatrix : str or quantcore.gguf.imatrix.Imatrix, optional
        An importance-matrix file (``llama-imatrix``'s, either format) for a
        mix, as ``llama-quantize --imatrix``: each quantized weight with an
        entry of its row length is quantized with those weights, one without
        an entry without; the file is recorded in ``quantize.imatrix.*``
        keys (:mod:`quantcore.gguf.imatrix`).
    device : {"cpu", "gpu"}
        Where the weights are quantized ("gpu": the current cupy device,
        ``quantcore_gpu.gguf_kernels``; the bytes: docs/FORMATS.md, "On the
        GPU").

    Returns
    -------
    dict
        ``tensors`` {gguf name: type}, ``bytes_in``, ``bytes_out``, ``seconds``
        (and ``imatrix``: the weights quantized with an entry).
    """
    t0 = time.perf_counter()
    if type not in FILE_TYPES:
        raise GGUFFileError(f"--type {type!r}: expected one of {list(FILE_TYPES)}")
    if imatrix is not None and type not in MIXES:
        raise GGUFFileError(f"--imatrix: --type {type} is the converter's --outtype, which "
                            f"takes no importance matrix (a llama-quantize mix does: "
                            f"{', '.join(MIXES)})")
    if imatrix is not None and not isinstance(imatrix, Imatrix):
        imatrix = read_imatrix(imatrix)
    from .hf import check_device
    check_device(device)
    gg = _gguf()
    from pathlib import Path
    with HFModel(model_dir) as model:
        hf_arch = _check_config(model.path, model.config)
        out = os.fspath(out)
        _files.refuse_same_file(out, [os.path.join(model.path, n) for n in
                                      os.listdir(model.path)])
        arch = ARCHITECTURES[hf_arch][0]
        plan = _plan(model, hf_arch, gg, type)
        weights = {} if imatrix is None else {  # (sizes checked before anything is written)
            new: imatrix.for_tensor(new, shape[-1]) for _, new, shape, t in plan
            if t not in ("F32", "F16")}
        w = gg.GGUFWriter(path=None, arch=arch, endianess=gg.GGUFEndian.LITTLE)
        for _, new, shape, t in plan:
            qt = getattr(gg.GGMLQuantizationType, t)
            if t in ("F32", "F16"):
                nbytes = int(np.prod(shape, dtype=np.int64)) * (4 if t == "F32" else 2)
                w.add_tensor_info(new, shape, np.dtype(np.float32 if t == "F32" else np.float16),
                                  nbytes, raw_dtype=qt)
            else:
                bshape = (*shape[:-1], gguf_row_bytes(t, shape[-1]))
                w.add_tensor_info(new, bshape, np.dtype(np.uint8),
                                  int(np.prod(bshape, dtype=np.int64)), raw_dtype=qt)
        # prepare_metadata (conversion/base.py 1189-1229)
        total, shared, expert, count = w.get_total_parameter_count()
        meta = gg.Metadata.load(None, Path(model.path), None, total)
        if meta.name is None:
            meta.name = Path(model.path).name
        if meta.size_label is None and total > 0:
            meta.size_label = gg.size_label(total, shared, expert, count)
        w.add_type(gg.GGUFType.MODEL)
        meta.set_gguf_meta_model(w)
        _set_parameters(w, model.config, hf_arch, FILE_TYPES[type])
        w.add_quantization_version(gg.GGML_QUANT_VERSION)
        _set_vocab(w, model, hf_arch, gg, tokenizer_pre)
        if type in MIXES:  # llama-quant.cpp 1024-1026: gguf_set_kv, then the two set again
            kv = w.kv_data[0]  # (gguf_set_val_u32 removes the key and appends it)
            for key in (gg.Keys.General.QUANTIZATION_VERSION, gg.Keys.General.FILE_TYPE):
                kv[key] = kv.pop(key)
        if imatrix is not None:  # quantize.cpp's kv overrides, set after those (1033-1047)
            for key, value, kind in imatrix.keys():
                (w.add_string if kind == "str" else w.add_uint32)(key, value)
        it = plan if progress is None else progress(plan)
        with _files.atomic_path(out) as tmp:
            w.write_header_to_file(path=Path(tmp))
            w.write_kv_data_to_file()
            w.write_ti_data_to_file()
            for name, new, _, t in it:
                w.write_tensor_data(_tensor(model, hf_arch, name, t, weights.get(new), device))
            w.close()
        bytes_in = model.total_bytes
    return {"tensors": {new: t for _, new, _, t in plan}, "bytes_in": bytes_in,
            "bytes_out": os.path.getsize(out), "seconds": time.perf_counter() - t0,
            "imatrix": sorted(n for n, v in weights.items() if v is not None)}


def read_gguf(path):
    """The tensors of a GGUF file as float32 arrays in PyTorch's axis order
    (GGUF lists dimensions innermost first), each dequantized as ggml's
    ``dequantize_row_<type>`` (:func:`quantcore.gguf.gguf_dequantize`; F32,
    F16 and BF16 widened exactly).

    Returns
    -------
    (dict, dict)
        ``{name: float32 array}`` in the file's order, and the key/values
        ``{key: value}`` (arrays of strings / numbers as lists).

    Raises
    ------
    GGUFFileError
        A file that is not a GGUF file or is malformed, naming the field
        (gguf-py's GGUFReader's checks: magic, version, counts, offsets,
        sizes), or a tensor of a type this reader does not take.
    """
    gg = _gguf()
    from ..gguf import gguf_dequantize
    try:
        r = gg.GGUFReader(os.fspath(path))
    except (ValueError, IndexError, KeyError, OverflowError, TypeError) as exc:
        raise GGUFFileError(f"{path}: not a readable GGUF file: {exc}") from None
    except OSError as exc:
        raise GGUFFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    kv = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        try:
            kv[k] = f.contents()
        except (ValueError, IndexError, UnicodeDecodeError) as exc:
            raise GGUFFileError(f"{path}: key/value {k!r} is malformed: {exc}") from None
    out = {}
    for t in r.tensors:
        tname = t.tensor_type.name
        shape = tuple(int(n) for n in reversed([int(x) for x in t.shape]))
        n = int(np.prod(shape, dtype=np.int64))
        raw = np.asarray(t.data)
        if tname == "F32":
            a = np.asarray(raw, np.float32).reshape(shape)
        elif tname == "F16":
            a = np.asarray(raw, np.float16).astype(np.float32).reshape(shape)
        elif tname == "BF16":
            u = np.frombuffer(raw.tobytes(), np.uint16).astype(np.uint32) << 16
            a = u.view(np.float32).reshape(shape)
        elif tname in GGUF_TYPES:
            row = shape[-1] if shape else 1
            if raw.nbytes != gguf_row_bytes(tname, row) * (n // max(row, 1)):
                raise GGUFFileError(f"{path}: tensor {t.name!r}: {raw.nbytes} bytes of data, "
                                    f"{tname} of shape {list(shape)} takes "
                                    f"{gguf_row_bytes(tname, row) * (n // max(row, 1))}")
            a = gguf_dequantize(raw.tobytes(), tname, (n // row, row)).reshape(shape)
        else:
            raise GGUFFileError(f"{path}: tensor {t.name!r} is of type {tname}, which "
                                f"quantcore reads not (F32, F16, BF16, {', '.join(GGUF_TYPES)})")
        out[t.name] = np.array(a, np.float32, copy=True)
    return out, kv
