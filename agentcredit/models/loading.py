"""One entry point for a base model by name, used by training, evaluation, studies and benchmarks alike."""

from __future__ import annotations

from typing import Any


def load_base_model(name: str, dtype: str = "float32", *, seed: int = 0) -> tuple[Any, Any]:
    """``(model, tokenizer)``: 'embedded' (SmolLM2-135M), 'tiny' (a random tiny Llama, for tests) or a local path."""
    if name == "tiny":
        from agentcredit.models.tiny import tiny_llama

        return tiny_llama(seed=seed, dtype=dtype, max_positions=8192)
    from agentcredit.models.embedded import load_model

    return load_model(name, dtype=dtype)
