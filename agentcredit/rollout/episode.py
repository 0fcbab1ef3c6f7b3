"""One episode's decisions, whoever generates its tokens: the state machine the rollout drivers share.

A driver (verl's agent loop against its server, :class:`~agentcredit.integrations.verl.episode.TreeRunner`; the
native engine's pure checks, :mod:`agentcredit.rollout.engine`) generates the tokens and runs the tools; this
module decides everything else, in one place:

* a segment's token budget (the protocol's, the episode's generated-token cap, the context cap);
* where a segment ends (:func:`token_finish` token by token; :func:`first_end` over a chunk a server returned,
  which may run past the end: the tokens after the first confirmed end are dropped, exactly);
* what a finished segment does to the episode (:meth:`EpisodeMachine.end_segment`): the protocol reads it, the
  caps are applied (:func:`episode_end`: the answer, the turn cap, the token cap, the context cap), a transient
  observation is dropped from the context (carl-segment's replacement, Eqs. 8-9), its tool calls go out;
* what the tool results do (:meth:`EpisodeMachine.tool_results`): an infrastructure failure ends the episode
  unseen, an environment that ends the episode records its results unshown, otherwise the protocol's observation
  is appended if it fits the context (:func:`observation_fits`);
* where the episode pauses for a tree strategy (a job's ``max_steps``) and what state a later job continues from.

The context is the tree path minus transient observations a policy segment followed (:func:`visible_nodes`,
the definition :meth:`~agentcredit.rollout.tree.RolloutTree.training_views` trains on).
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from agentcredit.protocols.base import EpisodeState, FinishReason, Protocol, Turn
from agentcredit.rollout.tree import RolloutTree, Segment
from agentcredit.tools.base import ToolCall, ToolResult
from agentcredit.tools.episodes import StepOutcome

#: Why an episode ended. ``done``: the protocol's answer; ``env_done``: the environment ended it; ``max_turns``,
#: ``max_tokens``, ``context``: a cap; ``infra``: a tool could not run; ``empty``: the generator returned nothing.
EndReason = Literal["done", "env_done", "max_turns", "max_tokens", "context", "infra", "empty"]
#: The ends at which the protocol (or the environment) finished the episode rather than a cap cutting it.
FINISHED: frozenset[str] = frozenset({"done", "env_done"})


@dataclass(frozen=True)
class EpisodeLimits:
    """The caps of an episode.

    Attributes:
        max_segment_tokens: the default budget of a policy segment (the protocol may lower it).
        max_context: tokens of the whole context (prompt, visible segments and observations) at most; verl's
            response budget is this cap at prompt length + ``response_length``.
        max_turns: policy segments from the root (a job may lower it).
        max_episode_tokens: generated policy tokens from the root (forks included); None: no such cap.
    """

    max_segment_tokens: int
    max_context: int
    max_turns: int
    max_episode_tokens: int | None = None


@dataclass
class NodeState:
    """What a job continuing from a node needs: the protocol state and the policy tokens on the path."""

    state: EpisodeState
    generated: int


@dataclass(frozen=True)
class Next:
    """What the driver does next. ``generate``: a segment of at most ``budget`` tokens; ``tools``: run ``calls``
    and give :meth:`EpisodeMachine.tool_results` their results; ``pause``: the job's steps are done, the episode
    goes on in a later job; ``end``: the episode ended (``reason``)."""

    action: Literal["generate", "tools", "pause", "end"]
    budget: int = 0
    calls: tuple[ToolCall, ...] = ()
    reason: str | None = None


# ---------------------------------------------------------------------------------------------------------
# Pure decisions


def visible_nodes(tree: RolloutTree, node: int) -> list[int]:
    """The nodes whose tokens form the context at ``node``: its path minus every transient observation a policy
    segment followed (visible to exactly one policy segment: carl-segment Eqs. 8-9)."""
    out: list[int] = []
    pending: int | None = None
    for i in tree.path(node):
        seg = tree.segment(i)
        if seg.role == "policy" and pending is not None:
            out.remove(pending)
            pending = None
        out.append(i)
        if seg.transient:
            pending = i
    return out


def segment_budget(
    protocol: Protocol, state: EpisodeState, limits: EpisodeLimits, generated: int, context: int
) -> int:
    """Tokens the next policy segment may have: the protocol's budget (e.g. carl-segment's T_assimilate), what is
    left of the episode's generated tokens, and of the context (``context`` tokens in it now). 0 or less: the
    episode cannot go on."""
    budget = protocol.max_new_tokens(state, limits.max_segment_tokens)
    if budget < 1:
        raise ValueError(f"{protocol.name}.max_new_tokens returned {budget}; a segment needs >= 1 token")
    if limits.max_episode_tokens is not None:
        budget = min(budget, limits.max_episode_tokens - generated)
    return min(budget, limits.max_context - context)


def token_finish(
    protocol: Protocol,
    state: EpisodeState,
    token: int,
    text: str,
    n_tokens: int,
    budget: int,
    stop_ids: frozenset[int],
) -> FinishReason | None:
    """Whether the segment ends at its last token ``token`` (``n_tokens`` so far, ``text`` their decoding): a stop
    token (``eos``), the protocol's end (``stop``), the budget (``length``), or None: it goes on."""
    if token in stop_ids:
        return "eos"
    if protocol.segment_ends(state, text):
        return "stop"
    if n_tokens >= budget:
        return "length"
    return None


