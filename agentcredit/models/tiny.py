"""A tiny randomly initialised Llama for fast tests (engine, trainer), on the embedded model's tokenizer.

The model shares SmolLM2's vocabulary, so any text round-trips through the real tokenizer and chat template;
only the network is small (a few layers, a small hidden size) and random. Initialisation is seeded, so two
calls with the same arguments return identical weights.
"""

from __future__ import annotations

from typing import Any

import torch

from agentcredit.models.embedded import DTypeLike, load_tokenizer, to_dtype


def tiny_llama(
    *,
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_positions: int = 4096,
    initializer_range: float = 0.02,
    seed: int = 0,
    dtype: DTypeLike = torch.float32,
    tokenizer: Any = None,
) -> tuple[Any, Any]:
    """``(model, tokenizer)``: a random ``LlamaForCausalLM`` with the SmolLM2 tokenizer's vocabulary.

    ``num_kv_heads < num_heads`` keeps grouped-query attention in play, as in SmolLM2. Pass ``tokenizer`` to
    reuse an already loaded one. A larger ``initializer_range`` (e.g. 0.1) makes the model much quicker to
    overfit a few demonstrations (the rollout tests do that so that tool calls happen for real).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            f"tiny_llama: hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads}) and "
            f"num_heads by num_kv_heads ({num_kv_heads})"
        )
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        initializer_range=initializer_range,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.to(to_dtype(dtype))
    model.eval()
    return model, tokenizer
