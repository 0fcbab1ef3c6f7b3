"""Signals: what a method reads besides rewards, and the providers that compute them, both open to registration.

A method's :class:`~agentcredit.credit.Needs` names its signals from :data:`SIGNALS` (a method file or user code
adds one with :func:`register_signal`). A trainer computes :data:`TRAINER_SIGNALS` itself (its own scoring pass
with the pre-update weights: old log-probs, entropies, critic values); any other signal comes from the
:class:`SignalProvider` that :data:`PROVIDERS` keys by it, made once per run by :func:`signal_providers`. A method's
home defines and registers the providers of its own signals (:func:`register_provider`); user code adds one the same
way, without editing the package.

A provider may hold state across steps (a lagged teacher model, the last batch's scale) that the checkpoint saves,
and frozen models the trainer keeps out of the update. It never sees the trainer: it reads the run through a
:class:`ProviderContext`, which names what it may read (the policy, tokenizer, environment, config) and the few
model-side capabilities a provider calls (a frozen copy of a model, log-probs of continuations after contexts, the
log-probs of a batch's own tokens under other prompts, a task's reference trajectories). A trainer implements them
(the native one in :class:`agentcredit.train.providers.RunContext`); this module imports neither models nor
trainers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

from torch import Tensor, nn

__all__ = [
    "PROVIDERS",
    "SIGNALS",
    "TRAINER_SIGNALS",
    "ContinuationScorer",
    "NoReference",
    "PromptScorer",
    "ProviderContext",
    "SignalProvider",
    "register_provider",
    "register_signal",
    "signal_providers",
    "unregister_provider",
    "unregister_signal",
]

_SIGNALS: dict[str, str] = {
    # the trainers' own scoring pass computes these for any method that names them
    "values": "the critic: V of the state before each token, [N, L]",
    "student_logp": "the policy's log-probs of its own tokens (the batch's old log-probs), [N, L]",
    "entropy": "the policy's entropy at each of its tokens, [N, L]",
}
#: The signals a method's :class:`Needs` may name, each with what it holds (read-only; a method file or user code
#: adds one with :func:`register_signal`).
SIGNALS: Mapping[str, str] = MappingProxyType(_SIGNALS)

#: Signals the trainer's own scoring pass computes for every method.
TRAINER_SIGNALS = frozenset({"values", "student_logp", "entropy"})


def register_signal(name: str, description: str) -> str:
    """Make ``name`` a signal a method's :class:`Needs` may name; ``description`` says what it holds (a per-token
    ``[N, L]`` tensor, one entry per episode, or one value per batch). Registering a name again with the same
    description is a no-op (two methods may read one signal); another description is an error. Returns the name."""
    if not name or not name.replace("_", "a").isalnum() or not name[0].isalpha():
        raise ValueError(f"signal name {name!r}: letters, digits and '_', starting with a letter")
    if _SIGNALS.get(name, description) != description:
        raise ValueError(f"a signal called {name!r} is already registered: {_SIGNALS[name]}")
    _SIGNALS[name] = description
    return name


def unregister_signal(name: str) -> str:
    """Forget the signal ``name`` (one registered for a test or a notebook session); returns its description."""
    if name not in _SIGNALS:
        raise ValueError(f"no signal called {name!r} is registered")
    return _SIGNALS.pop(name)


#: ``score(contexts, continuations) -> lp`` with ``lp[i][j] = log p(continuations[i][j] | contexts[i] +
#: continuations[i][:j])`` under one model (token ids in, one list of log-probs per pair out)
ContinuationScorer = Callable[[Sequence[Sequence[int]], Sequence[Sequence[int]]], list[list[float]]]
#: ``score(batch, trees, prompts) -> [N, L]``: the log-probs of each row's policy tokens under one model, with the
#: prompt of the row's tree ``t`` replaced by the token ids ``prompts[t]`` (0 elsewhere)
PromptScorer = Callable[[Any, Sequence[Any], Mapping[int, Sequence[int]]], Tensor]


class NoReference(ValueError):
    """The run's task has no reference trajectory (no scripted demonstration) for its protocol."""


