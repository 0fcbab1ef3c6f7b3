"""The verl agent loop ``agentcredit_agent``: agentcredit's protocols and tools inside verl's rollout.

verl instantiates one loop per sample in its agent-loop workers and calls :meth:`AgentCreditAgentLoop.run`,
which runs :class:`agentcredit.integrations.verl.episode.TreeRunner` against verl's LLM server (vLLM or SGLang),
scores the answer, computes the signals the method needs (:mod:`.signals`: teacher scores on the same server or a
lagged teacher), and returns one ``AgentLoopOutput`` per training view with ``extra_fields["agentcredit"]``
(:mod:`.fields`): segment spans and kinds (invoke / assimilate / commit / search / answer / step), which tool
outputs were transient, the protocol's formatting reward per step, the outcome, and the signals' values.

The data rows come from :mod:`agentcredit.integrations.verl.data` (``raw_prompt`` = the protocol's messages,
``extra_info`` = question and gold answers); set ``actor_rollout_ref.rollout.agent.default_agent_loop`` to
``agentcredit_agent`` (the shipped configs do).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import zlib
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from agentcredit.credit import get_method
from agentcredit.integrations.verl import AGENT_LOOP_NAME, EXTRA_KEY
from agentcredit.integrations.verl.data import check_protocol
from agentcredit.integrations.verl.episode import (
    EpisodeResult,
    Generation,
    TreeRunner,
    episode_rows,
    fork_counts,
    run_tree,
)
from agentcredit.integrations.verl.scoring import TeacherScorer, routed_generate
from agentcredit.integrations.verl.settings import AgentCreditSettings, load_settings
from agentcredit.integrations.verl.signals import ScoringContext, signal_scorers
from agentcredit.integrations.verl.teacher import TEACHER_ROUTER, teacher_client, wants_lagged_teacher
from agentcredit.integrations.verl.tools import build_runtime
from agentcredit.protocols import get_protocol
from agentcredit.rewards import UserReward, WeightedReward, user_reward
from agentcredit.rollout.engine import episode_reward
from agentcredit.rollout.strategies import from_rollout_config
from agentcredit.tasks import Example
from agentcredit.tasks.scoring import answer_reward, outcome_with_abstention
from agentcredit.tools.base import ToolCall, ToolResult, ToolRuntime, ToolUnavailableError
from agentcredit.tools.build import environment_schemas
from agentcredit.tools.episodes import EpisodeSession, StepOutcome

__all__ = [
    "AgentCreditAgentLoop",
    "branch_request_id",
    "episode_outcome",
    "episode_request_id",
    "request_seed",
    "sample_fields",
    "score_request_id",
]

logger = logging.getLogger(__name__)

#: One tool runtime (and its thread pool) per worker process and tool configuration.
_RUNTIMES: dict[str, ToolRuntime] = {}
#: One client of the lagged teacher per worker process (one training job per Ray namespace).
_TEACHERS: dict[str, Any] = {}


def runtime_key(settings: AgentCreditSettings) -> str:
    """The key of a worker's runtime in ``_RUNTIMES``: the protocol and the tool block."""
    return json.dumps([settings.protocol, settings.tools.model_dump()], sort_keys=True)


def _runtime(settings: AgentCreditSettings) -> ToolRuntime:
    key = runtime_key(settings)
    if key not in _RUNTIMES:
        _RUNTIMES[key] = build_runtime(settings.tools, settings.protocol)
    return _RUNTIMES[key]


