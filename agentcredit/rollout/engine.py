"""The multi-turn rollout engine: many episodes decoded as one batch, tools running while others decode.

One call, :meth:`RolloutEngine.run`, turns a list of questions into one :class:`RolloutTree` per question.
A *strategy* (``strategies.py``) decides which episodes to run: it yields *jobs* ("continue from node v of
this tree, for at most k policy segments") and reads their results before yielding more, so independent
groups, entropy-guided forking and PORTool's fork sampling are all just schedules over the same engine.

The loop, per iteration:

1. admit queued jobs while there is room (``max_batch`` sequences in flight);
2. collect finished tool calls and append their observations as pending tokens;
3. one backend step: every sequence with pending tokens is fed them (one token for a decoding episode, the
   observation / prompt / spliced tokens for the others) and returns next-token logits;
4. sample one token for every episode that has logits, record its log-prob and entropy, and check whether the
   segment ends (the protocol's ``segment_ends`` on the segment text so far, EOS, or the token budget);
5. an ended segment is read by the protocol; its tool calls go to the tool pool (``ToolRuntime.submit``) and
   the episode waits there while the others keep decoding; the observation is tokenised alone and appended.

Every decision of an episode (the segment's budget and end, the caps, tool failures, the replacement of a transient
observation, pauses) is its :class:`~agentcredit.rollout.episode.EpisodeMachine`'s, the state machine verl's agent
loop drives too; the engine keeps the sequences, their cache columns and the batching.

Contexts only ever grow by appending token ids: the prompt is rendered once with the chat template, generated
ids are kept as sampled, and observations are tokenised on their own (carl-segment A27, portool 2.9).

Replacement mode (carl-segment Eqs. 8-9): when a policy segment ends right after a *transient* observation
(the raw tool output), the sequence is truncated back to the start of that observation and the segment's
tokens are fed again, so they sit right after the invoke segment: s_{k+2} = s_k + t_k + e_{k+1}. Only the
extraction is recomputed (never the prefix). This happens whenever the episode goes on after a transient
observation, whatever the turn's ``drop_transient`` says, because :meth:`RolloutTree.training_views` (what the
trainer sees) defines a transient observation as visible to exactly one policy segment.

Prefix reuse: jobs that start from the same node share one sequence up to the moment they sample their first
token (the sequence is copied, logits included); a job that continues a paused episode takes over its
sequence. With a strategy that forks from old states (``needs_prefix_store``), the cache entries of every node
are kept per tree and a fork is assembled from its ancestors' entries, so only its last token is recomputed.
Across questions, the token prefix all prompts of a call share (the system prompt and tool schemas: ~800-1,050
tokens for jsoncall) is prefilled once in a sequence of its own, exported as a cache block and copied into each
question's sequence, which prefills only the rest of its prompt (``share_prompt_prefix``).
``reuse_prefix=False`` turns all of this off (each job prefills its whole context): the benchmark compares both.

Backends that generate (``rollout.backend: vllm``, :class:`~agentcredit.rollout.backend.SegmentBackend`): step 3
only appends the pending tokens to the sequence's token list, and step 4 asks the backend for the rest of every ready
episode's segment in one batched call (the full token prefix, the remaining budget, the protocol's stop strings, one
seed per request: :meth:`RolloutEngine._generate`); the returned tokens are replayed through the same per-token
checks, so segment ends, budgets, tools, splices and trees are the engine's own. The server's prefix cache replaces
the engine's prefix sharing (no shared-prompt block is built), and its segments carry no entropies.

Token accounting (:class:`EngineStats`): ``generated_tokens`` are sampled tokens; ``prefill_tokens`` are
tokens fed that were not just sampled by that sequence (prompts, observations, spliced extractions, recomputed
fork tokens); ``decode_tokens`` are sampled tokens fed back.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import threading
import time
from abc import ABC, abstractmethod
from collections import defaultdict, deque
from collections.abc import Callable, Generator, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any

import torch

from agentcredit.protocols.base import Protocol
from agentcredit.rollout.backend import Backend, SegmentBackend, SegmentRequest
from agentcredit.rollout.episode import (
    EpisodeLimits,
    EpisodeMachine,
    Next,
    NodeState,
    token_finish,
    visible_nodes,
)
from agentcredit.rollout.sampling import SamplingParams, draw_uniforms, sample_tokens
from agentcredit.rollout.tree import RolloutTree, Segment
from agentcredit.tools.base import ToolCall, ToolRuntime
from agentcredit.tools.episodes import StepOutcome

RewardFn = Callable[[Any, "str | None"], float]
#: The prompts' common prefix is prefilled once only from this many tokens on: below it, the extra forward and the
#: cache copies cost about what they save.
SHARED_PREFIX_MIN = 32
#: The "logits" of a :class:`SegmentBackend` sequence whose tokens are all fed: it is ready to generate.
_READY = torch.empty(0)
#: How long a failed run waits for its tool steps still running, to close their environments before it raises.
_CLEANUP_SECONDS = 30.0


# ---------------------------------------------------------------------------------------------------------
# Public data types


@dataclass(frozen=True)
class EngineConfig:
    """Sampling and budgets of one rollout engine.

    Attributes:
        sampling: temperature / top-p / top-k (see :mod:`agentcredit.rollout.sampling`).
        max_segment_tokens: default token budget of one policy segment (the protocol may lower it, e.g.
            carl-segment's T_assimilate = 256); carl-segment A7 uses 2048 per generation call.
        max_episode_tokens: generated tokens per episode, counted from the root (forks included).
        max_turns: policy segments per episode, counted from the root; None = the protocol's ``max_segments``.
        max_context: context length cap (prompt + generated + observations); None = the model's limit.
        seed: base seed. Call k of :meth:`RolloutEngine.run` derives its seed from (seed, k) unless given one;
            every job draws from its own ``torch.Generator`` seeded from (call seed, prompt id, job number).
        max_batch: sequences in flight at once (decoding, waiting for tools, or paused); more jobs queue.
        reuse_prefix: share computed prefixes between jobs (copies / stored node caches). False = every job
            prefills its whole context (the no-reuse baseline of the benchmark).
        share_prompt_prefix: the token prefix that every prompt of a call has in common (the chat template's
            system prompt and tool schemas: ~800-1,050 tokens for jsoncall) is prefilled once per call and its
            cache copied into each question's sequence, which then prefills only its own remainder. Needs
            ``reuse_prefix``; used only when at least two prompts share at least ``SHARED_PREFIX_MIN`` tokens.
    """

    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_segment_tokens: int = 512
    max_episode_tokens: int = 2048
    max_turns: int | None = None
    max_context: int | None = None
    seed: int = 0
    max_batch: int = 64
    reuse_prefix: bool = True
    share_prompt_prefix: bool = True

    def __post_init__(self) -> None:
        for name in ("max_segment_tokens", "max_episode_tokens", "max_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_turns", "max_context"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1 or None, got {value}")


@dataclass(frozen=True)
class Job:
    """Continue the episode that reached ``node`` (0 = start from the prompt).

    ``max_steps``: pause after this many policy segments (and their observation), None = run to the end.
    ``max_turns``: end the episode once it has this many policy segments from the root (None = the engine's).
    """

    node: int = 0
    max_steps: int | None = None
    max_turns: int | None = None


@dataclass
class JobResult:
    """What a job produced: the nodes it added (in order), its last node, and whether the episode ended there."""

    job: Job
    nodes: list[int]
    end: int
    finished: bool


@dataclass
class EngineStats:
    """Counters of one :meth:`RolloutEngine.run` (see the module docstring for the token categories)."""

    generated_tokens: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    episodes: int = 0  # episodes that ended (leaves)
    jobs: int = 0  # jobs started (a whole episode, or a continuation of one)
    segments: int = 0
    tool_calls: int = 0
    tool_turns: int = 0
    splices: int = 0
    forks: int = 0  # sequences started from an existing prefix (a copy, or stored node caches)
    forward_calls: int = 0
    shared_prefix_tokens: int = 0  # tokens of the prompts' common prefix, prefilled once (0: not used)
    seconds: float = 0.0
    # CPU seconds of the whole process during the run (every thread), and of the thread that runs the engine loop
    # alone: the generation (forwards, sampling, the protocol's checks; with torch on one thread, all of it) without
    # the tool threads. Tool steps: their wall seconds on the tool threads, summed over steps (they overlap decoding)
    cpu_seconds: float = 0.0
    generation_cpu_seconds: float = 0.0
    tool_seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_cpu_second(self) -> float:
        """Generated tokens per CPU-second of generation (tool threads excluded; see ``generation_cpu_seconds``)."""
        cpu = self.generation_cpu_seconds
        return self.generated_tokens / cpu if cpu > 0 else 0.0

    def to_dict(self) -> dict[str, float]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["tokens_per_second"] = self.tokens_per_second
        out["tokens_per_cpu_second"] = self.tokens_per_cpu_second
        return out


@dataclass
class PlanContext:
    """What a strategy's plan sees: the tree it grows, a seeded RNG, and the engine's turn cap."""

    tree: RolloutTree
    rng: random.Random
    max_turns: int


Plan = Generator[list[Job], list[JobResult], "RolloutTree | None"]


class Strategy(ABC):
    """Base class of rollout strategies: ``plan`` yields job lists and receives their results in order.

    The plan may return a different tree (e.g. PORTool's pruned tree) that replaces the one it grew.
    ``needs_prefix_store``: the plan starts jobs from old interior nodes, so the engine keeps their caches.
    """

    name: str = "strategy"
    needs_prefix_store: bool = False

    @abstractmethod
    def plan(self, ctx: PlanContext) -> Plan:
        """The generator of job batches for one prompt (see the module docstring)."""


@dataclass(frozen=True)
class PlanStep:
    """A plan's next round: its jobs, or (``jobs`` empty) the end, with the tree it returned (None: the one it grew)."""

    jobs: list[Job]
    final: RolloutTree | None = None


def advance_plan(plan: Plan, results: list[JobResult] | None, where: str) -> PlanStep:
    """Give ``plan`` the results of its last round (None: start it) and read its next jobs, or its end. Every
    driver of a strategy (the native engine, verl's agent loop) steps it here; ``where`` names it in the error."""
    try:
        jobs = next(plan) if results is None else plan.send(results)
    except StopIteration as stop:
        return PlanStep([], stop.value)
    if not jobs:
        raise ValueError(f"strategy yielded an empty job list for {where}")
    return PlanStep(list(jobs))


# ---------------------------------------------------------------------------------------------------------
# Internal bookkeeping


@dataclass
class _TreeRun:
    index: int
    prompt_id: str | int
    example: Any
    tree: RolloutTree
    plan: Plan
    states: dict[int, NodeState] = field(default_factory=dict)
    blocks: dict[int, Any] = field(default_factory=dict)  # node -> cache block (prefix store)
    parked: dict[int, list[_JobRun]] = field(default_factory=lambda: defaultdict(list))
    batch: list[Job] = field(default_factory=list)
    results: list[JobResult | None] = field(default_factory=list)
    outstanding: int = 0
    jobs_started: int = 0
    final: RolloutTree | None = None
    done: bool = False


@dataclass
class _JobRun:
    """One job in flight (an episode being generated from its start node): its sequence, the segment it is
    sampling, and its tool step. Its episode's decisions are its :class:`~agentcredit.rollout.episode.
    EpisodeMachine`'s (which grows the tree); this is the engine's bookkeeping of sequences and columns."""

    run: _TreeRun
    job: Job
    slot: int  # index of the job in its batch
    seq: int
    machine: EpisodeMachine
    rng: torch.Generator | None
    layout: list[tuple[int, int, int]]  # (node, start, end) of the visible context, in order
    pending: list[int] = field(default_factory=list)
    pending_prefill: int = 0
    logits: torch.Tensor | None = None
    clones: list[_JobRun] = field(default_factory=list)  # jobs waiting for this sequence's first logits
    seg_ids: list[int] = field(default_factory=list)
    seg_logprobs: list[float] = field(default_factory=list)
    seg_entropies: list[float | None] = field(default_factory=list)  # None: a SegmentBackend (no entropy)
    seg_budget: int = 0
    future: Future | None = None
    pause: bool = False
    env: Any = None  # its per-episode environment (EpisodeSession), opened at its first tool step
    seed: int = 0  # the job's seed (its rng's); a SegmentBackend's requests derive theirs from it

    @property
    def node(self) -> int:
        """The last node of the context (the machine's)."""
        return self.machine.node

    @property
    def generated(self) -> int:
        """Policy tokens on the path from the root, the segment being sampled included."""
        return self.machine.generated + (len(self.seg_ids) if self.seg_budget else 0)


def _seed(*parts: object) -> int:
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << 63) - 1)


def _close_quietly(ep: _JobRun) -> None:
    """Close an episode's environment while another error (or none) is what matters."""
    env, ep.env = ep.env, None
    if env is not None:
        with contextlib.suppress(Exception):
            env.close()


def common_prompt_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the token prefix all ``prompts`` share, at most the shortest minus one (each question feeds at
    least one token of its own); 0 for fewer than two prompts. The engine prefills it once for all episodes."""
    if len(prompts) < 2:
        return 0
    first, n = prompts[0], min(len(p) for p in prompts) - 1
    for other in prompts[1:]:
        k = 0
        while k < n and other[k] == first[k]:
            k += 1
        n = k
    return n


def recorded_steps(tree: RolloutTree, node: int) -> list[tuple[list[ToolCall], list[str]]]:
    """The tool steps on the path to ``node``: each policy segment's calls and the outputs they got."""
    steps = []
    for n in tree.path(node):
        info = tree.segment(n).info
        if tree.segment(n).role == "policy" and info.get("calls") and "results" in info:
            calls = [ToolCall(c["name"], c.get("arguments", {}), c.get("raw", "")) for c in info["calls"]]
            steps.append((calls, [r["output"] for r in info["results"]]))
    return steps


def question_of(item: Any) -> str:
    """The question text of a prompt item: a string, an object with ``.question`` or a mapping with one."""
    if isinstance(item, str):
        return item
    if isinstance(item, dict) and "question" in item:
        return str(item["question"])
    if hasattr(item, "question"):
        return str(item.question)
    raise ValueError(f"prompt item {item!r:.80}: expected a string, an Example or a mapping with 'question'")


def episode_reward(
    reward_fn: Any, example: Any, answer: str | None, tree: RolloutTree, leaf: int, tokenizer: Any = None
) -> float:
    """The outcome reward of the episode ending at ``leaf``: ``reward_fn(example, answer)``; for a reward with a
    ``score_actions`` method (``task.metric: set_f1_format``), ``score_actions(example, answer, actions)`` with the
    text of the episode's policy segments; or, for a reward that
    reads the whole episode (one with a ``score_episode`` method, e.g. a user's verl- or TRL-style function),
    ``reward_fn.score_episode(example, answer, transcript, token_ids)`` with what the episode appended after its
    prompt (policy segments and observations): its token ids, and their text decoded by ``tokenizer`` with
    ``skip_special_tokens=True``, as verl's reward manager and TRL decode a response (without a tokenizer, the
    segments' own text). A reward with ``score_parts`` (a weighted list, :class:`~agentcredit.rewards.
    WeightedReward`) also records each function's value in the leaf's ``info["reward_parts"]``."""
    actions = getattr(reward_fn, "score_actions", None)
    if (
        actions is not None
    ):  # a reward with a per-action check (carl-critical's format gate): the policy segments
        policy = [tree.segment(n).text for n in tree.path(leaf)[1:] if tree.segment(n).role == "policy"]
        return float(actions(example, answer, policy))
    score = getattr(reward_fn, "score_episode", None)
    if score is None:
        return float(reward_fn(example, answer))
    path = tree.path(leaf)[1:]
    ids = [t for node in path for t in tree.segment(node).token_ids]
    if tokenizer is not None:
        transcript = tokenizer.decode(ids, skip_special_tokens=True)
    else:
        transcript = "".join(tree.segment(node).text for node in path)
    parts = getattr(reward_fn, "score_parts", None)
    if parts is not None:  # a weighted list of rewards: each one's value is kept on the episode for the logs
        values = parts(example, answer, transcript, ids)
        tree.nodes[leaf].info["reward_parts"] = values
        return float(reward_fn.combine(values))
    return float(score(example, answer, transcript, ids))


# ---------------------------------------------------------------------------------------------------------
# The engine


class RolloutEngine:
    """Runs a protocol's episodes on a backend, with tools, under a strategy; see the module docstring.

    Args:
        backend: the policy (e.g. :class:`~agentcredit.rollout.backend.HFBackend`).
        tokenizer: the policy's tokenizer (renders the prompt once, tokenises observations, decodes segments).
        protocol: the text format (``agentcredit.protocols.get_protocol(...)``).
        tools: the tool runtime the protocol's calls run in (None: an empty runtime; calls get an error text).
        config: sampling and budgets.
        stop_token_ids: tokens that end a segment with ``finish="eos"`` (default: the tokenizer's EOS).
    """

    def __init__(
        self,
        backend: Backend,
        tokenizer: Any,
        protocol: Protocol,
        tools: ToolRuntime | None = None,
        config: EngineConfig | None = None,
        *,
        stop_token_ids: Iterable[int] | None = None,
    ):
        self.backend = backend
        self.tokenizer = tokenizer
        self.protocol = protocol
        self.tools = tools if tools is not None else ToolRuntime({})
        self.config = config or EngineConfig()
        if stop_token_ids is None:
            if tokenizer.eos_token_id is None:
                raise ValueError("the tokenizer has no eos_token_id; pass stop_token_ids")
            stop_token_ids = [tokenizer.eos_token_id]
        self.stop_ids = frozenset(int(t) for t in stop_token_ids)
        self.max_turns = self.config.max_turns or protocol.max_segments
        self.max_context = min(self.config.max_context or backend.max_positions, backend.max_positions)
        self.limits = EpisodeLimits(
            max_segment_tokens=self.config.max_segment_tokens,
            max_context=self.max_context,
            max_turns=self.max_turns,
            max_episode_tokens=self.config.max_episode_tokens,
        )
        self.stats = EngineStats()
        self._tool_lock = threading.Lock()
        self._calls = 0
        # a backend that generates whole segments (vLLM): the engine asks it for each segment's tokens
        self._segments = backend if isinstance(backend, SegmentBackend) else None

    @classmethod
    def for_hf_model(
        cls, model: Any, tokenizer: Any, protocol: Protocol, tools: ToolRuntime | None, config: EngineConfig
    ) -> RolloutEngine:
        """The engine on a Hugging Face causal LM (:class:`~agentcredit.rollout.backend.HFBackend`), padding with
        the tokenizer's pad id (0 when it has none). Training, evaluation and the benchmarks all build it here."""
        from agentcredit.rollout.backend import HFBackend

        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        return cls(HFBackend(model, pad_token_id=pad), tokenizer, protocol, tools, config)

    # ------------------------------------------------------------------ public
    def run(
        self,
        prompts: Sequence[Any],
        strategy: Strategy,
        reward_fn: RewardFn,
        *,
        prompt_ids: Sequence[str | int] | None = None,
        extra: Sequence[dict] | None = None,
        seed: int | None = None,
        on_tree_done: Callable[[], None] | None = None,
    ) -> list[RolloutTree]:
        """One tree per prompt. ``reward_fn(prompt_item, answer)`` scores each finished episode (answer may be None).

        Args:
            prompts: questions (strings, :class:`~agentcredit.tasks.example.Example` or ``{"question": ...}``).
            strategy: which episodes to run (``strategies.independent(n)``, ...).
            reward_fn: outcome reward of an episode from the prompt item and the extracted answer.
            prompt_ids: ids stored on the trees (default: the index in ``prompts``); they also seed the jobs.
            extra: per-prompt keyword arguments for ``protocol.new_episode``.
            seed: seed of this call. Default: derived from ``config.seed`` and the number of earlier calls, so
                successive calls sample differently while a fresh engine with the same config reproduces them.
            on_tree_done: called once each time a prompt's tree is finished (progress of a long phase).
        """
        if extra is not None and len(extra) != len(prompts):
            raise ValueError(f"extra has {len(extra)} entries for {len(prompts)} prompts")
        if prompt_ids is not None and len(prompt_ids) != len(prompts):
            raise ValueError(f"prompt_ids has {len(prompt_ids)} entries for {len(prompts)} prompts")
        self._seed = _seed(self.config.seed, "call", self._calls) if seed is None else int(seed)
        self._calls += 1
        ids = list(prompt_ids) if prompt_ids is not None else list(range(len(prompts)))
        if len(set(map(str, ids))) != len(ids):
            raise ValueError(
                "prompt_ids must be unique (they seed the jobs; equal ids would sample equal trees)"
            )
        self.stats = EngineStats()
        start, cpu_start, loop_cpu_start = time.perf_counter(), time.process_time(), time.thread_time()
        forward_before = getattr(self.backend.stats, "forward_calls", 0)
        self._reward_fn = reward_fn
        self._on_tree_done = on_tree_done
        self._store = strategy.needs_prefix_store and self.config.reuse_prefix
        self._queue: deque[list[_JobRun]] = deque()
        self._live: list[_JobRun] = []  # episodes holding a sequence (decoding, waiting, pending, parked)
        extras = extra or [None] * len(prompts)
        runs = [self._new_run(i, ids[i], item, strategy, extras[i]) for i, item in enumerate(prompts)]
        self._shared_ids = self._shared_prefix([run.tree.segment(0).token_ids for run in runs])
        self._shared_block: Any = None
        for run in runs:
            self._advance(run, None)
        try:
            self._loop(runs)
        except BaseException:
            live = list(self._live)
            # steps still running are let finish (bounded), so every environment is closed before the error that
            # stopped the run is reported; that error is the one to report
            running = [ep.future for ep in live if ep.future is not None and not ep.future.cancel()]
            wait(running, timeout=_CLEANUP_SECONDS)
            for ep in live:
                if ep.future is None or ep.future.done():
                    _close_quietly(ep)
                else:  # still running after the wait: close it when it returns
                    ep.future.add_done_callback(lambda _, ep=ep: _close_quietly(ep))
                ep.future = None
                self._release(ep)
            raise
        for ep in list(self._live):
            self._release(ep)
        self.stats.seconds = time.perf_counter() - start
        self.stats.cpu_seconds = time.process_time() - cpu_start
        self.stats.generation_cpu_seconds = time.thread_time() - loop_cpu_start
        self.stats.forward_calls = getattr(self.backend.stats, "forward_calls", 0) - forward_before
        return [run.final if run.final is not None else run.tree for run in runs]

    # ------------------------------------------------------------------ the prompts' shared prefix
    def _shared_prefix(self, prompts: list[list[int]]) -> list[int]:
        """The token prefix every prompt shares (at most the shortest prompt minus one token, so every question
        still feeds at least one token of its own), or [] when it is not worth prefilling apart."""
        if not (self.config.share_prompt_prefix and self.config.reuse_prefix) or len(prompts) < 2:
            return []
        if self._segments is not None:  # the server's own prefix cache shares it (and every other prefix)
            return []
        n = common_prompt_prefix(prompts)
        return list(prompts[0][:n]) if n >= SHARED_PREFIX_MIN else []

    def _shared_prefix_block(self) -> Any:
        """The cache block of the shared prefix, prefilled on first use in a sequence of its own (then released)."""
        if self._shared_block is None:
            seq = self.backend.new_sequence()
            try:
                self.backend.extend({seq: self._shared_ids})
                self._shared_block = self.backend.export_block(seq, 0, len(self._shared_ids))
            finally:
                self.backend.release(seq)
            self.stats.prefill_tokens += len(self._shared_ids)
            self.stats.shared_prefix_tokens = len(self._shared_ids)
        return self._shared_block

    # ------------------------------------------------------------------ trees and plans
    def _new_run(
        self, index: int, prompt_id: str | int, item: Any, strategy: Strategy, extra: dict | None
    ) -> _TreeRun:
        question = question_of(item)
        # an example may carry its own protocol options (info["episode_options"]: BFCL's per-question tools)
        own = getattr(item, "info", None) or (item.get("info") if isinstance(item, dict) else None) or {}
        state = self.protocol.new_episode(question, **{**own.get("episode_options", {}), **(extra or {})})
        text = self.protocol.prompt(state, self.tokenizer)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"prompt {index}: the protocol rendered an empty prompt")
        if len(ids) >= self.max_context:
            raise ValueError(
                f"prompt {index}: {len(ids)} tokens, at or above the context cap {self.max_context}"
            )
        tree = RolloutTree(Segment(ids, text, role="prompt", kind="prompt"), prompt_id=prompt_id)
        tree.info["question"] = question
        tree.info["strategy"] = strategy.name
        rng = random.Random(_seed(self._seed, "plan", prompt_id))
        plan = strategy.plan(PlanContext(tree, rng, self.max_turns))
        run = _TreeRun(index=index, prompt_id=prompt_id, example=item, tree=tree, plan=plan)
        run.states[0] = NodeState(state, 0)
        return run

    def _advance(self, run: _TreeRun, results: list[JobResult] | None) -> None:
        """Give the plan its results and queue its next jobs (or finish the tree)."""
        step = advance_plan(run.plan, results, f"prompt {run.index}")
        if not step.jobs:
            run.done = True
            run.final = step.final
            if self._on_tree_done is not None:
                self._on_tree_done()
            for eps in run.parked.values():
                for ep in eps:
                    self._release(ep)
            run.parked.clear()
            run.blocks.clear()
            return
        run.batch = step.jobs
        run.results = [None] * len(step.jobs)
        run.outstanding = len(step.jobs)
        self._start_jobs(run)

    def _job_done(self, ep: _JobRun, finished: bool) -> None:
        run = ep.run
        run.results[ep.slot] = JobResult(ep.job, list(ep.machine.added), ep.node, finished)
        run.outstanding -= 1
        if run.outstanding == 0:
            self._advance(run, list(run.results))  # type: ignore[arg-type]

    # ------------------------------------------------------------------ starting jobs
    def _start_jobs(self, run: _TreeRun) -> None:
        groups: dict[int, list[int]] = defaultdict(list)
        for slot, job in enumerate(run.batch):
            if job.node not in run.states:
                raise ValueError(
                    f"prompt {run.index}: job starts at node {job.node}, which is not a state the engine can "
                    "continue from (a leaf, or a node inside a segment)"
                )
            groups[job.node].append(slot)
        for node, slots in groups.items():
            eps = [self._new_episode(run, slot) for slot in slots]
            if not self.config.reuse_prefix:
                for ep in eps:
                    self._queue.append([ep])
                continue
            parked = run.parked.get(node)
            if parked:
                self._take_over(eps[0], parked.pop())
                for clone in eps[1:]:
                    self._clone(eps[0], clone)
                self._job_ready(eps)
                continue
            eps[0].clones = eps[1:]  # they copy the leader's sequence once its prefill is done
            self._queue.append(eps)
        # paused episodes no job continues are dropped (e.g. PORTool paths DupAndSamp did not select)
        for eps in list(run.parked.values()):
            for ep in eps:
                self._release(ep)
        run.parked.clear()

    def _new_episode(self, run: _TreeRun, slot: int) -> _JobRun:
        job = run.batch[slot]
        rng = None
        seed = _seed(self._seed, "job", run.prompt_id, run.jobs_started)
        if not self.config.sampling.greedy:
            rng = torch.Generator().manual_seed(seed)
        run.jobs_started += 1
        self.stats.jobs += 1
        return _JobRun(
            run=run,
            job=job,
            slot=slot,
            seq=-1,
            machine=EpisodeMachine(
                self.protocol,
                run.tree,
                job.node,
                run.states[job.node],
                self.limits,
                encode=lambda text: self.tokenizer(text, add_special_tokens=False)["input_ids"],
                max_turns=job.max_turns,
                max_steps=job.max_steps,
                states=run.states,
            ),
            rng=rng,
            layout=[],
            seed=seed,
        )

    def _take_over(self, ep: _JobRun, parked: _JobRun) -> None:
        """``ep`` continues a paused episode's sequence (same context, logits ready)."""
        ep.seq, ep.layout, ep.logits = parked.seq, list(parked.layout), parked.logits
        ep.env, parked.env = parked.env, None  # the environment is in the paused state: it continues too
        self._live.remove(parked)
        self._live.append(ep)

    def _clone(self, leader: _JobRun, ep: _JobRun) -> None:
        ep.seq = self.backend.fork(leader.seq)
        ep.layout, ep.logits = list(leader.layout), leader.logits
        self.stats.forks += 1
        self._live.append(ep)

    def _job_ready(self, eps: list[_JobRun]) -> None:
        for ep in eps:
            self._begin_segment(ep)

    def _admit(self, *, force: bool = False) -> None:
        """Give queued job groups a sequence while fewer than ``max_batch`` are in flight."""
        # a leader's clones get their sequences only after its prefill, but they are in flight from admission
        in_flight = len(self._live) + sum(len(ep.clones) for ep in self._live)
        admitted: list[_JobRun] = []
        while self._queue:
            group = self._queue[0]
            if not force and (self._live or admitted) and in_flight + len(group) > self.config.max_batch:
                break
            in_flight += len(group)
            force = False
            admitted.append(self._queue.popleft()[0])
        if admitted:
            # one allocation for all of them, their leaders' clones included (the shared prefix's own sequence is
            # released before the first leader takes its row)
            self.backend.reserve(in_flight)
        for leader in admitted:
            self._build_sequence(leader)
            self._live.append(leader)

    def _build_sequence(self, ep: _JobRun) -> None:
        """A sequence holding the context of ``ep.node``, from stored node caches where possible."""
        tree = ep.run.tree
        nodes = visible_nodes(tree, ep.node)
        reuse = 0
        if self._store:
            while reuse < len(nodes) and nodes[reuse] in ep.run.blocks:
                reuse += 1
        blocks = [ep.run.blocks[n] for n in nodes[:reuse]]
        shared = 0
        if not blocks and self._shared_ids:  # the prompts' common prefix comes from its one prefill
            shared = len(self._shared_ids)
            ep.seq = self.backend.sequence_from_blocks([self._shared_prefix_block()])
        else:
            ep.seq = self.backend.sequence_from_blocks(blocks) if blocks else self.backend.new_sequence()
            self.stats.forks += bool(blocks)
        col = 0
        for n in nodes:
            length = len(tree.segment(n).token_ids)
            ep.layout.append((n, col, col + length))
            col += length
        feed: list[int] = []
        for n in nodes[reuse:]:
            feed.extend(tree.segment(n).token_ids)
        feed = feed[shared:]  # the prompt (node 0) comes first, and shared < its length
        if not feed:  # everything came from the store: recompute the last token for its logits
            length = self.backend.length(ep.seq)
            last = tree.segment(nodes[-1]).token_ids[-1]
            self.backend.truncate(ep.seq, length - 1)
            feed = [last]
        ep.pending, ep.pending_prefill = feed, len(feed)

    # ------------------------------------------------------------------ the loop
    def _loop(self, runs: list[_TreeRun]) -> None:
        while not all(run.done for run in runs):
            self._admit()
            self._collect_tools(block=False)
            fed = self._forward()
            sampled = self._sample()
            if not fed and not sampled:
                if any(ep.future is not None for ep in self._live):
                    self._collect_tools(block=True)
                elif self._queue:  # every sequence in flight is paused: admit past max_batch
                    self._admit(force=True)
                else:
                    stuck = [run.index for run in runs if not run.done]
                    raise RuntimeError(f"rollout engine stalled with unfinished prompts {stuck} (engine bug)")

    def _forward(self) -> bool:
        ready = [ep for ep in self._live if ep.pending and ep.future is None]  # tool waiters wait
        if not ready:
            return False
        logits = self.backend.extend({ep.seq: ep.pending for ep in ready})
        for ep in ready:
            self.stats.prefill_tokens += ep.pending_prefill
            self.stats.decode_tokens += len(ep.pending) - ep.pending_prefill
            ep.pending, ep.pending_prefill = [], 0
            ep.logits = logits[ep.seq] if self._segments is None else _READY
            if self._store:
                self._save_blocks(ep)
            self._after_feed(ep)
        return True

    def _after_feed(self, ep: _JobRun) -> None:
        """The episode's next-token logits are ready: start its jobs' segments, or park it."""
        if ep.clones:  # a fresh sequence shared by several jobs: copy it (logits included) for each
            clones, ep.clones = ep.clones, []
            for clone in clones:
                self._clone(ep, clone)
            self._job_ready([ep, *clones])
        elif ep.pause:
            self._park(ep)
        elif ep.seg_budget == 0:  # not mid-segment: a new segment starts here
            self._begin_segment(ep)

    def _save_blocks(self, ep: _JobRun) -> None:
        length = self.backend.length(ep.seq)
        for node, start, end in ep.layout:
            if end <= length and node not in ep.run.blocks:
                ep.run.blocks[node] = self.backend.export_block(ep.seq, start, end)

    def _sample(self) -> bool:
        eps = [ep for ep in self._live if ep.logits is not None and ep.seg_budget > 0 and not ep.pause]
        if not eps:
            return False
        if self._segments is not None:
            self._generate(eps)
            return True
        logits = torch.stack([ep.logits for ep in eps])
        params = self.config.sampling
        uniforms = None if params.greedy else draw_uniforms([ep.rng for ep in eps])  # type: ignore[misc]
        tokens, logprobs, entropies = sample_tokens(logits, params, uniforms)
        for ep, tok, lp, ent in zip(eps, tokens.tolist(), logprobs.tolist(), entropies.tolist(), strict=True):
            ep.logits = None
            self._on_token(ep, tok, lp, ent)
        return True

    def _generate(self, eps: list[_JobRun]) -> None:
        """A :class:`SegmentBackend` samples the rest of each episode's segment in one batched call; its tokens are
        then replayed through :meth:`_on_token`, so stops, budgets and segment ends are decided exactly as for
        sampled logits. Tokens after the first confirmed end are dropped (exact: each kept token was drawn from the
        distribution it would have been drawn from had generation stopped there); a segment the backend stopped
        early (a stop string the protocol did not confirm) goes on with a new request at the next iteration."""
        backend = self._segments
        assert backend is not None
        requests = []
        for ep in eps:
            length = backend.length(ep.seq)
            budget = min(ep.seg_budget - len(ep.seg_ids), self.max_context - length)
            stops = tuple(self.protocol.stop_strings(ep.machine.state))
            seed = _seed(ep.seed, "segment", ep.generated) & 0x7FFFFFFF
            requests.append(SegmentRequest(backend.tokens(ep.seq), max(1, budget), stops, seed))
        outputs = backend.generate(requests, self.config.sampling, sorted(self.stop_ids))
        for ep, out in zip(eps, outputs, strict=True):
            if not out.token_ids or len(out.logprobs) != len(out.token_ids):
                raise RuntimeError(
                    f"{type(backend).__name__}.generate returned {len(out.token_ids)} tokens and "
                    f"{len(out.logprobs)} log-probs for one request (backend bug)"
                )
            ep.logits = None
            last = len(out.token_ids) - 1
            for k, (token, logprob) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
                self._on_token(ep, int(token), float(logprob), None)
                if ep.seg_budget == 0 or k == last:  # the segment ended, or its next token is pending
                    break
                backend.extend({ep.seq: [int(token)]})  # the segment goes on: the token is in the context
                ep.pending, ep.pending_prefill = [], 0
                self.stats.decode_tokens += 1

    # ------------------------------------------------------------------ segments
    def _begin_segment(self, ep: _JobRun) -> None:
        """Set the token budget of the next policy segment (the logits for its first token are ready)."""
        step = ep.machine.next_segment()
        # the machine ends an episode whose tokens or context are spent after its segment or observation, so a
        # job always starts with room for one token
        assert step.action == "generate", step
        ep.seg_budget = step.budget
        ep.seg_ids, ep.seg_logprobs, ep.seg_entropies = [], [], []

    def _on_token(self, ep: _JobRun, token: int, logprob: float, entropy: float | None) -> None:
        ep.seg_ids.append(token)
        ep.seg_logprobs.append(logprob)
        ep.seg_entropies.append(entropy)
        self.stats.generated_tokens += 1
        text = self.tokenizer.decode(ep.seg_ids, skip_special_tokens=False)
        machine = ep.machine
        finish = token_finish(
            self.protocol, machine.state, token, text, len(ep.seg_ids), ep.seg_budget, self.stop_ids
        )
        if finish is None:
            ep.pending, ep.pending_prefill = [token], 0
            return
        self._end_segment(ep, text, finish)

    def _end_segment(self, ep: _JobRun, text: str, finish: str) -> None:
        machine = ep.machine
        start = self.backend.length(ep.seq) - (len(ep.seg_ids) - 1)
        first_new = len(machine.added)
        step = machine.end_segment(
            list(ep.seg_ids),
            text,
            finish,  # type: ignore[arg-type]
            list(ep.seg_logprobs),
            None if self._segments is not None else list(ep.seg_entropies),
        )
        node = machine.added[first_new]  # the policy segment (an observation may follow it)
        ep.seg_budget = 0
        self.stats.segments += 1
        if step.action == "end":
            ep.layout.append((node, start, start + len(ep.seg_ids)))
            self._finish_episode(ep, step.reason)  # type: ignore[arg-type]
            return
        feed = [ep.seg_ids[-1]]
        if machine.spliced is not None:  # replacement: drop the raw output, re-feed the extraction
            cut = next(begin for n, begin, _ in ep.layout if n == machine.spliced)
            self.backend.truncate(ep.seq, cut)
            ep.layout = [entry for entry in ep.layout if entry[1] < cut]
            start = cut
            feed = list(ep.seg_ids)
            self.stats.splices += 1
        ep.layout.append((node, start, start + len(ep.seg_ids)))
        ep.pending, ep.pending_prefill = feed, len(feed) - 1
        if step.action == "tools":
            calls = list(step.calls)
            self.stats.tool_calls += len(calls)
            self.stats.tool_turns += 1
            if self.tools.episodes is None:
                ep.future = self.tools.submit_step(self._timed_step, self.tools.run, calls)
            else:
                replay = recorded_steps(machine.tree, ep.job.node) if ep.env is None else None
                ep.future = self.tools.submit_step(
                    self._timed_step, self._environment_step, ep, calls, replay
                )
        else:
            self._after_step(ep, node, step)

    def _collect_tools(self, *, block: bool) -> None:
        """Feed the results of finished tool steps to their episodes, in the episodes' (submission) order.

        Greedy decoding takes every step in lockstep: the loop waits for all of them here, at the iteration after
        they were submitted, so which episodes share a forward pass, and the order in which a tree's nodes are
        added, never depend on which tool thread finished first. A greedy rollout (evaluation, the demo's table)
        is then a function of its inputs: a batch's composition changes the last bits of fp32 logits, enough to
        flip a near-tie argmax, and a slow tool reordered a tree's nodes. Sampled rollouts keep decoding the other
        episodes while tools run (their trees are draws; throughput matters there)."""
        waiting = [ep for ep in self._live if ep.future is not None]
        if not waiting:
            return
        if self.config.sampling.greedy:
            wait([ep.future for ep in waiting])  # type: ignore[misc]
        elif block:
            wait([ep.future for ep in waiting], return_when=FIRST_COMPLETED)  # type: ignore[misc]
        for ep in waiting:
            if ep.future.done():  # type: ignore[union-attr]
                results = ep.future.result()  # type: ignore[union-attr]  (a UserEnvironmentError stops the run)
                ep.future = None
                before = ep.node
                self._after_step(ep, before, ep.machine.tool_results(results))

    def _timed_step(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run one tool step on a tool thread and add its wall seconds to ``stats.tool_seconds``."""
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            with self._tool_lock:  # steps end on several threads at once
                self.stats.tool_seconds += time.perf_counter() - start

    def _environment_step(
        self, ep: _JobRun, calls: list[ToolCall], replay: list[tuple[list[ToolCall], list[str]]] | None
    ) -> StepOutcome:
        """One tool step in the episode's own environment (a tool thread). A job that starts mid-episode (a tree
        branch) opens a fresh one and replays the recorded calls before the branch (agentcredit.tools.episodes)."""
        if ep.env is None:
            ep.env = self.tools.episodes.open(ep.run.example)
            ep.env.replay(replay or [])
        return ep.env.step(calls)

    def _after_step(self, ep: _JobRun, before: int, step: Next) -> None:
        """The machine read the step's results (``before``: the policy node of the step): feed the observation it
        appended, and pause or end the episode as it says."""
        if step.action == "end":
            self._finish_episode(ep, step.reason)  # type: ignore[arg-type]
            return
        if ep.node != before:  # an observation was appended: its tokens are fed after the pending ones
            ids = ep.machine.tree.segment(ep.node).token_ids
            start = self.backend.length(ep.seq) + len(ep.pending)
            ep.layout.append((ep.node, start, start + len(ids)))
            ep.pending = ep.pending + list(ids)
            ep.pending_prefill += len(ids)
        if step.action == "pause":
            ep.pause = True  # parked once the pending tokens are in (its logits ready for whoever continues)

    def _park(self, ep: _JobRun) -> None:
        ep.pause = False
        ep.run.parked[ep.node].append(ep)
        self._job_done(ep, finished=False)

    def _finish_episode(self, ep: _JobRun, reason: str) -> None:
        """The machine ended the episode (``reason``, recorded on the leaf): score it and free its sequence."""
        tree, leaf = ep.run.tree, ep.node
        answer = tree.nodes[leaf].info["answer"]
        reward = episode_reward(self._reward_fn, ep.run.example, answer, tree, leaf, self.tokenizer)
        if self.tools.episodes is not None:  # the return: the outcome plus the environment's step rewards
            tree.nodes[leaf].info["outcome_reward"] = reward
            reward += sum(tree.segment(n).info.get("env_reward", 0.0) for n in tree.path(leaf))
        tree.set_reward(leaf, reward)
        self.stats.episodes += 1
        self._release(ep)
        self._job_done(ep, finished=True)

    def _release(self, ep: _JobRun) -> None:
        if ep in self._live:
            self._live.remove(ep)
            self.backend.release(ep.seq)
        if ep.future is not None:
            if not ep.future.cancel():  # a step still running: close its environment once it returns
                ep.future.add_done_callback(lambda _, ep=ep: _close_quietly(ep))
                ep.future = None
                return
            ep.future = None
        if ep.env is not None:
            env, ep.env = ep.env, None
            env.close()
