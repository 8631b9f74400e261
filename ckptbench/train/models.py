"""Build real Hugging Face causal LMs from a :class:`ModelSpec` (random weights, nothing downloaded),
and the seeded token batches they train on."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, PretrainedConfig, Qwen2Config

from ..spec import ModelSpec

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def hf_config(spec: ModelSpec) -> PretrainedConfig:
    """The transformers config that gives `spec`'s shapes; dropout off so runs are deterministic."""
    if spec.family in ("llama", "qwen2"):
        config_class = LlamaConfig if spec.family == "llama" else Qwen2Config
        cfg = config_class(
            hidden_size=spec.hidden, num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
            num_key_value_heads=spec.kv_heads, intermediate_size=spec.intermediate,
            vocab_size=spec.vocab, max_position_embeddings=spec.max_positions,
            tie_word_embeddings=spec.tie_embeddings, use_cache=False,
        )
    elif spec.family == "gpt2":
        cfg = GPT2Config(
            n_embd=spec.hidden, n_layer=spec.layers, n_head=spec.heads, n_inner=spec.intermediate,
            vocab_size=spec.vocab, n_positions=spec.max_positions, tie_word_embeddings=spec.tie_embeddings,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
            bos_token_id=spec.vocab - 1, eos_token_id=spec.vocab - 1,
        )
    else:
        return generic_config(spec)
    return cfg


def generic_config(spec: ModelSpec) -> PretrainedConfig:
    """Any model type transformers knows: ``AutoConfig.for_model`` with the spec's dimensions and extra keys.

    Made runnable as the spec shrinks it: token ids beyond a smaller vocabulary are dropped (an embedding
    whose padding index is out of range will not build), dropout is off (runs must repeat), no KV cache.
    """
    from transformers import AutoConfig

    values = dict(hidden_size=spec.hidden, num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                  num_key_value_heads=spec.kv_heads, intermediate_size=spec.intermediate, vocab_size=spec.vocab,
                  max_position_embeddings=spec.max_positions, tie_word_embeddings=spec.tie_embeddings,
                  use_cache=False, **spec.config_extra)
    try:
        cfg = AutoConfig.for_model(spec.family, **values)
    except ValueError as exc:  # an unknown model_type
        raise ValueError(f"transformers cannot build model_type {spec.family!r}: {exc}") from None
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        token = getattr(cfg, key, None)
        if isinstance(token, int) and token >= spec.vocab:
            setattr(cfg, key, None)
    for key, value in cfg.to_dict().items():
        if isinstance(value, float) and ("dropout" in key or key.endswith("pdrop")):
            setattr(cfg, key, 0.0)
    return cfg


def build_model(spec: ModelSpec, device: str | torch.device = "cpu") -> torch.nn.Module:
    """`AutoModelForCausalLM.from_config` in the spec's dtype and attention implementation, train mode.

    Built under the target device's context so the random initialisation runs there: a 1B model
    initialised on the host with one thread takes seconds per sweep point, on the GPU a fraction of one.
    """
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            hf_config(spec), attn_implementation=spec.attn, dtype=TORCH_DTYPES[spec.dtype]
        )
    return model.to(device).train()


def synthetic_batch(vocab: int, batch_size: int, seq_len: int, seed: int, device="cpu") -> torch.Tensor:
    """Token ids from a seeded generator: same data for every strategy at a given point."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch_size, seq_len), generator=gen).to(device)
