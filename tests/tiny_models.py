"""Tiny transformers causal LMs with random weights, saved as Hugging Face
model directories: the engine-format tests' real architectures (Llama,
Qwen3, a Mixtral-like MoE, a Gemma with tied embeddings)."""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)


def tiny_model(kind, path, seed=0):
    """A random transformers model (hidden 64, one block) saved with
    save_pretrained: llama, qwen3, mixtral (4 experts), gemma (tied)."""
    torch.manual_seed(seed)
    if kind == "mixtral":
        cfg = transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **COMMON)
        cls = transformers.MixtralForCausalLM
    elif kind == "qwen3":
        cfg, cls = transformers.Qwen3Config(head_dim=16, **COMMON), transformers.Qwen3ForCausalLM
    elif kind == "gemma":
        cfg = transformers.GemmaConfig(head_dim=16, tie_word_embeddings=True, **COMMON)
        cls = transformers.GemmaForCausalLM
    else:
        cfg, cls = transformers.LlamaConfig(**COMMON), transformers.LlamaForCausalLM
    cfg.architectures = [cls.__name__]
    model = cls(cfg).to(torch.bfloat16)
    with torch.no_grad():  # a trained model's spread, not init's tiny weights
        for p in model.parameters():
            p.normal_(0, 0.5)
    model.save_pretrained(path)
    return model
