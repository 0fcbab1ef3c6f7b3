"""The protocol interface: one text format an agent speaks.

A protocol turns a question into a prompt, tells the engine where a policy segment ends, reads each finished
segment (its kind, the tool calls in it, whether the episode is over, the answer), and renders tool results as
the observation the model sees next. It never executes anything: the engine runs the tool calls it returns in
a :class:`~agentcredit.tools.base.ToolRuntime`.

The engine drives an episode like this::

    state = protocol.new_episode(question)
    ids = tokenize(protocol.prompt(state, tokenizer))
    while True:
        budget = protocol.max_new_tokens(state, default)
        generate tokens until protocol.segment_ends(state, text) or EOS or budget is spent
            # segment_ends is called after EVERY sampled token, with the segment's text so far
            # (vLLM-style backends may stop at protocol.stop_strings(state) first and confirm with it)
        turn = protocol.read_segment(state, text, finish_reason)       # kind, calls, done, answer, info
        protocol.record(state, turn, text)                             # (the engine calls this)
        if turn.done: break
        results = tools.run(turn.calls)                                # may be [] (no calls)
        obs = protocol.observation(state, turn, results)               # text + transient flag, or None
        if turn.drop_transient: remove the last transient observation from the context
        if obs: append obs tokens (tokenised alone, never re-rendering the chat template)

``turn.info`` is final only once ``observation`` has returned: a protocol may complete it there with what
the tool results say (jsoncall's formatting reward counts tool-side ``ERROR:`` results), so copy it into the
segment after that call.

Malformed output never raises: the protocol returns a turn whose observation explains the problem, or ends
the episode with no answer.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentcredit.tools.base import ToolCall, ToolResult

FinishReason = Literal["stop", "eos", "length"]


@dataclass
class Turn:
    """What the protocol read in one finished policy segment.

    ``info`` holds plain JSON-able values. Keys the protocols use: ``finish`` (why generation stopped),
    ``error`` (what was wrong with the output), ``truncated`` (the token budget cut the segment), ``cut``
    (the episode hit its segment cap), ``format_reward`` / ``format_reward_raw`` (jsoncall).
    """

    kind: str  # segment label: invoke / assimilate / commit / search / read / answer / step ...
    calls: list[ToolCall] = field(default_factory=list)
    done: bool = False  # the episode ends after this segment
    answer: str | None = None  # the extracted final answer, when done
    # After this segment, remove the last transient observation from the context (carl-segment replacement).
    drop_transient: bool = False
    info: dict[str, Any] = field(default_factory=dict)  # e.g. {"format_reward": 0.5, "error": "..."}


@dataclass
class Observation:
    """Environment text appended after a turn. ``transient``: visible only to the next policy segment."""

    text: str
    transient: bool = False
    kind: str = "observation"


@dataclass
class EpisodeState:
    """What a protocol may look at when deciding about the next segment of one episode."""

    question: str
    turns: list[Turn] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # generated text of each policy segment
    n_tool_calls: int = 0
    # Protocol-private scratch space. Protocols replace its values and never mutate them in place (the engine
    # deep-copies a state when a tree forks, so either way no branch sees another's changes).
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n_turns(self) -> int:
        return len(self.turns)

    @property
    def last(self) -> Turn | None:
        return self.turns[-1] if self.turns else None


class Protocol(ABC):
    """Base class of the text formats (``codefence``, ``tags``, ``jsoncall``)."""

    name: str = "base"
    #: Maximum number of policy segments in an episode (then the episode is cut with no answer).
    max_segments: int = 16

    # -- prompt -------------------------------------------------------------------------------------------
    def new_episode(self, question: str, **extra: Any) -> EpisodeState:
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{self.name}: the question must be a non-empty string, got {question!r}")
        return EpisodeState(question=question, extra=dict(extra))

    @abstractmethod
    def messages(self, state: EpisodeState) -> list[dict[str, str]]:
        """Chat messages (system + user) that start the episode."""

    def prompt(self, state: EpisodeState, tokenizer: Any) -> str:
        """The prompt text. Default: the tokenizer's chat template with a generation prompt."""
        return tokenizer.apply_chat_template(self.messages(state), tokenize=False, add_generation_prompt=True)

    # -- generation control -------------------------------------------------------------------------------
    @abstractmethod
    def segment_ends(self, state: EpisodeState, text: str) -> bool:
        """True when ``text`` (the current segment's text so far) ends the segment at its last token.

        Called after every sampled token, so it must be cheap: implementations look at the tail of ``text``
        (a stop can only have appeared in the last token) and parse more only when the tail says so.
        """

    def stop_strings(self, state: EpisodeState) -> list[str]:
        """Strings that can end the next segment, for backends with native stop strings (vLLM).

        A hit is a candidate only: confirm it with :meth:`segment_ends` (a closing code fence, for example,
        ends a carl-segment invoke only when it closes an open ```python block). Empty: EOS or budget only.
        """
        return []

    def max_new_tokens(self, state: EpisodeState, default: int) -> int:
        """Token budget of the next segment (e.g. carl-segment's T_assimilate = 256 after a tool output)."""
        return default

    # -- reading output -----------------------------------------------------------------------------------
    @abstractmethod
    def read_segment(self, state: EpisodeState, text: str, finish: FinishReason) -> Turn:
        """Classify a finished segment and extract its tool calls / answer. Must not raise."""

    def record(self, state: EpisodeState, turn: Turn, text: str) -> None:
        """Update the episode state after a turn (called by the engine)."""
        state.turns.append(turn)
        state.texts.append(text)
        state.n_tool_calls += len(turn.calls)

    @abstractmethod
    def observation(
        self, state: EpisodeState, turn: Turn, results: Sequence[ToolResult]
    ) -> Observation | None:
        """Text to append after the turn's tool calls ran (None if nothing is appended)."""

    @abstractmethod
    def extract_answer(self, text: str) -> str | None:
        """The final answer in a piece of generated text, or None."""

    @abstractmethod
    def render_answer(self, answer: str) -> str:
        """``answer`` written the way this protocol's final answer is written (TIPS potentials score this
        continuation; GEAR's teacher sees the ground truth in it). ``extract_answer`` inverts it."""