@dataclass(frozen=True)
class ProviderContext(ABC):
    """What a provider reads of the run, and what it may ask of the trainer's models.

    ``model`` is the live policy the update trains (a lagged teacher copies its weights), ``tokenizer`` its
    tokenizer, ``env`` the environment (its ``protocol`` and tools) and ``cfg`` the run's config. The methods are
    the capabilities a trainer implements (:class:`agentcredit.train.providers.RunContext`), each within the
    trainer's own memory limits (its micro-batch size) and padding."""

    model: nn.Module
    tokenizer: Any
    env: Any
    cfg: Any

    @abstractmethod
    def frozen_copy(self, model: nn.Module) -> nn.Module:
        """A copy of ``model`` that no update trains (eval mode, no gradient)."""

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """``text``'s token ids, without special tokens."""

    @abstractmethod
    def render_answer(self, answer: str) -> str:
        """``answer`` in the protocol's answer format (e.g. ``<answer>A</answer>``)."""

    @abstractmethod
    def score_continuations(
        self,
        model: nn.Module,
        contexts: Sequence[Sequence[int]],
        continuations: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
        autocast: bool = False,
    ) -> list[list[float]]:
        """log p(continuation token j | context, continuation < j) under ``model``, for each pair (no gradient)."""

    @abstractmethod
    def segment_contexts(self, batch: Any) -> list[list[list[int]]]:
        """Per trajectory of ``batch``, the exact token ids each of its policy segments was generated from (for the
        first the prompt, later the state right after an observation)."""

    @abstractmethod
    def logprobs_under_prompts(
        self,
        model: nn.Module,
        batch: Any,
        trees: Sequence[Any],
        prompts: Mapping[int, Sequence[int]],
        *,
        temperature: float = 1.0,
        autocast: bool = False,
    ) -> Tensor:
        """``[N, L]``: the log-probs under ``model`` of each row's policy tokens after the prompt ``prompts[t]`` of
        the row's tree ``t`` in place of the tree's own (the rest of the row kept as is; no gradient)."""

    @abstractmethod
    def reference_trajectories(self) -> Callable[[Any], str]:
        """``ref(example)``: the task's reference trajectory for an example as text (its scripted demonstration
        played through the protocol and tools, the prompt left out); :class:`NoReference` when there is none."""


class SignalProvider(ABC):
    """Computes the signals in :attr:`provides` for every batch; override what applies. It is made once per run,
    with the settings of the method part whose needs name its signal, and writes each signal into the batch's
    signals by name (``signals[name] = value``)."""

    provides: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, run: ProviderContext, settings: Any) -> None:
        self.run = run
        self.settings = settings

    @abstractmethod
    def fill(
        self,
        signals: Any,
        batch: Any,
        trees: list[Any],
        examples: Mapping[int, Any],
        *,
        temperature: float,
        autocast: bool,
    ) -> None:
        """Put this provider's signals for ``batch`` into ``signals`` (``examples[t]`` is tree t's question)."""

    def after_step(self, step: int) -> None:  # noqa: B027 (an optional hook, not abstract)
        """After the update of step ``step`` (1-based)."""

    def frozen_models(self) -> list[nn.Module]:
        return []

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: B027 (an optional hook)
        """Restore what :meth:`state_dict` saved (nothing, unless the provider keeps state)."""


_PROVIDERS: dict[str, type[SignalProvider]] = {}
#: The provider of each signal, by the signal's name (read-only; add with :func:`register_provider`).
PROVIDERS: Mapping[str, type[SignalProvider]] = MappingProxyType(_PROVIDERS)


def register_provider(
    provider: type[SignalProvider], *, replace_existing: bool = False
) -> type[SignalProvider]:
    """Make ``provider`` compute the signals in its ``provides`` for every run whose method needs one; returns it
    (usable as a class decorator). Each signal must be registered (:func:`register_signal`) and not one the trainer
    computes itself; a signal another provider computes is an error unless ``replace_existing``."""
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


def signal_providers(run: ProviderContext, needs: Any, settings: Mapping[str, Any]) -> list[SignalProvider]:
    """One provider per group of needed signals (``needs.signals``) the trainer does not compute itself, each given
    the settings of the part of the run's method (``run.cfg.algorithm.credit_method``) that needs it; a signal no
    provider computes is an error naming it."""
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