def sample_fields(kwargs: dict[str, Any]) -> tuple[list[dict[str, Any]], str, list[str]]:
    """Messages, question and gold answers of one dataset row (as written by :mod:`.data`)."""
    if "raw_prompt" not in kwargs:
        raise ValueError("the dataset row has no raw_prompt; set data.return_raw_chat=True")
    messages = [dict(m) for m in kwargs["raw_prompt"]]
    info = kwargs.get("extra_info") or {}
    question = info.get("question")
    golds = info.get("answers")
    if golds is None:
        golds = (kwargs.get("reward_model") or {}).get("ground_truth")
    # parquet round trips lists as numpy arrays; a bare string is one alias
    golds = [golds] if isinstance(golds, str) else list(golds) if golds is not None else []
    if not isinstance(question, str) or not question.strip():
        raise ValueError(
            "extra_info.question is missing: write the data with `python -m agentcredit.integrations.verl "
            "prepare-data` (or add the question to extra_info)"
        )
    if not golds:
        raise ValueError(f"no gold answers for question {question!r:.80}: set extra_info.answers")
    return messages, question, [str(g) for g in golds]


def _protocol_options(settings: AgentCreditSettings, schemas: list[dict[str, Any]]) -> dict[str, Any]:
    """The protocol's options, with your tools' schemas added (beside the suite's, when the suite is on)."""
    options = dict(settings.protocol_options)
    if not schemas or "schemas" in options or settings.protocol not in ("jsoncall", "chat"):
        return options
    suite: list[dict[str, Any]] = []
    if settings.tools.suite:
        from agentcredit.tools.suite import suite_schemas

        suite = [
            x
            for x in suite_schemas()
            if settings.protocol == "jsoncall" or x["function"]["name"] != "response_gen"
        ]
    options["schemas"] = suite + schemas
    return options


_USER_REWARDS: dict[Any, UserReward | WeightedReward] = {}


def _user_reward(spec: str | list[str], weights: list[float] | None = None) -> UserReward | WeightedReward:
    key = (spec if isinstance(spec, str) else tuple(spec), tuple(weights) if weights is not None else None)
    if key not in _USER_REWARDS:
        _USER_REWARDS[key] = user_reward(spec, weights)
    return _USER_REWARDS[key]


def _example(kwargs: dict[str, Any], question: str, golds: list[str]) -> Example:
    """The dataset row as the :class:`~agentcredit.tasks.Example` a user reward (and a signal's scorer) reads:
    the example's info (``extra_info.example_info``, JSON) and ``extra_info`` as its info, and
    ``reward_model.ground_truth`` (what verl reward functions receive) as ``info["ground_truth"]``."""
    extra = dict(kwargs.get("extra_info") or {})
    # the example's own info as prepare-data wrote it (JSON), under the row's index/split/id/metric
    info = json.loads(extra["example_info"]) if isinstance(extra.get("example_info"), str) else {}
    info.update({k: v for k, v in extra.items() if k not in ("question", "answers", "example_info")})
    truth = (kwargs.get("reward_model") or {}).get("ground_truth")
    if truth is not None:
        info["ground_truth"] = (
            list(truth) if not isinstance(truth, str | dict) and hasattr(truth, "__len__") else truth
        )
    return Example(
        str(info.get("id", info.get("index", "row"))),
        question,
        golds,
        str(kwargs.get("data_source") or "verl"),
        info,
    )


def episode_outcome(settings: AgentCreditSettings, answer: str | None, golds: list[str]) -> float:
    """The outcome reward: the task metric (plus the optional format bonus), or PORTool's +1 / 0 / -1."""
    if settings.needs.reward == "judge":  # the method's own judge (PORTool's)
        return outcome_with_abstention(
            answer,
            golds,
            metric=settings.reward_metric,
            unfinished=settings.settings_for("judge").unfinished_reward,
        )
    return answer_reward(answer, golds, metric=settings.reward_metric, format_bonus=settings.format_bonus)


def episode_request_id(
    full_determinism: bool, priority: Any = None, sample: dict[str, Any] | None = None
) -> str:
    """The request id of every generate call of one episode.

    verl's load balancer routes by it (a sticky session): one id per episode keeps its later turns on the replica
    whose prefix cache holds the earlier ones. Under ``rollout.full_determinism`` (verl then also passes the id to
    vLLM as is) it is a function of the sample, so a rerun sends the same ids: verl's ``det-{priority}`` where verl
    gives a priority (as its ``ToolAgentLoop._make_request_id``), else, on verl's V1 TransferQueue workers (no
    priority), ``det-{global_steps}-{index}-{session_id}``: the step, the dataset row and the session of the row's
    ``rollout.n`` (unique among the requests that run at once). Otherwise a fresh uuid.
    """
    if full_determinism:
        if priority is not None:
            return f"det-{int(priority)}"
        sample = sample or {}
        keys = [sample.get(k) for k in ("global_steps", "index", "session_id")]
        if keys[1] is None:
            keys[1] = (sample.get("extra_info") or {}).get("index")
        if all(k is not None for k in keys):
            return "det-" + "-".join(str(int(k)) for k in keys)
    return uuid4().hex