def _candidate_ends(
    protocol: Protocol, state: EpisodeState, tokenizer: Any, prefix: list[int], new: list[int]
) -> Iterator[int]:
    """Positions i (1-based over ``new``) where the segment prefix + new[:i] may end, cheapest check first.

    The per-token pieces (one batch decode) approximate the text; every hit is confirmed on the exact decoding
    of the whole prefix, so the approximation only decides where to look.
    """
    text = tokenizer.decode(prefix, skip_special_tokens=True) if prefix else ""
    pieces = tokenizer.batch_decode([[t] for t in new], skip_special_tokens=True)
    for i, piece in enumerate(pieces, start=1):
        text += piece
        if protocol.segment_ends(state, text):
            yield i


def first_end(
    protocol: Protocol, state: EpisodeState, tokenizer: Any, prefix: list[int], new: list[int]
) -> int | None:
    """The first i such that the segment ``prefix + new[:i]`` ends (the protocol's ``segment_ends`` on its text
    decoded without special tokens), or None. For a generator that returns a chunk and may run past the end:
    dropping the tokens after it is exact (each kept token was sampled from the distribution it would have been
    sampled from had generation stopped there)."""
    for i in _candidate_ends(protocol, state, tokenizer, prefix, new):
        if protocol.segment_ends(state, tokenizer.decode(prefix + new[:i], skip_special_tokens=True)):
            return i
    # The exact text may end a segment where the pieces did not (multi-byte characters): check the full text.
    if new and protocol.segment_ends(state, tokenizer.decode(prefix + new, skip_special_tokens=True)):
        for i in range(1, len(new) + 1):
            if protocol.segment_ends(state, tokenizer.decode(prefix + new[:i], skip_special_tokens=True)):
                return i
    return None


def episode_end(
    turn: Turn, state: EpisodeState, limits: EpisodeLimits, max_turns: int, generated: int, context: int
) -> EndReason | None:
    """Whether the episode ends after a policy segment (before its calls run): the protocol's answer, the turn cap
    (``max_turns``: the limits' or a job's lower one), the generated-token cap, or the context cap (``context``:
    the context's tokens with the segment, a transient observation before it still counted)."""
    if turn.done:
        return "done"
    if state.n_turns >= max_turns:
        return "max_turns"
    if limits.max_episode_tokens is not None and generated >= limits.max_episode_tokens:
        return "max_tokens"
    if context >= limits.max_context:
        return "context"
    return None


def observation_fits(context: int, n_tokens: int, max_context: int) -> bool:
    """Whether an observation of ``n_tokens`` fits after ``context`` tokens and leaves one to generate."""
    return context + n_tokens + 1 <= max_context


def infra_failures_of(results: list[ToolResult]) -> list[str]:
    """``"tool: output"`` of the results that are infrastructure failures (the tool could not run)."""
    return [f"{r.name}: {r.output[:500]}" for r in results if r.infra]


# ---------------------------------------------------------------------------------------------------------
# The state machine


