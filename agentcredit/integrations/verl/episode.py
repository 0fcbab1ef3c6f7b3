"""One episode of an agentcredit protocol against a token-in/token-out generation server.

This is the engine-independent half of the verl agent loop: it drives a :class:`~agentcredit.protocols.base.
Protocol` and a :class:`~agentcredit.tools.base.ToolRuntime` through the loop of the protocol's docstring,
building contexts by appending token ids (never re-rendering a chat template), and returns the episode as a
one-path :class:`~agentcredit.rollout.tree.RolloutTree`. :func:`episode_rows` then lays it out as verl rows
(one per training view) with the :class:`~agentcredit.integrations.verl.fields.RowRecord` the trainer reads.

Segment ends. A server with native stop strings (vLLM, SGLang) stops at ``protocol.stop_strings(state)``;
every stop is only a candidate, confirmed by ``protocol.segment_ends`` on the exact decoded text, and an
unconfirmed one (a closing fence that closes no python block) just continues the segment. Without stop
strings the server may also run past the end: the tokens after the first confirmed end are dropped. Dropping
them is exact, not an approximation: each kept token was sampled from the same conditional distribution it
would have been sampled from had generation stopped there.

Teacher scores. :func:`answer_potentials` (TIPS) and :func:`teacher_logprobs` (GEAR) ask a scorer for the
log-probs of a continuation after a context (:mod:`agentcredit.integrations.verl.scoring`: verl's inference
server, reading the context from its prefix cache).
"""

from __future__ import annotations

import asyncio
import copy
import random
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentcredit.credit import tips_potential
from agentcredit.integrations.verl.fields import RowRecord, Span
from agentcredit.protocols.base import EpisodeState, Protocol
from agentcredit.rollout.engine import Job, JobResult, PlanContext, Strategy
from agentcredit.rollout.tree import FlatSequence, RolloutTree, Segment
from agentcredit.tools.base import ToolCall, ToolResult, ToolUnavailableError
from agentcredit.tools.episodes import StepOutcome
from agentcredit.train.signals import answer_token_span

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


@dataclass
class Generation:
    """What the server returned for one request: sampled tokens and (optionally) their log-probs."""

    token_ids: list[int]
    log_probs: list[float] | None = None


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


def _candidate_ends(
    protocol: Protocol, state: EpisodeState, tokenizer: Any, prefix: list[int], new: list[int]
):
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


def _first_end(
    protocol: Protocol, state: EpisodeState, tokenizer: Any, prefix: list[int], new: list[int]
) -> int | None:
    for i in _candidate_ends(protocol, state, tokenizer, prefix, new):
        if protocol.segment_ends(state, tokenizer.decode(prefix + new[:i], skip_special_tokens=True)):
            return i
    # The exact text may end a segment where the pieces did not (multi-byte characters): check the full text.
    if new and protocol.segment_ends(state, tokenizer.decode(prefix + new, skip_special_tokens=True)):
        for i in range(1, len(new) + 1):
            if protocol.segment_ends(state, tokenizer.decode(prefix + new[:i], skip_special_tokens=True)):
                return i
    return None


async def _generate_segment(
    protocol: Protocol,
    state: EpisodeState,
    tokenizer: Any,
    generate: GenerateFn,
    context: list[int],
    budget: int,
    sampling_params: dict[str, Any],
    eos_token_ids: frozenset[int],
    branch: int | None = None,
) -> tuple[list[int], list[float] | None, str]:
    """Sample one policy segment: its tokens, their log-probs (if the server gives them) and the finish reason."""
    ids: list[int] = []
    logprobs: list[float] | None = []
    stops = protocol.stop_strings(state)
    while True:
        params = dict(sampling_params, max_new_tokens=budget - len(ids))
        if stops:
            params["stop"] = list(stops)
        out = await generate(context + ids, params, branch)
        new = list(out.token_ids)
        if out.log_probs is None:
            logprobs = None
        elif logprobs is not None:
            if len(out.log_probs) != len(new):
                raise ValueError(f"the server returned {len(out.log_probs)} log-probs for {len(new)} tokens")
        if not new:
            return ids, logprobs, "length"  # aborted or empty: nothing more will come
        cut = _first_end(protocol, state, tokenizer, ids, new)
        keep = new if cut is None else new[:cut]
        ids.extend(keep)
        if logprobs is not None:
            logprobs.extend(out.log_probs[: len(keep)])
        if cut is not None:
            return ids, logprobs, "stop"
        if new[-1] in eos_token_ids:
            return ids, logprobs, "eos"
        if len(ids) >= budget or not stops:
            return ids, logprobs, "length"
        # stopped at a stop string the protocol did not confirm: the segment goes on from here


