"""Seeds, the RNG state a checkpoint saves, and the seeded order in which training questions are drawn."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from agentcredit.tasks import Example


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # a run on a GPU (model.device)
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class PromptSampler:
    """Seeded epochs over the training questions; its position is part of a checkpoint."""

    def __init__(self, examples: list[Example], seed: int):
        if not examples:
            raise ValueError("no training examples")
        self.examples, self.seed, self.epoch, self.pos = examples, seed, 0, 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        order = list(range(len(self.examples)))
        random.Random(f"{self.seed}-{self.epoch}").shuffle(order)
        return order

    def next(self, k: int) -> list[Example]:
        out = []
        while len(out) < k:
            if self.pos == len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._permutation()
            out.append(self.examples[self._order[self.pos]])
            self.pos += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._permutation()