def request_seed(rollout_seed: int, request_id: str, call: int) -> int:
    """The sampling seed of the ``call``-th generate call with ``request_id`` under full determinism.

    verl seeds every request of a replica with ``replica_rank + rollout.seed`` (``vllm_async_server.py``:
    ``sampling_params.setdefault("seed", ...)``), so identical contexts on one replica sample identical tokens: a
    prompt's ``rollout.n`` sessions, PORTool's duplicated branches and carl-critical's forks from one state would
    collapse into one trajectory. A seed per session, branch and turn keeps them apart and still repeats run to
    run (the ids are deterministic, :func:`episode_request_id`)."""
    return zlib.crc32(f"{int(rollout_seed)}:{request_id}:{call}".encode()) & 0x7FFFFFFF


def branch_request_id(episode_id: str, branch: int | None, full_determinism: bool) -> str:
    """The id of the generate calls of one branch of a tree (``branch``: the job's index in the tree; None for a
    single episode). The branches of a round run concurrently: under full determinism verl hands the id to vLLM
    unchanged, and two running requests with one id collide there, so each branch gets its own suffix (as the
    scoring ids do). Otherwise every branch shares the tree's id, so verl's load balancer keeps the whole tree on
    the replica whose prefix cache holds the prompt (it gives vLLM a fresh id per call)."""
    return f"{episode_id}-branch{branch}" if full_determinism and branch is not None else episode_id


def score_request_id(episode_id: str, index: int, full_determinism: bool) -> str:
    """The id of the episode's ``index``-th teacher scoring request. They run concurrently: under full
    determinism verl hands the id to vLLM unchanged, so each gets its own; otherwise they share the episode's
    (verl gives vLLM a fresh id per call) and land on the episode's replica, whose prefix cache holds the episode's
    contexts; :class:`~agentcredit.integrations.verl.scoring.TeacherScorer` reads them from there
    (docs/scaling-out-with-verl.md, "Teacher scoring cost")."""
    return f"{episode_id}-score{index}" if full_determinism else episode_id