async def run_tree(
    runner: TreeRunner, strategy: Strategy, rng: random.Random, max_turns: int
) -> list[EpisodeResult]:
    """The episodes of ``strategy``'s tree (PORTool's, carl-critical's entropy-guided forking), one per leaf.

    The strategy is the native engine's own (:mod:`agentcredit.rollout.strategies`): it yields jobs ("continue
    from node v for at most k steps") and reads their results. The jobs of one round run concurrently; every
    request of the tree carries the caller's routing id, so one replica's prefix cache serves all its branches.
    """
    plan = strategy.plan(PlanContext(runner.tree, rng, max_turns))
    results: list[JobResult] | None = None
    while True:
        try:
            jobs = next(plan) if results is None else plan.send(results)
        except StopIteration as stop:
            final = stop.value if stop.value is not None else runner.tree
            break
        if not jobs:
            raise ValueError(f"strategy {strategy.name} yielded an empty job list")
        results = list(await asyncio.gather(*(runner.run_job(job) for job in jobs)))
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


@dataclass
class _Snapshot:
    """What a job continuing from a node needs: the protocol state and the context right after the node."""

    state: EpisodeState
    visible: list[int]  # node ids whose tokens form the context
    pending_transient: int | None
    boundaries: list[list[int]]  # contexts S_0, S_1, ... after each observation so far
    policy_segments: int  # on the path from the root


