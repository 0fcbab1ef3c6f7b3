"""The native trainer's side of the signal providers (:mod:`agentcredit.credit.signals`).

The trainer scores every batch with the pre-update weights (old log-probs, entropies, critic values: its own
signals, :data:`TRAINER_SIGNALS`); any other signal a method needs comes from the provider that
:data:`PROVIDERS` keys by it, made once per run by :func:`signal_providers`. A method's home registers the
providers of its signals, user code registers its own the same way (:func:`register_provider`). The trainer never
names a method, and a provider never sees the trainer: it reads the run through a :class:`RunContext`, which
implements the capabilities of :class:`~agentcredit.credit.signals.ProviderContext` with this package's scoring
(:mod:`agentcredit.train.signals`), model copies and reference trajectories (:mod:`agentcredit.train.sft`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from agentcredit.credit.signals import (
    PROVIDERS,
    TRAINER_SIGNALS,
    ProviderContext,
    SignalProvider,
    register_provider,
    signal_providers,
    unregister_provider,
)
from agentcredit.models.loading import frozen_copy
from agentcredit.tasks import Example
from agentcredit.train.batch import TrainBatch
from agentcredit.train.sft import ReferenceTrajectories
from agentcredit.train.signals import logprobs_under_prompts, score_continuations, segment_contexts

__all__ = [
    "PROVIDERS",
    "TRAINER_SIGNALS",
    "ProviderContext",
    "RunContext",
    "SignalProvider",
    "register_provider",
    "signal_providers",
    "unregister_provider",
]


@dataclass(frozen=True)
class RunContext(ProviderContext):
    """The native trainer's :class:`~agentcredit.credit.signals.ProviderContext`: the policy, its tokenizer, the
    environment and the config, and the capabilities a provider calls, within the config's micro-batch size
    (``train.micro_batch_tokens``)."""

    def frozen_copy(self, model: nn.Module) -> nn.Module:
        return frozen_copy(model)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def render_answer(self, answer: str) -> str:
        return self.env.protocol.render_answer(answer)

    def score_continuations(
        self,
        model: nn.Module,
        contexts: Sequence[Sequence[int]],
        continuations: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
        autocast: bool = False,
    ) -> list[list[float]]:
        return score_continuations(
            model,
            contexts,
            continuations,
            temperature=temperature,
            autocast=autocast,
            max_tokens=self.cfg.train.micro_batch_tokens,
        )

    def segment_contexts(self, batch: TrainBatch) -> list[list[list[int]]]:
        return segment_contexts(batch)

    def logprobs_under_prompts(
        self,
        model: nn.Module,
        batch: TrainBatch,
        trees: Sequence[Any],
        prompts: Mapping[int, Sequence[int]],
        *,
        temperature: float = 1.0,
        autocast: bool = False,
    ) -> Tensor:
        return logprobs_under_prompts(
            model,
            batch,
            trees,
            prompts,
            temperature=temperature,
            autocast=autocast,
            max_tokens=self.cfg.train.micro_batch_tokens,
        )

    def reference_trajectories(self) -> Callable[[Example], str]:
        return ReferenceTrajectories(self.env, self.tokenizer, self.cfg.protocol.name)
