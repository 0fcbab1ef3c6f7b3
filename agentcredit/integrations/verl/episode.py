"""One episode of an agentcredit protocol against a token-in/token-out generation server.

This is the server half of the verl agent loop: :class:`TreeRunner` generates each policy segment on the server
(:func:`agentcredit.rollout.episode.generate_segment`: the server's stop strings are candidates the protocol
confirms, tokens past the first confirmed end are dropped) and runs the tools, while the episode's decisions (segment
ends, caps, tool failures, the transient replacement, pauses) are the shared state machine's
(:class:`agentcredit.rollout.episode.EpisodeMachine`). Contexts are built by appending token ids (never re-rendering
a chat template), and the episode comes back as a :class:`~agentcredit.rollout.tree.RolloutTree`.
:func:`episode_rows` then lays it out as verl rows (one per training view) with the
:class:`~agentcredit.integrations.verl.fields.RowRecord` the trainer reads.

Teacher scores. :func:`answer_potentials` (TIPS's) and :func:`teacher_logprobs` (GEAR's) ask a scorer for the
log-probs of a continuation after a context (:mod:`agentcredit.integrations.verl.scoring`: verl's inference
server, reading the context from its prefix cache).
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentcredit.credit import answer_token_span
from agentcredit.integrations.verl.fields import RowRecord, Span
from agentcredit.protocols.base import EpisodeState, Protocol
from agentcredit.rollout.engine import Job, JobResult, PlanContext, Strategy, advance_plan
from agentcredit.rollout.episode import (
    FINISHED,
    EpisodeLimits,
    EpisodeMachine,
    Generation,
    NodeState,
    boundaries,
    generate_segment,
)
from agentcredit.rollout.tree import FlatSequence, RolloutTree, Segment
from agentcredit.tools.base import ToolCall, ToolResult, ToolUnavailableError
from agentcredit.tools.episodes import StepOutcome

__all__ = [
    "EpisodeResult",
    "Generation",
    "answer_potentials",
    "continuation_logprobs",
    "episode_rows",
    "TreeRunner",
    "run_tree",
    "teacher_logprobs",
]


#: ``generate(context_ids, sampling_params, branch) -> Generation``; ``branch`` is the index of the job in its tree
#: (None for a single episode), so concurrent branches can carry request ids of their own where ids must differ.
GenerateFn = Callable[[list[int], dict[str, Any], int | None], Awaitable[Generation]]
#: ``score(context, continuation) -> lp`` with ``lp[i] = log p(continuation[i] | context + continuation[:i])``
#: (:data:`agentcredit.integrations.verl.scoring.ContinuationScoreFn`).
ScoreFn = Callable[[list[int], list[int]], Awaitable[list[float]]]
#: ``run_tools(calls) -> results`` in call order.
# the calls' results, or a per-episode environment's whole step (results, done, reward)
RunToolsFn = Callable[[list[ToolCall]], Awaitable[list[ToolResult] | StepOutcome]]


@dataclass
class EpisodeResult:
    """What the agent loop returns for one episode: its rollout tree (one path) and leaf, the answer, and what the
    credit methods need; :func:`episode_rows` lays it out as verl rows."""

    tree: RolloutTree
    leaf: int
    answer: str | None
    prompt_length: int
    boundaries: list[list[int]] = field(default_factory=list)  # contexts S_0, S_1, ... after each observation
    finished: bool = True  # False: cut by the response budget before the protocol ended the episode
    # "tool: output" of the tool calls that could not run (ToolResult.infra: search server down or timed out, sandbox
    # died): the episode ended there, before its observation, and is not trained on or scored (:func:`episode_rows`)
    infra_failures: list[str] = field(default_factory=list)

    def policy_nodes(self) -> list[int]:
        return [i for i in self.tree.path(self.leaf) if self.tree.segment(i).is_policy]

    def tool_turns(self) -> list[int]:
        """Policy segments (episode order) directly followed by an observation."""
        path = self.tree.path(self.leaf)
        out, k = [], -1
        for a, b in zip(path, path[1:] + [None], strict=True):
            if self.tree.segment(a).is_policy:
                k += 1
                if b is not None and self.tree.segment(b).role == "observation":
                    out.append(k)
        return out


async def run_tree(
    runner: TreeRunner, strategy: Strategy, rng: random.Random, max_turns: int
) -> list[EpisodeResult]:
    """The episodes of ``strategy``'s tree (PORTool's, carl-critical's entropy-guided forking), one per leaf.

    The strategy is the native engine's own (:mod:`agentcredit.rollout.strategies`): it yields jobs ("continue
    from node v for at most k steps") and reads their results. The jobs of one round run concurrently; every
    request of the tree carries the caller's routing id, so one replica's prefix cache serves all its branches.
    """
    plan = strategy.plan(PlanContext(runner.tree, rng, max_turns))
    step = advance_plan(plan, None, f"strategy {strategy.name}")
    while step.jobs:
        results = list(await asyncio.gather(*(runner.run_job(job) for job in step.jobs)))
        step = advance_plan(plan, results, f"strategy {strategy.name}")
    final = step.final if step.final is not None else runner.tree
    return [runner.episode(final, leaf) for leaf in final.leaves()]


def fork_counts(tree: RolloutTree) -> dict[int, int]:
    """An entropy-guided tree's forks per state (``tree.info["fork_counts"]``, keyed by state node), keyed by the
    policy node the state follows (0 for the prompt): the step a decision tree knows the state by."""
    out: dict[int, int] = {}
    for state, count in tree.info.get("fork_counts", {}).items():
        node = int(state)
        while node != 0 and tree.segment(node).role != "policy":
            node = tree.parent(node)
        out[node] = out.get(node, 0) + int(count)
    return out


class TreeRunner:
    """Grows one rollout tree against the server: :meth:`run_job` continues the episode at a node.

    A single episode is one job from the root (:meth:`run_episode`); a tree strategy runs many
    (:func:`run_tree`). The episode's decisions (segment ends, caps, tool failures, the transient replacement,
    pauses) are :class:`~agentcredit.rollout.episode.EpisodeMachine`'s; this runner generates the segments on the
    server and runs the tools. The response budget is the machine's context cap at prompt + ``max_response_tokens``.
    """

    def __init__(
        self,
        protocol: Protocol,
        state: EpisodeState,
        prompt_ids: list[int],
        *,
        tokenizer: Any,
        generate: GenerateFn,
        run_tools: RunToolsFn,
        sampling_params: dict[str, Any],
        max_segment_tokens: int,
        max_response_tokens: int,
        eos_token_ids: Sequence[int] = (),
        branching: bool = False,
    ):
        if not prompt_ids:
            raise ValueError("TreeRunner: the prompt is empty")
        self.protocol, self.tokenizer, self.generate, self.run_tools = (
            protocol,
            tokenizer,
            generate,
            run_tools,
        )
        self.sampling_params = sampling_params
        self.limits = EpisodeLimits(
            max_segment_tokens=max_segment_tokens,
            max_context=len(prompt_ids) + max_response_tokens,
            max_turns=protocol.max_segments,
        )
        self.eos = frozenset(int(t) for t in eos_token_ids)
        self.prompt_length = len(prompt_ids)
        self.tree = RolloutTree(Segment(list(prompt_ids), role="prompt", kind="prompt"))
        self.states = {0: NodeState(state, 0)}
        self.branching = (
            branching  # keep every state for later jobs (a tree strategy); one episode needs none
        )
        self.jobs = 0  # jobs run so far: a tree's branch index (the request-id suffix under full determinism)

    async def run_episode(self) -> EpisodeResult:
        """One episode from the prompt (a single job from the root)."""
        return self.episode(self.tree, (await self.run_job(Job(0))).end)

    def episode(self, tree: RolloutTree, leaf: int) -> EpisodeResult:
        """The episode ending at ``leaf`` of ``tree`` (this runner's tree, or the strategy's pruned copy)."""
        info = tree.nodes[leaf].info
        return EpisodeResult(
            tree,
            leaf,
            info.get("answer"),
            self.prompt_length,
            boundaries(tree, leaf),
            info.get("finish") in FINISHED,
            list(info.get("infra_failures", [])),
        )

    async def run_job(self, job: Job) -> JobResult:
        if job.node not in self.states:
            raise ValueError(
                f"job starts at node {job.node}, which is not a state an episode can continue from"
            )
        branch = self.jobs if self.branching else None
        self.jobs += 1
        tokenizer = self.tokenizer
        machine = EpisodeMachine(
            self.protocol,
            self.tree,
            job.node,
            self.states[job.node],
            self.limits,
            encode=lambda text: tokenizer.encode(text, add_special_tokens=False),
            max_turns=job.max_turns,
            max_steps=job.max_steps,
            states=self.states if self.branching else None,
        )

        async def chunk(context: list[int], max_new_tokens: int, stops: list[str]) -> Generation:
            params = dict(self.sampling_params, max_new_tokens=max_new_tokens)
            if stops:
                params["stop"] = list(stops)
            return await self.generate(context, params, branch)

        step = machine.next_segment()
        while True:
            if step.action == "generate":
                ids, logprobs, finish = await generate_segment(
                    self.protocol,
                    machine.state,
                    tokenizer,
                    chunk,
                    machine.context_ids(),
                    step.budget,
                    self.eos,
                )
                text = tokenizer.decode(ids, skip_special_tokens=True)
                step = machine.end_segment(ids, text, finish, logprobs)
            elif step.action == "tools":
                step = machine.tool_results(await self.run_tools(list(step.calls)))
            elif step.action == "pause":
                return JobResult(job, machine.added, machine.node, False)
            else:
                break
        if step.reason == "infra" and self.branching:  # a tree's credit needs every leaf: the session fails
            infra = self.tree.nodes[machine.node].info["infra_failures"]
            raise ToolUnavailableError(
                "infrastructure failure in a tree rollout, so the prompt's session is dropped: "
                + "; ".join(infra)
            )
        return JobResult(job, machine.added, machine.node, True)


def _spans(
    view: FlatSequence, tree: RolloutTree, prompt_length: int, policy_order: dict[int, int]
) -> list[Span]:
    spans: list[Span] = []
    n = len(view.token_ids)
    t = prompt_length
    while t < n:
        node = view.segment_index[t]
        end = t
        while end < n and view.segment_index[end] == node:
            end += 1
        seg = tree.segment(node)
        spans.append(
            Span(
                start=t - prompt_length,
                end=end - prompt_length,
                role=seg.role,
                kind=seg.kind or seg.role,
                trained=bool(view.policy_mask[t]),
                transient=seg.transient,
                segment=policy_order.get(node),
            )
        )
        t = end
    return spans


@dataclass
class Row:
    """One verl row: what goes into ``AgentLoopOutput`` plus the agentcredit record."""

    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None
    record: RowRecord


def episode_rows(
    episode: EpisodeResult,
    outcome: float,
    *,
    format_reward_key: str = "format_reward",
    potentials: list[float] | None = None,
    teacher: list[list[float]] | None = None,
    signals: dict[str, Any] | None = None,
    episode_id: str | None = None,
    tree_id: str | None = None,
    fork_counts: dict[int, int] | None = None,
    teacher_calls: dict[str, int] | None = None,
) -> list[Row]:
    """The episode as verl rows, one per training view (one row unless tool outputs were transient); ``signals``:
    the values of the signals a user's scorer computed (:mod:`.signals`), the same in every view's record."""
    tree, leaf, p = episode.tree, episode.leaf, episode.prompt_length
    if leaf == 0:
        raise ValueError("episode_rows: the episode generated nothing")
    views = tree.training_views(leaf)
    if teacher is not None and len(teacher) != len(views):
        raise ValueError(f"episode_rows: {len(teacher)} teacher rows for {len(views)} views")
    nodes = episode.policy_nodes()
    policy_order = {node: k for k, node in enumerate(nodes)}
    kinds = [tree.segment(n).kind for n in nodes]
    fmt = [tree.segment(n).info.get(format_reward_key) for n in nodes]
    env = [float(tree.segment(n).info.get("env_reward", 0.0)) for n in nodes]
    has_logprobs = all(tree.segment(n).logprobs is not None for n in nodes)
    eid = episode_id or uuid.uuid4().hex
    rows = []
    for i, view in enumerate(views):
        record = RowRecord(
            episode_id=eid,
            view=i,
            n_views=len(views),
            spans=_spans(view, tree, p, policy_order),
            outcome=float(outcome),
            answer=episode.answer,
            segment_kinds=kinds,
            tool_turns=episode.tool_turns(),
            format_rewards=fmt if any(f is not None for f in fmt) else [],
            env_rewards=env if any("env_reward" in tree.segment(n).info for n in nodes) else [],
            tree_id=tree_id,
            step_nodes=nodes if tree_id is not None else [],
            fork_counts=fork_counts or {},
            teacher_calls=(teacher_calls or {}) if i == 0 else {},  # counted once per episode
            potentials=potentials,
            teacher_logprobs=teacher[i] if teacher is not None else None,
            signals=signals or {},
            infra_failures=episode.infra_failures,
        )
        failed = bool(episode.infra_failures)
        if failed:  # nothing of it is trained: verl's loss reads response_mask, the credit skips the record
            record.spans = [span.model_copy(update={"trained": False}) for span in record.spans]
        rows.append(
            Row(
                response_ids=view.token_ids[p:],
                response_mask=[0 if failed else int(m) for m in view.policy_mask[p:]],
                response_logprobs=view.logprobs[p:] if has_logprobs else None,
                record=record,
            )
        )
    return rows


def continuation_logprobs(
    prompt_logprobs: Sequence[float], context_length: int, n_tokens: int
) -> list[float]:
    """The log-probs of the ``n_tokens`` tokens that follow the first ``context_length`` tokens of a sequence.

    ``prompt_logprobs[j]`` is log p(token j + 1 | tokens 0..j) (what the server returns for prompt tokens, the
    first token having none), so token ``context_length + i`` is at index ``context_length - 1 + i``.
    """
    if context_length < 1:
        raise ValueError("continuation_logprobs: the context must hold at least one token")
    start, stop = context_length - 1, context_length - 1 + n_tokens
    if stop > len(prompt_logprobs):
        raise ValueError(
            f"continuation_logprobs: need {stop} prompt log-probs for a {context_length}-token context and "
            f"{n_tokens} continuation tokens, got {len(prompt_logprobs)}"
        )
    return [float(x) for x in prompt_logprobs[start:stop]]


def dedup_aliases(golds: Sequence[str], cap: int) -> list[str]:
    """Stripped, de-duplicated, non-empty aliases, at most ``cap`` (tips.md §8 items 3 and 11)."""
    out: list[str] = []
    for g in golds:
        g = str(g).strip()
        if g and g not in out:
            out.append(g)
    return out[:cap]


async def answer_potentials(
    boundaries: Sequence[list[int]],
    golds: Sequence[str],
    *,
    tokenizer: Any,
    score: ScoreFn,
    potential: Callable[[list[list[float]]], float],
    answer_template: str = "<answer>{answer}</answer>",
    scope: str = "answer_only",
    max_aliases: int = 16,
) -> list[float]:
    """The potentials Phi(S_k) = log sum_a p(answer a | S_k) at every boundary context (exact token ids):
    ``potential`` pools one state's scores, one list of token log-probs per alias, into Phi (the method's settings
    say how: TIPS's ``TipsSettings.potential_of``).

    ``scope`` as the native trainer's (the native provider of ``potentials``, one token split for
    both): ``"answer_only"`` (the paper) forces the template's text before the answer into the context and scores
    the answer's own tokens; ``"full"`` (the released code) scores the whole rendered template."""
    if scope not in ("full", "answer_only"):
        raise ValueError(f"potential_scope must be 'full' or 'answer_only', got {scope!r}")
    aliases = dedup_aliases(golds, max_aliases)
    if not aliases:
        raise ValueError("answer_potentials: the question has no non-empty gold answer to score")

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    # (tokens forced into the context, tokens scored) per alias
    parts = []
    for a in aliases:
        ids, start, end = answer_token_span(encode, answer_template.format(answer=a), a)
        parts.append((ids[:start], ids[start:end]) if scope == "answer_only" else ([], ids))

    scored = await asyncio.gather(
        *(score(list(ctx) + forced, scored_ids) for ctx in boundaries for forced, scored_ids in parts)
    )
    n = len(parts)
    return [potential(scored[k * n : (k + 1) * n]) for k in range(len(boundaries))]


async def teacher_logprobs(
    teacher_prompt_ids: list[int], responses: Sequence[list[int]], *, score: ScoreFn
) -> list[list[float]]:
    """GEAR: log p(a_t | ground-truth-conditioned prompt, a_<t) for every token of every response (teacher-forced)."""

    async def one(response: list[int]) -> list[float]:
        if not response:
            return []
        lp = await score(list(teacher_prompt_ids), list(response))
        if len(lp) != len(response):
            raise ValueError(f"teacher scoring returned {len(lp)} log-probs for {len(response)} tokens")
        return lp

    return list(await asyncio.gather(*(one(r) for r in responses)))
