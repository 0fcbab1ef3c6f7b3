"""Signal providers: what computes a signal a method's :class:`~agentcredit.credit.Needs` names, with its own state.

The trainer scores every batch with the pre-update weights (old log-probs, entropies, critic values: its own
signals, :data:`TRAINER_SIGNALS`); any other signal a method needs comes from the provider that
:data:`PROVIDERS` keys by it, made once per run by :func:`signal_providers`. A provider of a new signal (one named
with :func:`agentcredit.credit.register_signal`) joins them with :func:`register_provider`, from user code. A provider may hold state across steps
(a lagged teacher model, the last batch's alpha) that the checkpoint saves, and frozen models the trainer keeps
out of the update. The trainer itself never names a method: TIPS is the method whose needs say ``potentials``.

* :class:`TeacherPotentials` — ``potentials`` and ``alpha``: TIPS's teacher potentials Phi(S) at each policy
  segment's start, scored by a frozen copy of the policy refreshed every ``refresh_every`` updates, and the
  batch's shaping scale (tips.md §3.7).
* :class:`TeacherLogprobs` — ``teacher_logp``: GEAR's ground-truth-conditioned teacher log-probs of the student's
  own tokens (gear.md §2.2), conditioned on a reference trajectory played once per example (paper §3.3).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

from torch import nn

from agentcredit.credit import SIGNALS, Needs, Settings, tips_step_alpha, tips_teacher_refresh_due
from agentcredit.models.loading import frozen_copy
from agentcredit.rollout.tree import RolloutTree
from agentcredit.tasks import Example
from agentcredit.train.batch import TrainBatch
from agentcredit.train.sft import ReferenceTrajectories
from agentcredit.train.signals import (
    Signals,
    gear_ground_truth,
    gear_teacher_logprobs,
    gear_teacher_prompt,
    tips_potential_terms,
)

__all__ = [
    "PROVIDERS",
    "TRAINER_SIGNALS",
    "ProviderContext",
    "SignalProvider",
    "register_provider",
    "signal_providers",
    "unregister_provider",
]

#: Signals the trainer's own scoring pass computes for every method.
TRAINER_SIGNALS = frozenset({"values", "student_logp", "entropy"})


@dataclass(frozen=True)
class ProviderContext:
    """What a provider reads of the run: the policy (the live module the update trains, so a lagged teacher can copy
    its weights), its tokenizer, the environment (protocol, tools) and the config. The trainer builds one; a provider
    never sees the trainer itself, so this module does not import it."""

    model: nn.Module
    tokenizer: Any
    env: Any
    cfg: Any


class SignalProvider(ABC):
    """Computes the signals in :attr:`provides` for every batch; override what applies. It is made once per run,
    with the settings of the method part whose needs name its signal, and writes each signal into the batch's
    :class:`~agentcredit.train.signals.Signals` by name (``signals[name] = value``)."""

    provides: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, run: ProviderContext, settings: Settings) -> None:
        self.run = run
        self.settings = settings

    @abstractmethod
    def fill(
        self,
        signals: Signals,
        batch: TrainBatch,
        trees: list[RolloutTree],
        examples: Mapping[int, Example],
        *,
        temperature: float,
        autocast: bool,
    ) -> None:
        """Put this provider's signals for ``batch`` into ``signals``."""

    def after_step(self, step: int) -> None:  # noqa: B027 (an optional hook, not abstract)
        """After the update of step ``step`` (1-based)."""

    def frozen_models(self) -> list[nn.Module]:
        return []

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: B027 (an optional hook)
        """Restore what :meth:`state_dict` saved (nothing, unless the provider keeps state)."""


class TeacherPotentials(SignalProvider):
    provides = frozenset({"potentials", "alpha"})

    def __init__(self, run: ProviderContext, settings: Settings) -> None:
        super().__init__(run, settings)
        self.teacher = frozen_copy(run.model)
        self.alpha: float = settings.alpha  # type: ignore[attr-defined]

    def fill(self, signals, batch, trees, examples, *, temperature, autocast) -> None:
        t, run = self.settings, self.run
        answers = [examples[traj.tree].answers for traj in batch.trajectories]
        encode = lambda text: run.tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        signals.potential_split = tips_potential_terms(
            self.teacher,
            batch,
            answers,
            encode,
            run.env.protocol.render_answer,
            reduce=t.reduce,  # type: ignore[attr-defined]
            scope=t.potential_scope,  # type: ignore[attr-defined]
            autocast=autocast,
            max_tokens=run.cfg.train.micro_batch_tokens,
        )
        signals.potentials = signals.potential_split.potentials
        self.alpha = tips_step_alpha(
            signals.potentials,
            mode=t.alpha_mode,  # type: ignore[attr-defined]
            alpha=t.alpha,  # type: ignore[attr-defined]
            target_mean_abs=t.target_mean_abs,  # type: ignore[attr-defined]
            previous=self.alpha,
        )
        signals.alpha = self.alpha

    def after_step(self, step: int) -> None:
        if tips_teacher_refresh_due(step, self.settings.refresh_every):  # type: ignore[attr-defined]
            self.refresh()

    def refresh(self) -> None:
        """The teacher becomes a frozen copy of the current policy (between batches only)."""
        self.teacher.load_state_dict(self.run.model.state_dict())

    def frozen_models(self) -> list[nn.Module]:
        return [self.teacher]

    def state_dict(self) -> dict[str, Any]:  # the keys checkpoints have always had
        return {"teacher": self.teacher.state_dict(), "tips_alpha": self.alpha}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("teacher") is not None:
            self.teacher.load_state_dict(state["teacher"])
        self.alpha = state.get("tips_alpha", self.alpha)


