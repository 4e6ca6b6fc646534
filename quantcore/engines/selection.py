"""Which weights a checkpoint writer quantizes, as the producers choose
(llm-compressor's ``targets: ["Linear"]`` and usual ``ignore``; ModelOpt's
exclusions follow from these), and the fused sets that share one NVFP4
global scale (their absmax: ``fused.FusedSetReader``); both
formats' writers use it (``compressed_tensors`` keeps these names too)."""
import re

__all__ = ["WEIGHT_DTYPES", "FUSED", "module_of", "select", "select_checked", "is_embedding",
           "fused_sets"]

#: the weight dtypes the writers quantize (others are copied)
WEIGHT_DTYPES = ("F32", "F16", "BF16")
#: fused siblings (one parent module) that share NVFP4's global scale, as
#: llm-compressor's FUSED_LAYER_NAMES (observers/helpers.py) and vLLM expect
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"),
         ("q_a_proj", "kv_a_proj_with_mqa"), ("w1", "w3"))
#: a decoder block: model.layers.3. (Llama, Qwen, Mixtral, Gemma), h.3. (GPT-2), blocks.3.
_BLOCK = re.compile(r"(^|\.)(layers|layer|h|blocks|block)\.\d+\.")
#: MoE routers and shared-expert gates (llm-compressor's recipes ignore them)
_ROUTER = re.compile(r"(^|\.)(gate|router|shared_expert_gate)\.weight$")
_TOWER = re.compile(r"(^|[._])(vision|visual|vision_tower|audio|audio_tower|multi_modal_projector)"
                    r"([._]|$)")
_EMBEDDING = re.compile(r"(^|[._])([^._]*embed[^._]*|wte|wpe)([._]|$)", re.IGNORECASE)


def module_of(name):
    return name[:-len(".weight")] if name.endswith(".weight") else name


def select(model):
    """(quantized tensor names, ignore list, {reason: copied names}): the
    Linear weights of the decoder blocks, as llm-compressor's ``targets:
    ["Linear"]`` with its usual ``ignore``; every other 2-D weight (lm_head,
    routers, towers) is left alone and, but embeddings, listed in ``ignore``
    so that an engine does not expect it quantized; ``lm_head`` is listed
    always (a tied lm_head has no tensor of its own)."""
    chosen, ignore, copied = [], ["lm_head"], {}
    for n in model.names:
        dt, shape = model.info(n)
        if not n.endswith(".weight") or len(shape) != 2:
            continue
        why = ("embeddings" if _EMBEDDING.search(n) else
               "not a decoder block's Linear" if not _BLOCK.search(n) else
               "a MoE router" if _ROUTER.search(n) else
               "a vision / audio tower" if _TOWER.search(n) else
               f"{dt} (quantized from F32, F16 or BF16 only)" if dt not in WEIGHT_DTYPES
               else None)
        if why is None:
            chosen.append(n)
            continue
        copied.setdefault(why, []).append(n)
        if why != "embeddings" and module_of(n) not in ignore:
            ignore.append(module_of(n))
    return chosen, ignore, copied


def select_checked(model, src, check_shape):
    """:func:`select`, refusing a model with no weight to quantize (naming
    ``src``) and running ``check_shape(name, shape)`` (which raises naming
    the layer) on every chosen weight."""
    chosen, ignore, copied = select(model)
    if not chosen:
        raise ValueError(f"{src}: no decoder-block Linear weight to quantize")
    for n in chosen:
        check_shape(n, model.info(n)[1])
    return chosen, ignore, copied


def is_embedding(name):
    """Whether ``name`` is an embedding's (left alone; ModelOpt also lists
    it in ``exclude_modules``)."""
    return bool(_EMBEDDING.search(name))


def fused_sets(names):
    """{weight name: tuple of the names of its fused set} for the sets of
    :data:`FUSED` whose members are all in ``names``."""
    have, out = set(names), {}
    for n in names:
        parent, _, leaf = module_of(n).rpartition(".")
        for group in FUSED:
            if leaf in group:
                members = tuple(f"{parent}.{m}.weight" if parent else f"{m}.weight"
                                for m in group)
                if all(m in have for m in members):
                    out[n] = members
    return out
