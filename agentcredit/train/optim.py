"""The optimiser every training phase uses (RL update, SFT, critic warm-up)."""

from __future__ import annotations

import torch


def adamw(params, **kwargs) -> torch.optim.AdamW:
    """AdamW with the fused kernel: one pass over each parameter instead of ~10 (about 4x faster on CPU, where the
    optimiser step of a 135M model otherwise costs as much as a forward pass)."""
    return torch.optim.AdamW(params, fused=True, **kwargs)