@dataclass
class EpisodeMachine:
    """One job of an episode (from ``node`` of ``tree``) as state transitions; the driver generates and runs tools.

    Start with :meth:`next_segment`; give each generated segment to :meth:`end_segment` and each tool step's results
    to :meth:`tool_results`; each returns what to do :class:`Next`. ``encode(text)`` tokenises an observation alone
    (contexts only grow by appending token ids). ``states``: where the state after every step is kept for later jobs
    (a tree strategy forks from them); None keeps none.
    """

    protocol: Protocol
    tree: RolloutTree
    node: int
    start: NodeState
    limits: EpisodeLimits
    encode: Callable[[str], list[int]]
    max_turns: int | None = None  # the job's own turn cap (lower than the limits')
    max_steps: int | None = None  # pause after this many policy segments (and their observation)
    states: dict[int, NodeState] | None = None
    # filled as the episode goes
    state: EpisodeState = field(init=False)
    generated: int = field(init=False)
    visible: list[int] = field(init=False)
    pending_transient: int | None = field(init=False, default=None)
    turn: Turn | None = field(init=False, default=None)
    added: list[int] = field(init=False, default_factory=list)
    steps: int = field(init=False, default=0)
    spliced: int | None = field(init=False, default=None)  # the transient node the last segment dropped
    reason: str | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.state = copy.deepcopy(self.start.state)
        self.generated = self.start.generated
        self.visible = visible_nodes(self.tree, self.node)
        last = self.tree.segment(self.visible[-1])
        self.pending_transient = self.visible[-1] if last.transient else None
        job_cap = self.max_turns or self.limits.max_turns
        self.max_turns = min(self.limits.max_turns, job_cap)

    # -- the context
    def context_ids(self) -> list[int]:
        return [t for i in self.visible for t in self.tree.segment(i).token_ids]

    def context_length(self) -> int:
        return sum(len(self.tree.segment(i).token_ids) for i in self.visible)

    # -- transitions
    def next_segment(self) -> Next:
        """Generate the next policy segment (its budget), or end the episode when no token is left."""
        budget = segment_budget(self.protocol, self.state, self.limits, self.generated, self.context_length())
        if budget < 1:
            return self._end("context")
        return Next("generate", budget=budget)

    def end_segment(
        self,
        ids: list[int],
        text: str,
        finish: FinishReason,
        logprobs: list[float] | None = None,
        entropies: list[float | None] | None = None,
    ) -> Next:
        """A policy segment was generated: the protocol reads it, the caps apply, its calls go out."""
        if not ids:  # the generator returned nothing (aborted): nothing more will come
            return self._end("empty")
        protocol = self.protocol
        turn = protocol.read_segment(self.state, text, finish)
        protocol.record(self.state, turn, text)
        self.generated += len(ids)
        segment = Segment(
            ids,
            text,
            role="policy",
            kind=turn.kind,
            logprobs=logprobs,
            entropies=entropies,  # type: ignore[arg-type]
            info={"finish": finish, "calls": [c.to_dict() for c in turn.calls]},
        )
        self.node = self.tree.add(segment, self.node)
        self.turn = turn
        self.added.append(self.node)
        self.steps += 1
        context = self.context_length() + len(ids)
        end = episode_end(turn, self.state, self.limits, self.max_turns, self.generated, context)  # type: ignore[arg-type]
        if end is not None:
            segment.info.update(turn.info)
            return self._end(end)
        self.spliced = None
        if self.pending_transient is not None:  # replacement: the raw output leaves the context
            self.visible.remove(self.pending_transient)
            self.spliced, self.pending_transient = self.pending_transient, None
            segment.info["spliced"] = True
        self.visible.append(self.node)
        if turn.calls:
            return Next("tools", calls=tuple(turn.calls))
        return self._observe([])

    def tool_results(self, outcome: list[ToolResult] | StepOutcome) -> Next:
        """The segment's calls ran: their results (or a per-episode environment's step)."""
        turn, info = self.turn, self.tree.segment(self.node).info
        assert turn is not None
        step = outcome if isinstance(outcome, StepOutcome) else None
        results = list(step.results if step is not None else outcome)  # type: ignore[union-attr]
        infra = infra_failures_of(results)
        if infra:
            # a tool could not run (the machine's failure, not the model's): the model never reads the error, the
            # episode ends here, marked, to be left out of the credit and the loss
            info.update(turn.info)
            info["results"] = [r.to_dict() for r in results]
            self.tree.nodes[self.node].info["infra_failures"] = infra
            return self._end("infra")
        if step is not None:
            info["env_reward"] = step.reward
        if (
            step is not None and step.done
        ):  # the environment ended the episode: its results are recorded, not shown
            # observation() still completes turn.info (chat's formatting reward counts failed calls)
            self.protocol.observation(self.state, turn, results)
            info.update(turn.info)
            info["results"] = [r.to_dict() for r in results]
            return self._end("env_done")
        return self._observe(results)

    def _observe(self, results: list[ToolResult]) -> Next:
        turn, tree = self.turn, self.tree
        assert turn is not None
        observation = self.protocol.observation(self.state, turn, results)
        info = tree.segment(self.node).info
        info.update(turn.info)  # final only now (protocols may complete it from the results)
        if results:
            info["results"] = [r.to_dict() for r in results]
        if observation is not None and observation.text:
            ids = list(self.encode(observation.text))
            if not observation_fits(self.context_length(), len(ids), self.limits.max_context):
                info["context_overflow"] = len(ids)
                return self._end("context")
            obs = Segment(
                ids,
                observation.text,
                role="observation",
                kind=observation.kind,
                transient=observation.transient,
            )
            self.node = tree.add(obs, self.node)
            self.added.append(self.node)
            self.visible.append(self.node)
            if observation.transient:
                self.pending_transient = self.node
        if self.states is not None:  # every state is one a later job may fork from
            self.states[self.node] = NodeState(copy.deepcopy(self.state), self.generated)
        if self.max_steps is not None and self.steps >= self.max_steps:
            return Next("pause")
        return self.next_segment()

    def _end(self, reason: EndReason) -> Next:
        turn = self.turn
        self.reason = reason
        answer = turn.answer if (turn is not None and turn.done) else None
        self.tree.nodes[self.node].info.update(
            {
                "answer": answer,
                "finish": reason,
                "n_tool_calls": self.state.n_tool_calls,
                "n_turns": self.state.n_turns,
                "generated_tokens": self.generated,
            }
        )
        return Next("end", reason=reason)