class TreeRunner:
    """Grows one rollout tree against the server: :meth:`run_job` continues the episode at a node.

    A single episode is one job from the root (:meth:`run_episode`); a tree strategy runs many
    (:func:`run_tree`). A job ends the episode (the protocol's answer, a turn cap, the response budget) or pauses
    after ``max_steps`` policy segments and their observation, where later jobs may continue or fork it.
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
        self.max_segment_tokens, self.max_response_tokens = max_segment_tokens, max_response_tokens
        self.eos = frozenset(int(t) for t in eos_token_ids)
        self.prompt_length = len(prompt_ids)
        self.tree = RolloutTree(Segment(list(prompt_ids), role="prompt", kind="prompt"))
        self.snapshots = {0: _Snapshot(state, [0], None, [list(prompt_ids)], 0)}
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
            info.get("boundaries", []),
            info.get("finished", False),
            list(info.get("infra_failures", [])),
        )

    async def run_job(self, job: Job) -> JobResult:
        protocol, tree, tokenizer = self.protocol, self.tree, self.tokenizer
        if job.node not in self.snapshots:
            raise ValueError(
                f"job starts at node {job.node}, which is not a state an episode can continue from"
            )
        snap = self.snapshots[job.node]
        branch = self.jobs if self.branching else None
        self.jobs += 1
        state = copy.deepcopy(snap.state)
        visible, pending_transient = list(snap.visible), snap.pending_transient
        boundaries, policy_segments = [list(b) for b in snap.boundaries], snap.policy_segments
        node, added, steps = job.node, [], 0
        answer, finished, infra = None, False, []

        def context() -> list[int]:
            return [t for i in visible for t in tree.segment(i).token_ids]

        while True:
            ctx = context()
            room = self.max_response_tokens - (len(ctx) - self.prompt_length)
            budget = min(protocol.max_new_tokens(state, self.max_segment_tokens), room)
            if budget <= 0:
                break
            ids, logprobs, finish = await _generate_segment(
                protocol,
                state,
                tokenizer,
                self.generate,
                ctx,
                budget,
                self.sampling_params,
                self.eos,
                branch,
            )
            if not ids:
                break
            text = tokenizer.decode(ids, skip_special_tokens=True)
            turn = protocol.read_segment(state, text, finish)
            protocol.record(state, turn, text)
            policy_segments += 1
            capped = job.max_turns is not None and policy_segments >= job.max_turns and not turn.done
            observation, step = None, None
            if not turn.done and not capped:  # at the turn cap the episode ends before its calls run
                results = await self.run_tools(list(turn.calls)) if turn.calls else []
                if isinstance(results, StepOutcome):  # a per-episode environment's step (tools.environment)
                    step, results = results, results.results
                infra = [f"{r.name}: {r.output[:500]}" for r in results if r.infra]
            if infra:
                # a tool could not run (the machine's failure, not the model's): the model never reads the error,
                # and the episode ends here, marked, to be left out of the credit and the loss (episode_rows)
                if self.branching:  # a tree's credit needs every leaf: the whole session fails (verl pads)
                    raise ToolUnavailableError(
                        "infrastructure failure in a tree rollout, so the prompt's session is dropped: "
                        + "; ".join(infra)
                    )
                seg = Segment(
                    ids, text, role="policy", kind=turn.kind, logprobs=logprobs, info=dict(turn.info)
                )
                node = tree.add(seg, node)
                added.append(node)
                break
            if not turn.done and not capped:
                observation = protocol.observation(state, turn, results)
                if (
                    step is not None and step.done
                ):  # it completed turn.info; the environment ended the episode
                    observation = None
            # turn.info is final only now (observation() may complete it), so the segment is built after it.
            seg = Segment(ids, text, role="policy", kind=turn.kind, logprobs=logprobs, info=dict(turn.info))
            if step is not None:
                seg.info["env_reward"] = step.reward
            node = tree.add(seg, node)
            added.append(node)
            visible.append(node)
            if pending_transient is not None and turn.drop_transient:
                visible.remove(pending_transient)
                pending_transient = None
            if turn.done:
                answer, finished = turn.answer, True
                break
            if capped:
                break
            if (
                step is not None and step.done
            ):  # the environment ended it: its results are recorded, not shown
                seg.info["results"] = [r.to_dict() for r in step.results]
                finished = True
                break
            if observation is not None:
                obs_ids = tokenizer.encode(observation.text, add_special_tokens=False)
                room = self.max_response_tokens - (len(context()) - self.prompt_length)
                if len(obs_ids) >= room:
                    break  # the observation does not fit and leave room to answer: the episode is cut here
                node = tree.add(
                    Segment(
                        obs_ids,
                        observation.text,
                        role="observation",
                        kind=observation.kind,
                        transient=observation.transient,
                    ),
                    node,
                )
                added.append(node)
                visible.append(node)
                if observation.transient:
                    pending_transient = node
                boundaries.append(context())
            steps += 1
            # every state is one a later job may fork from (entropy-guided forking picks any of them)
            if self.branching:
                self.snapshots[node] = _Snapshot(
                    copy.deepcopy(state),
                    list(visible),
                    pending_transient,
                    [list(b) for b in boundaries],
                    policy_segments,
                )
            if job.max_steps is not None and steps >= job.max_steps:
                return JobResult(job, added, node, False)
        tree.nodes[node].info.update({"answer": answer, "finished": finished, "boundaries": boundaries})
        if infra:
            tree.nodes[node].info["infra_failures"] = infra
        return JobResult(job, added, node, True)


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
    episode_id: str | None = None,
    tree_id: str | None = None,
    fork_counts: dict[int, int] | None = None,
    teacher_calls: dict[str, int] | None = None,
) -> list[Row]:
    """The episode as verl rows, one per training view (one row unless tool outputs were transient)."""
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
    answer_template: str = "<answer>{answer}</answer>",
    reduce: str = "sum",
    scope: str = "answer_only",
    max_aliases: int = 16,
) -> list[float]:
    """TIPS potentials Phi(S_k) = log sum_a p(answer a | S_k) at every boundary context (exact token ids).

    ``scope`` as the native trainer's (:func:`agentcredit.train.signals.tips_potential_terms`, one token split for
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
    return [tips_potential(scored[k * n : (k + 1) * n], reduce=reduce) for k in range(len(boundaries))]


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