@register(AGENT_LOOP_NAME)
class AgentCreditAgentLoop(AgentLoopBase):
    """Runs one agentcredit episode per sample and records what the credit methods need."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if "agentcredit" not in self.config:
            raise ValueError("the agentcredit agent loop needs the `agentcredit:` config block")
        self.settings = load_settings(self.config.agentcredit)
        self.response_length = int(self.rollout_config.response_length)
        self.full_determinism = bool(getattr(self.rollout_config, "full_determinism", False))
        self.engine = str(
            getattr(self.rollout_config, "name", "vllm")
        )  # the rollout's (and the teacher's) engine
        # weight versions the episode was sampled with (verl's staleness tags need them); one loop per sample
        self._weight_steps: list[int] = []
        self._request_id = uuid4().hex  # run() sets the episode's (episode_request_id)
        self._n_scores = 0
        self.rollout_seed = int(getattr(self.rollout_config, "seed", 0) or 0)
        self._calls: dict[str, int] = {}  # generate calls per request id (request_seed's turn)

    async def _generate(
        self, context: list[int], params: dict[str, Any], branch: int | None = None
    ) -> Generation:
        request_id = branch_request_id(self._request_id, branch, self.full_determinism)
        if self.full_determinism and self.engine == "vllm":  # verl's SGLang server has no per-request seed
            call = self._calls[request_id] = self._calls.get(request_id, -1) + 1
            params = {**params, "seed": request_seed(self.rollout_seed, request_id, call)}
        # a branch's own id for vLLM, the episode's for routing: the whole tree on one replica's prefix cache
        out = await routed_generate(self.server_manager, self._request_id, request_id, context, params)
        for key in ("min_global_steps", "max_global_steps"):
            if out.extra_fields.get(key) is not None:
                self._weight_steps.append(int(out.extra_fields[key]))
        return Generation(list(out.token_ids), list(out.log_probs) if out.log_probs else None)

    def _step_fields(self, kwargs: dict[str, Any]) -> dict[str, int]:
        """``min/max_global_steps`` as verl's tool agent loop reports them (the TQ trainer's metrics read them)."""
        steps = self._weight_steps
        if not steps and kwargs.get("global_steps") is not None:
            steps = [int(kwargs["global_steps"])]
        return {"min_global_steps": min(steps), "max_global_steps": max(steps)} if steps else {}

    def _scorer(self, server: Any = None) -> TeacherScorer:
        """Teacher scoring on ``server`` (default: the rollout server) with the rollout's engine, reading the
        episode's contexts from the prefix cache (:mod:`.scoring`); the calls carry the episode's routing id."""

        def request_id() -> str:
            rid = score_request_id(self._request_id, self._n_scores, self.full_determinism)
            self._n_scores += 1
            return rid

        # SGLang's own request id: unique per call; under full determinism the call's id already is
        def sglang_rid(request_id: str) -> str:
            return request_id if self.full_determinism else uuid4().hex

        return TeacherScorer(
            server or self.server_manager,
            self.engine,
            request_id,
            rid=sglang_rid,
            routing=lambda: self._request_id,  # the episode's replica, whose prefix cache holds its contexts
            lora_path=self._sglang_lora_path(),
        )

    def _sglang_lora_path(self) -> str | None:
        """The adapter name verl's SGLang server serves the actor's LoRA under (its own ``generate`` adds it to every
        request; the scorer's direct ``/generate`` call must too), or None."""
        if self.engine != "sglang":
            return None
        from verl.workers.rollout.sglang_rollout.utils import SGLANG_LORA_NAME, lora_served_as_adapter

        model = self.config.actor_rollout_ref.model
        return SGLANG_LORA_NAME if lora_served_as_adapter(model) else None

    def _teacher_scorer(self) -> TeacherScorer:
        """Where the method's teacher scores: the lagged teacher's replicas (:mod:`.teacher`) when it lags the
        policy, else the rollout server, which serves the current policy."""
        if not wants_lagged_teacher(self.settings):
            return self._scorer()
        if TEACHER_ROUTER not in _TEACHERS:
            _TEACHERS[TEACHER_ROUTER] = teacher_client(self.config)
        return self._scorer(_TEACHERS[TEACHER_ROUTER])

    async def run(
        self, sampling_params: dict[str, Any], **kwargs: Any
    ) -> AgentLoopOutput | list[AgentLoopOutput]:
        s = self.settings
        messages, question, golds = sample_fields(kwargs)
        info = kwargs.get("extra_info") or {}
        check_protocol(info, s.protocol, s.protocol_options, f"dataset row {info.get('index', '?')}")
        self._request_id = episode_request_id(self.full_determinism, kwargs.get("priority"), kwargs)
        self._n_scores = 0
        runtime = _runtime(s)
        # your own tools (tools.functions / tools.mcp / tools.environment) are shown by the protocol; the parquet's
        # raw_prompt was written without them, and chat shows tools through the chat template: both render the
        # prompt here
        schemas = [fn.schema for fn in runtime.tools.values() if hasattr(fn, "schema")]
        if runtime.episodes is not None:
            schemas = environment_schemas(runtime.episodes, s.protocol)
        protocol = get_protocol(s.protocol, **_protocol_options(s, schemas))
        render_here = s.protocol == "chat" or bool(schemas)
        loop = asyncio.get_running_loop()
        timing = {"generate": 0.0, "tools": 0.0}

        example = _example(kwargs, question, golds)
        # a per-episode environment (tools.environment): made at the episode's first call, closed after it
        session: EpisodeSession | None = None

        def environment_step(calls: list[ToolCall]) -> StepOutcome:
            nonlocal session
            if session is None:
                session = runtime.episodes.open(example)
            return session.step(calls)

        async def run_tools(calls: list[ToolCall]) -> list[ToolResult] | StepOutcome:
            start = time.perf_counter()
            step = runtime.run if runtime.episodes is None else environment_step
            results = await loop.run_in_executor(None, step, calls)
            timing["tools"] += time.perf_counter() - start
            return results

        state = protocol.new_episode(question)
        # The token ids come from verl's builder (as for every verl agent loop), but the protocol still sees
        # the tokenizer through prompt(): the tips style reads the chat template's role markers there.
        prompt_text = protocol.prompt(state, self.tokenizer)
        if render_here:
            prompt_ids = self.tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
        else:
            prompt_ids = await self.ct_build_initial_tokens(messages)
        start = time.perf_counter()
        runner = TreeRunner(
            protocol,
            state,
            prompt_ids,
            tokenizer=self.tokenizer,
            generate=self._generate,
            run_tools=run_tools,
            sampling_params=dict(sampling_params),
            max_segment_tokens=s.max_segment_tokens,
            max_response_tokens=self.response_length,
            eos_token_ids=_eos_ids(self.tokenizer),
            branching=grows_tree(s, sampling_params),
        )
        try:
            if runner.branching:  # one session grows the prompt's whole tree: one output per leaf
                rng = random.Random(f"{self._request_id}:tree")
                episodes = await run_tree(runner, from_rollout_config(s.tree), rng, protocol.max_segments)
            else:
                episodes = [await runner.run_episode()]
        finally:
            if session is not None:
                session.close()
        timing["generate"] = time.perf_counter() - start - timing["tools"]
        tree_id = None
        if runner.branching:  # unique in the batch; repeats run to run under full determinism
            tree_id = f"{self._request_id}-tree" if self.full_determinism else uuid4().hex
        forks = fork_counts(episodes[0].tree) if runner.branching else None
        outputs = []
        for episode in episodes:
            outputs += await self._outputs(
                episode, prompt_ids, golds, example, kwargs, timing, tree_id, forks, protocol, prompt_text
            )
        return outputs[0] if len(outputs) == 1 else outputs

    async def _outputs(
        self,
        episode: EpisodeResult,
        prompt_ids: list[int],
        golds: list[str],
        example: Example,
        kwargs: dict[str, Any],
        timing: dict[str, float],
        tree_id: str | None,
        forks: dict[int, int] | None,
        protocol: Any,
        prompt_text: str,
    ) -> list[AgentLoopOutput]:
        """verl's outputs of one episode (one per training view), scored, with the signals the method needs."""
        s, loop = self.settings, asyncio.get_running_loop()
        scorers: list[TeacherScorer] = []  # their call counts go into the episode's record

        def counted(make: Any) -> Any:
            def new() -> TeacherScorer:
                scorers.append(make())
                return scorers[-1]

            return new

        contexts = []
        for name, scorer in signal_scorers(s.needs.signals):
            ctx = ScoringContext(
                settings=s,
                part=s.settings_for(name),
                section=next(p.section for p in get_method(s.method).parts if name in p.needs.signals),
                example=example,
                extra_info=kwargs.get("extra_info") or {},
                protocol=protocol,
                tokenizer=self.tokenizer,
                prompt_ids=prompt_ids,
                prompt_text=prompt_text,
                episode=episode,
                views_response=[
                    view.token_ids[len(prompt_ids) :] for view in episode.tree.training_views(episode.leaf)
                ],
                tree_id=tree_id,
                runtime=_runtime(s),
                runtime_key=runtime_key(s),
                outcome=lambda ex, answer: episode_outcome(s, answer, list(ex.answers)),
                scorer=counted(self._scorer),
                teacher=counted(self._teacher_scorer),
            )
            contexts.append((name, scorer, ctx))
            if scorer.prepare is None:
                continue
            try:  # e.g. a teacher prompt built from a demonstration played through the worker's tools
                ctx.prepared = await loop.run_in_executor(None, scorer.prepare, ctx)
            except ToolUnavailableError as exc:  # as an episode whose own tool could not run: left out
                # a tree's credit needs every leaf: the whole session fails (verl pads)
                if tree_id is not None:
                    raise ToolUnavailableError(
                        f"infrastructure failure in a tree rollout, so the prompt's session is dropped: {exc}"
                    ) from None
                episode.infra_failures.append(str(exc))
        if episode.infra_failures:  # a tool could not run: not scored, no teacher calls, nothing trained
            rows = episode_rows(episode, 0.0, format_reward_key=s.format_reward_key)
            logger.warning(
                "agentcredit: episode left out, a tool could not run: %s", "; ".join(episode.infra_failures)
            )
            return [self._output(row, prompt_ids, episode, 0.0, 0.0, timing, kwargs) for row in rows]
        if s.reward is not None:  # your own reward, on the episode's text (the native trainer's definition)
            outcome = episode_reward(
                _user_reward(s.reward, s.reward_weights),
                example,
                episode.answer,
                episode.tree,
                episode.leaf,
                self.tokenizer,
            )
        else:
            outcome = episode_outcome(s, episode.answer, golds)
        accuracy = outcome
        # the return, as the native engine defines it: the outcome plus the environment's step rewards
        outcome += sum(
            episode.tree.segment(n).info.get("env_reward", 0.0) for n in episode.tree.path(episode.leaf)
        )

        fields: dict[str, Any] = {}  # the built-in signals' record fields
        values: dict[str, Any] = {}  # the others, one value per episode (RowRecord.signals)
        for name, scorer, ctx in contexts:
            value = await scorer.score(ctx)
            if scorer.field is not None:
                fields[scorer.field] = value
            else:
                values[name] = value
        rows = episode_rows(
            episode,
            outcome,
            format_reward_key=s.format_reward_key,
            potentials=fields.get("potentials"),
            teacher=fields.get("teacher_logprobs"),
            signals=values,
            tree_id=tree_id,
            fork_counts=forks,
            teacher_calls={k: sum(x.stats[k] for x in scorers) for k in ("requests", "resent")}
            if scorers
            else None,
        )
        return [self._output(row, prompt_ids, episode, outcome, accuracy, timing, kwargs) for row in rows]

    def _output(
        self,
        row: Any,
        prompt_ids: list[int],
        episode: EpisodeResult,
        outcome: float,
        accuracy: float,
        timing: dict[str, float],
        kwargs: dict[str, Any],
    ) -> AgentLoopOutput:
        """One verl row of the episode, with its record in ``extra_fields``."""
        return AgentLoopOutput(
            prompt_ids=list(prompt_ids),
            response_ids=row.response_ids,
            response_mask=row.response_mask,
            response_logprobs=row.response_logprobs,
            reward_score=outcome,
            num_turns=len(episode.tree.path(episode.leaf)),  # the user prompt plus every segment
            metrics=AgentLoopMetrics(generate_sequences=timing["generate"], tool_calls=timing["tools"]),
            extra_fields={
                EXTRA_KEY: row.record.model_dump(),
                "turn_scores": [],
                "tool_rewards": [],
                "reward_extra_info": {"acc": accuracy},
                **self._step_fields(kwargs),
            },
        )


def grows_tree(settings: AgentCreditSettings, sampling_params: dict[str, Any]) -> bool:
    """Whether a session grows the prompt's tree (``agentcredit.tree``): a tree strategy, when sampling. Greedy
    requests (verl's validation) get one episode each: a tree of identical greedy branches says nothing more."""
    return settings.tree.strategy != "independent" and float(sampling_params.get("temperature", 1.0)) > 0


def _eos_ids(tokenizer: Any) -> list[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return []
    return list(eos) if isinstance(eos, list | tuple) else [int(eos)]