def boundaries(tree: RolloutTree, leaf: int) -> list[list[int]]:
    """The contexts S_0, S_1, ... of the episode ending at ``leaf``: the prompt, then the context right after each
    observation (exact token ids, as the policy saw them; TIPS scores its potentials there)."""
    out = []
    for node in tree.path(leaf):
        if node == 0 or tree.segment(node).role == "observation":
            out.append([t for i in visible_nodes(tree, node) for t in tree.segment(i).token_ids])
    return out


@dataclass
class Generation:
    """What a generator returned for one request: sampled tokens and (optionally) their log-probs."""

    token_ids: list[int]
    log_probs: list[float] | None = None


#: ``generate(context_ids, max_new_tokens, stop_strings) -> Generation``: a server that samples a chunk (it may stop
#: at a stop string, at a stop token or at the budget, or run past the segment's end).
ChunkFn = Callable[[list[int], int, list[str]], Awaitable[Generation]]


async def generate_segment(
    protocol: Protocol,
    state: EpisodeState,
    tokenizer: Any,
    generate: ChunkFn,
    context: list[int],
    budget: int,
    eos_token_ids: frozenset[int],
) -> tuple[list[int], list[float] | None, FinishReason]:
    """Sample one policy segment from a chunk server: its tokens, their log-probs (if the server gives them) and the
    finish reason. A server with native stop strings stops at ``protocol.stop_strings(state)``; every stop is only
    a candidate, confirmed by :func:`first_end`, and an unconfirmed one (a closing fence that closes no python
    block) just continues the segment. The tokens after the first confirmed end are dropped."""
    ids: list[int] = []
    logprobs: list[float] | None = []
    stops = list(protocol.stop_strings(state))
    while True:
        out = await generate(context + ids, budget - len(ids), stops)
        new = list(out.token_ids)
        if out.log_probs is None:
            logprobs = None
        elif logprobs is not None:
            if len(out.log_probs) != len(new):
                raise ValueError(f"the server returned {len(out.log_probs)} log-probs for {len(new)} tokens")
        if not new:
            return ids, logprobs, "length"  # aborted or empty: nothing more will come
        cut = first_end(protocol, state, tokenizer, ids, new)
        keep = new if cut is None else new[:cut]
        ids.extend(keep)
        if logprobs is not None:
            logprobs.extend(out.log_probs[: len(keep)])  # type: ignore[index]
        if cut is not None:
            return ids, logprobs, "stop"
        if new[-1] in eos_token_ids:
            return ids, logprobs, "eos"
        if len(ids) >= budget or not stops:
            return ids, logprobs, "length"
        # stopped at a stop string the protocol did not confirm: the segment goes on from here