def check_results(protocol: str, turn: Turn, results: Sequence[ToolResult]) -> None:
    """Raise if the engine passed a different number of results than the turn has calls (an engine bug)."""
    if len(results) != len(turn.calls):
        raise ValueError(
            f"{protocol}: observation() got {len(results)} tool results for a {turn.kind!r} turn with "
            f"{len(turn.calls)} calls; pass tools.run(turn.calls) in call order"
        )


def episode_cap(max_turns: int | None, max_segments: int) -> int:
    """Assistant messages an episode may have: ``rollout.max_turns`` and the protocol's ``max_segments`` both cap
    it (the engine ends the episode at the first, the protocol cuts its last message at the second), so the smaller
    applies. This is the documented precedence; :func:`warn_on_two_caps` says so when they differ."""
    return min(max_turns or max_segments, max_segments)


def warn_on_two_caps(max_turns: int, max_segments: int, segments_set: bool) -> None:
    """One warning when ``rollout.max_turns`` and the protocol's ``max_segments`` differ: the smaller silently cuts
    every episode that needs more (a task needing 4 messages under a cap of 3 scored 0 everywhere)."""
    if max_turns == max_segments:
        return
    where = "protocol.options.max_segments" if segments_set else "the protocol's default max_segments"
    warnings.warn(
        f"rollout.max_turns={max_turns} and {where}={max_segments} both cap an episode's assistant messages; the "
        f"smaller, {episode_cap(max_turns, max_segments)}, applies (an episode needing more ends without an "
        "answer). Set both to the same value to silence this",
        EpisodeCapWarning,
        stacklevel=3,
    )


class EpisodeCapWarning(UserWarning):
    """``rollout.max_turns`` and the protocol's ``max_segments`` differ (see :func:`episode_cap`)."""