class TeacherLogprobs(SignalProvider):
    provides = frozenset({"teacher_logp"})

    def __init__(self, run: ProviderContext, settings: Settings) -> None:
        super().__init__(run, settings)
        self.references: ReferenceTrajectories | None = None  # tau* per example, built on first use

    @staticmethod
    def teacher_prompt(
        protocol: Any,
        tokenizer: Any,
        example: Example,
        template: str,
        *,
        reference: str | None = None,
        student_prompt: str | None = None,
    ) -> str:
        """The teacher's prompt text for ``example`` as :meth:`fill` builds it: the student's prompt with the
        ground truth (``reference``, tau*, when given, else the rendered gold answer; after the example's worked
        solution when it has one) inserted by ``template``. verl's agent loop builds it on its workers with this."""
        truth = gear_ground_truth(protocol, example, reference)
        return gear_teacher_prompt(
            protocol, tokenizer, example.question, truth, template, student_prompt=student_prompt
        )

    def fill(self, signals, batch, trees, examples, *, temperature, autocast) -> None:
        g, run = self.settings, self.run
        references = None
        if g.reference == "trajectory":  # type: ignore[attr-defined]  # tau*, played once per example (§3.3)
            if self.references is None:
                self.references = ReferenceTrajectories(run.env, run.tokenizer, run.cfg.protocol.name)
            references = {t: self.references(ex) for t, ex in examples.items()}
        signals.teacher_logp = gear_teacher_logprobs(
            run.model,
            run.tokenizer,
            run.env.protocol,
            batch,
            trees,
            dict(examples),
            g.template,  # type: ignore[attr-defined]
            references=references,
            temperature=temperature,
            autocast=autocast,
            max_tokens=run.cfg.train.micro_batch_tokens,
        )


_PROVIDERS: dict[str, type[SignalProvider]] = {}
#: The provider of each signal, by the signal's name (read-only; add with :func:`register_provider`).
PROVIDERS: Mapping[str, type[SignalProvider]] = MappingProxyType(_PROVIDERS)


def register_provider(
    provider: type[SignalProvider], *, replace_existing: bool = False
) -> type[SignalProvider]:
    """Make ``provider`` compute the signals in its ``provides`` for every run whose method needs one; returns it
    (usable as a class decorator). Each signal must be registered (:func:`agentcredit.credit.register_signal`) and
    not one the trainer computes itself; a signal another provider computes is an error unless
    ``replace_existing``."""
    if not provider.provides:
        raise ValueError(f"{provider.__name__}.provides names no signal")
    for name in sorted(provider.provides):
        if name in TRAINER_SIGNALS:
            raise ValueError(f"{provider.__name__}: the trainer computes {name!r} itself")
        if name not in SIGNALS:
            raise ValueError(
                f"{provider.__name__}: {name!r} is not a registered signal (agentcredit.credit.register_signal)"
            )
        if name in _PROVIDERS and _PROVIDERS[name] is not provider and not replace_existing:
            raise ValueError(f"{_PROVIDERS[name].__name__} already provides {name!r}")
    for name in sorted(provider.provides):
        _PROVIDERS[name] = provider
    return provider


def unregister_provider(provider: type[SignalProvider]) -> type[SignalProvider]:
    """Forget ``provider`` for every signal it was registered for; returns it."""
    for name in [n for n, p in _PROVIDERS.items() if p is provider]:
        del _PROVIDERS[name]
    return provider


register_provider(TeacherPotentials)
register_provider(TeacherLogprobs)


def signal_providers(
    run: ProviderContext, needs: Needs, settings: Mapping[str, Settings]
) -> list[SignalProvider]:
    """One provider per group of needed signals the trainer does not compute itself, each given the settings of
    the method part that needs it; a signal no provider computes is an error naming it."""
    method = run.cfg.algorithm.credit_method
    wanted = set(needs.signals - TRAINER_SIGNALS)
    out = []
    for provider in dict.fromkeys(_PROVIDERS.values()):  # each class once, in the order they were registered
        if not provider.provides & wanted:
            continue
        part = next(p for p in method.parts if provider.provides & p.needs.signals)
        out.append(provider(run, settings[part.section]))
        wanted -= provider.provides
    if wanted:
        raise ValueError(
            f"{method.name} needs the signal(s) {sorted(wanted)}, which no signal provider computes"
        )
    return out
