"""One entry point for a base model by name, used by training, evaluation, studies and benchmarks alike."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch

from agentcredit.models.device import config_device

if TYPE_CHECKING:
    from agentcredit.config import Config


def load_base_model(
    name: str, dtype: str = "float32", *, seed: int = 0, device: torch.device | str | None = None
) -> tuple[Any, Any]:
    """``(model, tokenizer)``: 'embedded' (SmolLM2-135M), 'tiny' (a random tiny Llama, for tests) or a local path;
    on ``device`` when given (a study's or an evaluation's ``model.device``), else where it loads (the CPU)."""
    if name == "tiny":
        from agentcredit.models.tiny import tiny_llama

        model, tokenizer = tiny_llama(seed=seed, dtype=dtype, max_positions=8192)
    else:
        from agentcredit.models.embedded import load_model

        model, tokenizer = load_model(name, dtype=dtype)
    return (model.to(device) if device is not None else model), tokenizer


def load_policy(
    cfg: Config, *, model: Any = None, tokenizer: Any = None, device: torch.device | str | None = None
) -> tuple[Any, Any]:
    """The trainable policy: the base model of ``model.name`` on ``device`` (default ``model.device``), wrapped with
    LoRA adapters if asked. A model passed in moves there too (a no-op where it is already there)."""
    # first: asking for a GPU that is not there stops before any weights load
    device = config_device(cfg) if device is None else torch.device(device)
    if model is None:
        model, tokenizer = load_base_model(cfg.model.name, cfg.model.dtype, seed=cfg.train.seed)
    model = model.to(device)
    if cfg.model.lora.enabled:
        from peft import LoraConfig, get_peft_model

        lora = cfg.model.lora
        model = get_peft_model(
            model,
            LoraConfig(
                r=lora.r,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                target_modules=lora.target_modules,
                task_type="CAUSAL_LM",
            ),
        )
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model, tokenizer


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A no-grad snapshot (the KL reference, TIPS's teacher)."""
    snapshot = copy.deepcopy(model)
    snapshot.eval()
    for p in snapshot.parameters():
        p.requires_grad_(False)
    return snapshot
