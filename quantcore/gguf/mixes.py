"""The per-tensor types of llama-quantize's mixes (issue 39), ported from
llama.cpp 0c1e57098bba's ``src/llama-quant.cpp`` (the llama-cpp-python
0.3.36 sdist's ``vendor/llama.cpp``) for the mixes Q4_K_M, Q4_K_S, Q5_K_M,
Q6_K and Q8_0 and dense (no-expert) models:

* ``tensor_allows_quantization`` (lines 330-388): 2-D or more, a name
  ending in ``weight``, not ``*_norm.weight`` (nor the other architectures'
  exceptions); anything else keeps its type.
* the mix's default type, ``llama_ftype_get_default_type`` (lines 887-907):
  Q4_K_M / Q4_K_S -> Q4_K, Q5_K_M -> Q5_K, Q6_K -> Q6_K, Q8_0 -> Q8_0.
* ``llama_tensor_get_type_impl`` (lines 446-715): ``output.weight`` (and
  ``token_embd.weight`` when there is no ``output.weight``: tied) is Q8_0
  when its row is not a multiple of the default type's block, else Q6_K
  (unless the default is Q8_0); ``attn_v`` gets Q6_K in Q4_K_M / Q5_K_M
  on the layers ``use_more_bits(i, n)`` (``i < n/8 or i >= 7n/8 or (i -
  n/8) % 3 == 2``, ``i`` counting attn_v tensors in order, ``n`` their
  number) and Q5_K in Q4_K_S on the first 4; ``ffn_down`` gets Q6_K in
  Q4_K_M / Q5_K_M where ``use_more_bits`` (``i`` counting ffn_down
  tensors, ``n`` the layers), Q5_K in Q4_K_S on the first n/8; on a
  LLM_TYPE_70B model (Llama, 80 layers, grouped-query attention: line
  1456) an attn_v left at Q3_K / Q4_K becomes Q5_K.
* ``tensor_type_fallback`` (lines 390-444): a row length not a multiple
  of the type's block: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, a type
  of block 32 stays; F16 when the fallback's block does not divide it
  either.

The order is llama-quantize's: ``llama_model_loader::weights_map``
(``weight_name_comparer``, src/llama-model-loader.h lines 54-65): tensors
outside blocks first, then block by block, by name within each.
"""
import re

__all__ = ["MIXES", "DEFAULT_TYPES", "quantize_order", "tensor_types"]

#: mix -> its default type (llama_ftype_get_default_type, llama-quant.cpp 887-907)
DEFAULT_TYPES = {"Q4_K_M": "Q4_K", "Q4_K_S": "Q4_K", "Q5_K_M": "Q5_K", "Q6_K": "Q6_K",
                 "Q8_0": "Q8_0"}
MIXES = tuple(DEFAULT_TYPES)
#: values per block (ggml_blck_size) of the types a mix can choose
_BLOCK = {"Q3_K": 256, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "Q8_0": 32, "Q4_0": 32,
          "Q5_0": 32, "Q5_1": 32, "F16": 1}
#: tensor_type_fallback's table (llama-quant.cpp 404-417) for the types of these mixes
_FALLBACK = {"Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
_BLK = re.compile(r"blk\.(\d+)\.")


def _layer(name):
    m = _BLK.match(name)
    return int(m.group(1)) if m else -1


def quantize_order(names):
    """``names`` in llama-quantize's order (weight_name_comparer: the block
    number, -1 outside blocks, then the name)."""
    return sorted(names, key=lambda n: (_layer(n), n))


def _category(name):
    """tensor_get_category (llama-quant.cpp 119-155)."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for key, cat in (("attn_qkv.weight", "attn_v"), ("attn_kv_b.weight", "attn_v"),
                     ("attn_v.weight", "attn_v"), ("attn_k.weight", "attn_k"),
                     ("attn_q.weight", "attn_q"), ("attn_output.weight", "attn_output"),
                     ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"), ("ffn_down", "ffn_down")):
        if key in name:
            return cat
    return "other"


def allows_quantization(name, shape):
    """tensor_allows_quantization (llama-quant.cpp 330-388) for these
    architectures: 2+ dimensions, ``*weight``, not a norm."""
    return (len(shape) >= 2 and name.endswith("weight") and "_norm.weight" not in name
            and "ffn_gate_inp.weight" not in name)


def _use_more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _fallback(name, ncols, t):
    """tensor_type_fallback (llama-quant.cpp 390-444)."""
    if ncols % _BLOCK[t] == 0:
        return t
    if t in _FALLBACK:
        t = _FALLBACK[t]
    elif _BLOCK[t] > 32:
        raise ValueError(f"tensor {name!r}: no fallback type for {t}")
    return t if ncols % _BLOCK[t] == 0 else "F16"


def tensor_types(arch, tensors, mix, config):
    """{name: ggml type name} that llama-quantize chooses for ``mix``.

    Parameters
    ----------
    arch : str
        The GGUF architecture (``llama``, ``qwen2``, ``qwen3``).
    tensors : list of (str, tuple)
        Every tensor of the (F32) input file: GGUF name and numpy shape
        (the row, ggml's ``ne[0]``, last).
    mix : str
        One of :data:`MIXES`.
    config : dict
        The model's config.json (``num_hidden_layers``,
        ``num_attention_heads``, ``num_key_value_heads``).

    Returns
    -------
    dict
        The type of every tensor; those llama-quantize does not quantize
        keep ``F32`` (the converter's F32 file).
    """
    if mix not in DEFAULT_TYPES:
        raise ValueError(f"mix {mix!r}: expected one of {list(MIXES)}")
    default = DEFAULT_TYPES[mix]
    n_layer = config["num_hidden_layers"]
    n_head = config["num_attention_heads"]
    n_head_kv = config.get("num_key_value_heads", n_head)
    is_70b = arch == "llama" and n_layer == 80 and n_head != n_head_kv
    order = quantize_order([n for n, _ in tensors])
    shapes = dict(tensors)
    cats = {n: _category(n) for n in order}
    n_attn_v = sum(c == "attn_v" for c in cats.values())
    tied = "output.weight" not in shapes
    i_attn_v = i_ffn_down = 0
    out = {}
    for name in order:
        shape = shapes[name]
        if not allows_quantization(name, shape):
            out[name] = "F32"
            continue
        t, cat, ncols = default, cats[name], shape[-1]
        if cat == "output" or (tied and cat == "token_embd"):
            if ncols % _BLOCK[t] != 0:
                t = "Q8_0"
            elif t != "Q8_0":
                t = "Q6_K"
        elif cat == "attn_v":
            if mix in ("Q4_K_M", "Q5_K_M") and _use_more_bits(i_attn_v, n_attn_v):
                t = "Q6_K"
            elif mix == "Q4_K_S" and i_attn_v < 4:
                t = "Q5_K"
            if is_70b and t in ("Q3_K", "Q4_K"):
                t = "Q5_K"
            i_attn_v += 1
        elif cat == "ffn_down":
            if mix in ("Q4_K_M", "Q5_K_M") and _use_more_bits(i_ffn_down, n_layer):
                t = "Q6_K"
            elif mix == "Q4_K_S" and i_ffn_down < n_layer // 8:
                t = "Q5_K"
            i_ffn_down += 1
        out[name] = _fallback(name, ncols, t)
    return out
