"""The signals verl's agent loop scores for a method, keyed by the signal's name, never the method's.

A method's :class:`~agentcredit.credit.Needs` names the signals it reads. verl's trainer computes ``values``,
``student_logp`` and ``entropy`` itself, and a method's ``batch_signals`` hook derives per-batch ones from the others
(:mod:`.advantages`); a signal that needs the episode's text, its example or a teacher's scores is computed on the
worker that ran the episode, by the :class:`SignalScorer` registered here under the signal's name. The agent loop
runs the scorer of every signal the method needs, in registration order, and the value reaches the method's layout
as ``layout.signals[name]``.

Built in:

* ``potentials``: a teacher's potential Phi(S_k) at the prompt and after every tool turn, the log-likelihood of the
  gold answers (:func:`~.episode.answer_potentials`), scored by the method's teacher (:attr:`ScoringContext.teacher`)
  and pooled as the part's settings say (``potential_of``);
* ``teacher_logp``: a ground-truth-conditioned teacher's log-probs of every response token of every training view
  (:func:`~.episode.teacher_logprobs`), the teacher prompt built on the worker as the native trainer builds it.

Your own signal (one a method of yours names after :func:`agentcredit.credit.register_signal`) is scored on verl
with :func:`register_signal_scorer`, from a module the ``agentcredit.imports`` key names (every worker imports it
before it reads the method): its value, one JSON-able value per episode, travels in the row's record
(``RowRecord.signals``) and reaches the layout as ``layout.signals[name][j]`` for episode j.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from agentcredit.credit.signals import PROVIDERS
from agentcredit.environment import Environment
from agentcredit.integrations.verl.episode import EpisodeResult, answer_potentials, teacher_logprobs
from agentcredit.integrations.verl.scoring import TeacherScorer
from agentcredit.tasks import Example
from agentcredit.tools.base import ToolRuntime, ToolUnavailableError
from agentcredit.train.sft import ReferenceTrajectories

__all__ = [
    "SIGNAL_SCORERS",
    "ScoringContext",
    "SignalScorer",
    "register_signal_scorer",
    "signal_scorers",
    "unregister_signal_scorer",
]


@dataclass
class ScoringContext:
    """What a scorer reads of one episode on the worker that ran it."""

    settings: Any  # the ``agentcredit`` block (AgentCreditSettings)
    part: Any  # the settings of the method's part whose needs name the signal
    section: str  # that part's config section: its keys are ``agentcredit.<section>.<key>``
    example: Example  # the dataset row as the native trainer's example (question, answers, info)
    extra_info: Mapping[str, Any]  # the row's ``extra_info`` as verl passed it (prepare-data's fields)
    protocol: Any
    tokenizer: Any
    prompt_ids: list[int]
    prompt_text: str  # the prompt as the protocol rendered it
    episode: EpisodeResult
    views_response: list[list[int]]  # the response token ids of each training view, in view order
    tree_id: str | None  # the rollout tree the episode is a leaf of (None: independent episodes)
    runtime: ToolRuntime  # the worker's tools (a demonstration replays them)
    runtime_key: str  # the key of the worker's tool configuration (caches per configuration use it)
    outcome: Callable[[Example, str | None], float]  # the outcome reward of an answer to the example
    #: a new scorer on the rollout server (the current policy); the agent loop counts its calls in the record
    scorer: Callable[[], TeacherScorer]
    #: a new scorer on the method's teacher: the lagged teacher's replicas when it lags the policy, else the rollout
    #: server
    teacher: Callable[[], TeacherScorer]
    prepared: Any = None  # what ``prepare`` returned

    @property
    def golds(self) -> list[str]:
        return list(self.example.answers)


@dataclass(frozen=True)
class SignalScorer:
    """How the agent loop computes one signal for an episode.

    ``score(ctx)`` (async) returns the value, one per episode (``per_view``: one per training view). ``prepare(ctx)``
    (optional, in a worker thread, before the episode's outcome is scored, also for an episode a tool failed in:
    ``ctx.episode.infra_failures``) does the work that may itself call tools; a ``ToolUnavailableError`` it raises
    leaves the episode out as an infrastructure failure, its message recorded. ``field`` is the record field a
    built-in signal travels in (None: ``RowRecord.signals[name]``, one JSON-able value per episode)."""

    score: Callable[[ScoringContext], Awaitable[Any]]
    prepare: Callable[[ScoringContext], Any] | None = None
    per_view: bool = False
    field: str | None = None


_SCORERS: dict[str, SignalScorer] = {}
#: The scorer of each signal by name (read-only; add one with :func:`register_signal_scorer`).
SIGNAL_SCORERS: Mapping[str, SignalScorer] = MappingProxyType(_SCORERS)


def register_signal_scorer(
    name: str,
    score: Callable[[ScoringContext], Awaitable[Any]],
    *,
    prepare: Callable[[ScoringContext], Any] | None = None,
    replace_existing: bool = False,
) -> SignalScorer:
    """Score the signal ``name`` on verl's agent-loop workers with ``score(ctx)`` (async; one JSON-able value per
    episode, which the method's layout reads as ``layout.signals[name][j]``); ``prepare`` as
    :class:`SignalScorer`'s. A name already scored is an error unless ``replace_existing``. Returns the scorer."""
    from agentcredit.credit import SIGNALS

    if name not in SIGNALS:
        raise ValueError(
            f"no signal called {name!r} is registered: name it with agentcredit.credit.register_signal first"
        )
    if name in _SCORERS and not replace_existing:
        raise ValueError(f"the signal {name!r} already has a verl scorer")
    scorer = SignalScorer(score, prepare)
    _SCORERS[name] = scorer
    return scorer


