"""Value heads on the shared policy backbone.

Both heads read the final-layer hidden state (after the model's final norm) and are computed in fp32.

* :class:`TokenValueHead` — PPO / TIPS: one value per token, ``Linear(d, 1)``. verl (and TIPS §4) trains a separate
  critic model initialised from the base model: ``algorithm.critic_model='separate'`` (the PPO and TIPS presets) puts
  the head on such a copy; ``'shared'`` puts it on the policy's backbone, as TRL's value-head models do.
* :class:`BoundaryValueHead` — carl-segment §3.4: ``Linear(d, d) -> GELU -> Linear(d, 1) -> sigmoid``, the last layer
  zero-initialised so V = 0.5 at the start; read at the last token of every segment boundary state.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from agentcredit.models.device import config_device

if TYPE_CHECKING:
    from agentcredit.config import Config


class TokenValueHead(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1)
        # zero init: V = 0 everywhere at the start, so the first advantages are plain returns
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden.float()).squeeze(-1)


class BoundaryValueHead(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, hidden_size)  # default nn.Linear init (carl-segment.md §3.4 [R])
        self.fc2 = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.fc2.weight)  # V = sigmoid(0) = 0.5 at init (carl-segment.md §3.4 [I])
        nn.init.zeros_(self.fc2.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.fc2(torch.nn.functional.gelu(self.fc1(hidden.float())))).squeeze(-1)


def make_value_head(kind: str, hidden_size: int) -> nn.Module | None:
    """'token' -> TokenValueHead, 'boundary' -> BoundaryValueHead, 'none' -> None."""
    if kind == "none":
        return None
    if kind == "token":
        return TokenValueHead(hidden_size)
    if kind == "boundary":
        return BoundaryValueHead(hidden_size)
    raise ValueError(f"value head kind must be 'none', 'token' or 'boundary', got {kind!r}")


def initial_value_head(cfg: Config, hidden_size: int):
    """The value head of the method's critic (``algorithm.critic``, from its Needs), on ``model.device``; a warmed-up
    one is loaded from ``<model dir>/value_head.pt``."""
    head: nn.Module | None = make_value_head(cfg.algorithm.critic, hidden_size)
    saved = Path(cfg.model.name) / "value_head.pt"
    if head is not None and cfg.model.name not in ("embedded", "tiny") and saved.is_file():
        try:
            head.load_state_dict(torch.load(saved, map_location="cpu"))
        except RuntimeError as exc:
            raise ValueError(f"{saved}: does not fit a {cfg.algorithm.critic!r} value head ({exc})") from None
    return head.to(config_device(cfg)) if head is not None else None