def unregister_signal_scorer(name: str) -> SignalScorer:
    """Forget the scorer of ``name`` (one registered for a test or a notebook session); returns it."""
    if name not in _SCORERS:
        raise ValueError(f"the signal {name!r} has no verl scorer")
    return _SCORERS.pop(name)


def signal_scorers(signals: frozenset[str] | set[str]) -> list[tuple[str, SignalScorer]]:
    """The scorers of ``signals`` (a method's needs) that have one, in registration order."""
    return [(name, scorer) for name, scorer in _SCORERS.items() if name in signals]


# -- potentials: a teacher's log-likelihood of the gold answers at every tool turn's state --------------------------


async def _score_potentials(ctx: ScoringContext) -> list[float]:
    part = ctx.part
    return await answer_potentials(
        ctx.episode.boundaries,
        ctx.golds,
        tokenizer=ctx.tokenizer,
        score=ctx.teacher(),
        potential=part.potential_of,
        answer_template=part.answer_template,
        scope=part.potential_scope,
        max_aliases=part.max_aliases,
    )


_SCORERS["potentials"] = SignalScorer(_score_potentials, field="potentials")


# -- teacher_logp: a ground-truth-conditioned teacher's log-probs of the student's own tokens -----------------------

#: The reference trajectories per worker process and tool configuration (each example played once, kept).
_REFERENCES: dict[str, ReferenceTrajectories] = {}


def reference_trajectories(ctx: ScoringContext) -> ReferenceTrajectories:
    """The native trainer's :class:`~agentcredit.train.sft.ReferenceTrajectories` on this worker: the task's
    scripted demonstration played through the worker's own protocol and tools, so tau* reads exactly as on the
    native trainer (the same function builds it)."""
    if ctx.runtime_key not in _REFERENCES:
        env = Environment(
            protocol=ctx.protocol,
            tools=ctx.runtime,
            # the demonstration is scored as an episode is; tau* is its text, whatever the score
            reward=ctx.outcome,
            corpus=None,
        )
        try:
            _REFERENCES[ctx.runtime_key] = ReferenceTrajectories(env, ctx.tokenizer, ctx.settings.protocol)
        except ValueError as exc:
            key = f"{ctx.section}.reference=answer"
            raise ValueError(str(exc).replace(f"algorithm.{key}", f"agentcredit.{key}")) from None
    return _REFERENCES[ctx.runtime_key]


def teacher_prompt_ids(ctx: ScoringContext) -> list[int]:
    """The teacher prompt as the native trainer builds it (the ``teacher_prompt`` of the native provider of
    ``teacher_logp``):
    the student's prompt text with the ground truth inserted by the template, tokenized without special tokens. The
    ground truth is tau* (``reference: trajectory``, the paper's §3.3) or the rendered gold answer (``answer``, a
    variant), after the example's worked solution when it has one."""
    part, reference = ctx.part, None
    if part.reference == "trajectory":
        reference = reference_trajectories(ctx)(ctx.example)
    provider = PROVIDERS["teacher_logp"]
    if not callable(getattr(provider, "teacher_prompt", None)):  # a user's provider registered in its place
        raise ValueError(
            f"{provider.__name__} provides teacher_logp without a teacher_prompt(protocol, tokenizer, example, "
            "template, reference=, student_prompt=), which verl's workers build the teacher prompt with: give it "
            "one, or score teacher_logp on verl with your own register_signal_scorer('teacher_logp', ..., "
            "replace_existing=True)"
        )
    text = provider.teacher_prompt(
        ctx.protocol,
        ctx.tokenizer,
        ctx.example,
        part.template,
        reference=reference,
        student_prompt=ctx.prompt_text,
    )
    return list(ctx.tokenizer(text, add_special_tokens=False)["input_ids"])


def _prepare_teacher_prompt(ctx: ScoringContext) -> list[int] | None:
    if ctx.part.reference == "trajectory" and not isinstance(ctx.extra_info.get("example_info"), str):
        raise ValueError(
            f"agentcredit.{ctx.section}.reference=trajectory conditions the teacher on the task's scripted "
            "demonstration, which reads the example's "
            "info, and this row has none: write the data with `python -m agentcredit.integrations.verl "
            f"prepare-data` (extra_info.example_info), or set agentcredit.{ctx.section}.reference=answer"
        )
    if ctx.episode.infra_failures:  # not scored: no teacher calls
        return None
    try:  # tau* plays the task's demonstration through the worker's tools
        return teacher_prompt_ids(ctx)
    except ToolUnavailableError as exc:
        raise ToolUnavailableError(f"the teacher's reference trajectory: {exc}") from None


async def _score_teacher_logprobs(ctx: ScoringContext) -> list[list[float]]:
    return await teacher_logprobs(ctx.prepared, ctx.views_response, score=ctx.scorer())


_SCORERS["teacher_logp"] = SignalScorer(
    _score_teacher_logprobs, prepare=_prepare_teacher_prompt, per_view=True, field="teacher_logprobs"
)
