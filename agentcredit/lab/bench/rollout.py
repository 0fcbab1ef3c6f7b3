"""``agentcredit bench rollout``: the batched engine against a naive ``generate`` loop, and prefix reuse in trees.

One run measures, on the same prompts with the same sampling settings and token / turn budgets:

1. **engine**: :class:`~agentcredit.rollout.engine.RolloutEngine` with ``independent(episodes)`` on all prompts at
   once (batched decoding over a KV cache, tools overlapped with decoding, observations prefilled
   incrementally); run once before and once after the naive loop, and ``engine_tokens_per_s`` is the mean of
   the two (the load of a shared machine drifts);
2. **naive**: one episode at a time, each turn a ``model.generate`` call that re-prefills the whole context
   (prompt + every earlier segment and observation), the protocol stop checked by a stopping criterion, tools
   run synchronously. One episode per prompt (its tokens/s does not depend on how many episodes it runs);
3. **ceiling**: HF ``generate`` on the same prompts at a constant full batch (prompts x episodes rows, every row
   decoding the same number of tokens, none stopping early): this CPU's decode and prefill tokens/s when the
   batch never drains (:func:`run_ceiling`). The engine is set against it three ways (:func:`ceiling_efficiency`):
   its decode steps against the decode rate, its whole token mix against both rates, and its raw generated tok/s;
4. **trees**: each tree strategy (PORTool with f = 2 by default, and entropy-guided forking) twice with the same
   seed, with and without prefix reuse: the prefilled and generated token counts of both, and their ratio.

Generated tokens are sampled policy tokens; tokens/s = generated tokens / wall seconds of the whole phase (tool
time included, model loading excluded). The base SmolLM2 rarely follows a tool format zero-shot; the task
default (kb-multihop with the Search-R1 tags and BM25) still gives multi-turn episodes because an output with
neither a search nor an answer gets Search-R1's corrective observation and the episode goes on. The number of
tool turns is reported for both loops; ``--model PATH`` reruns it on an SFT checkpoint.

Both loops use the same weights (``dtype``, default float32: on the CPU this was written on, which has no native
bf16 matmul, a [64 x 576] x [576 x 1536] product ran at 55 GFLOP/s in fp32 and 38 in bf16 on one thread, and
batch-1 products at the same speed in both, so bf16 would slow the engine without helping the naive loop). fp32
also makes the runs with and without prefix reuse sample the same trees (bf16 rounding differs between a prefill
and a decode of the same token, enough to flip rare samples).

The machine's load average is recorded before and after: on a shared machine, quote it with the numbers.

``--compare`` (:func:`bench_compare`, issue 33) instead sets today's HF engine (every question prefills its whole
prompt) against the engine with the prompts' common prefix prefilled once per call, in one run, at the study's
size and at 16 questions x 4 episodes: wall and CPU seconds, generated and prefilled tok/s, peak RSS and the
fraction of this CPU's measured fp32 matmul peak, then their ratios; and what bounds them: the FLOPs each HF run
computed (:func:`flop_accounting`: linear layers per position fed, padding included, LM head per logit row, attention
per query-key pair), the prefill by kind (:func:`prefill_decomposition`), the work no engine can skip
(:func:`needed_work`), the GFLOP per CPU-second against the fp32 matmul peak per CPU-second, where the CPU seconds
went (forwards, one-token decode steps, the rest), and the floors: the Amdahl bound (the needed FLOPs at the peak),
the weight-streaming floor (the longest episode's forwards one after another, each reading every weight) and two
kernel floors (every decode step at all the size's episodes' rows, through this CPU's fp32 products at that row
count): hot (each weight timed alone, so it stays in cache; all attention at the peak) and streamed (every weight
once per forward in a forward's order, as a decode step reads them, and the sampled tokens' attention timed on a
key/value cache per layer).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from agentcredit.protocols.base import Protocol
from agentcredit.rollout.engine import common_prompt_prefix
from agentcredit.rollout.sampling import SamplingParams
from agentcredit.tools.base import ToolRuntime

if TYPE_CHECKING:
    from agentcredit.environment import Environment

Log = Callable[[str], None]
TASKS = ("kb-multihop", "arith-tools")


@dataclass(frozen=True)
class BenchSettings:
    """What both loops share. Defaults: 16 prompts, 4 engine episodes per prompt, temperature 0.7 / top-p 0.95."""

    prompts: int = 16
    episodes: int = 4
    task: str = "kb-multihop"
    temperature: float = 0.7
    top_p: float = 0.95
    max_segment_tokens: int = 128
    max_episode_tokens: int = 384
    max_turns: int = 4
    trees: tuple[str, ...] = ("portool", "entropy_guided")
    tree_prompts: int = 8
    seed: int = 0
    # config overrides of the task's preset (``grpo-<task>``), e.g. PORTool's format on kb-multihop:
    # ("protocol.name=jsoncall", "tools.suite_tools=[knowledge_search]")
    overrides: tuple[str, ...] = ()


def _load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on this platform
        return []


def build_task(task: str, prompts: int, overrides: Sequence[str] = ()) -> tuple[list[Any], Environment]:
    """Examples and environment (protocol, tools, reward) for the benchmark task, built as training builds them
    (:func:`agentcredit.environment.build_environment` on the task's ``grpo-<task>`` preset plus ``overrides``):
    kb-multihop with Search-R1's tags and BM25, arith-tools with code fences and the python sandbox, or any
    protocol an override names. The caller closes the environment: that stops its tools and whatever else it
    started (the MCP servers of ``tools.mcp``).

    Raises :class:`~agentcredit.tools.base.ToolUnavailableError` when the python sandbox cannot run ``print(1)``
    or the corpus cannot be loaded.
    """
    from agentcredit.config import load_config
    from agentcredit.environment import build_environment
    from agentcredit.tasks import load_task

    if task not in TASKS:
        raise ValueError(f"bench rollout: task must be one of {sorted(TASKS)}, got {task!r}")
    config = load_config(f"grpo-{task}", list(overrides))
    env = build_environment(config)
    try:  # the task's options (arith-tools' tier fractions, ...) as training loads them
        examples = load_task(task, split="train", limit=prompts, seed=0, **config.task.options)
    except BaseException:
        env.close()
        raise
    return examples, env


# ------------------------------------------------------------------------------------------------ naive loop


class _ProtocolStop:
    """Stopping criterion for ``generate``: the protocol's ``segment_ends`` on the new text (batch of one)."""

    def __init__(self, protocol: Protocol, state: Any, tokenizer: Any, start: int):
        self.protocol, self.state, self.tokenizer, self.start = protocol, state, tokenizer, start

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        text = self.tokenizer.decode(input_ids[0, self.start :], skip_special_tokens=False)
        done = self.protocol.segment_ends(self.state, text)
        return torch.tensor([done], device=input_ids.device)


def naive_episode(
    model: Any,
    tokenizer: Any,
    protocol: Protocol,
    tools: ToolRuntime,
    question: str,
    settings: BenchSettings,
) -> dict[str, Any]:
    """One episode with ``model.generate`` per turn over the whole context (no cache kept between turns)."""
    from transformers import StoppingCriteriaList

    state = protocol.new_episode(question)
    context = tokenizer(protocol.prompt(state, tokenizer), add_special_tokens=False)["input_ids"]
    generated = prefilled = tool_turns = 0
    greedy = settings.temperature == 0
    for _ in range(min(settings.max_turns, protocol.max_segments)):
        budget = min(
            protocol.max_new_tokens(state, settings.max_segment_tokens),
            settings.max_episode_tokens - generated,
        )
        if budget < 1:
            break
        prefilled += len(context)
        ids = torch.tensor([context])
        stop = _ProtocolStop(protocol, state, tokenizer, len(context))
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=budget,
            do_sample=not greedy,
            temperature=settings.temperature if not greedy else None,
            top_p=settings.top_p if not greedy else None,
            top_k=0,  # off, as in the engine (None would fall back to generation_config's top_k = 50)
            stopping_criteria=StoppingCriteriaList([stop]),
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id
            if tokenizer.pad_token_id is not None
            else tokenizer.eos_token_id,
        )
        new = out[0, len(context) :].tolist()
        generated += len(new)
        text = tokenizer.decode(new, skip_special_tokens=False)
        if new and new[-1] == tokenizer.eos_token_id:
            finish = "eos"
        elif protocol.segment_ends(state, text):
            finish = "stop"
        else:
            finish = "length"
        turn = protocol.read_segment(state, text, finish)
        protocol.record(state, turn, text)
        context = context + new
        if turn.done or generated >= settings.max_episode_tokens:
            break
        results = tools.run(turn.calls) if turn.calls else []
        tool_turns += bool(turn.calls)
        observation = protocol.observation(state, turn, results)
        if observation is not None and observation.text:
            context = context + tokenizer(observation.text, add_special_tokens=False)["input_ids"]
    return {"generated": generated, "prefilled": prefilled, "tool_turns": tool_turns, "turns": state.n_turns}


def run_naive(
    model: Any,
    tokenizer: Any,
    protocol: Protocol,
    tools: ToolRuntime,
    examples: Sequence[Any],
    settings: BenchSettings,
) -> dict[str, Any]:
    torch.manual_seed(settings.seed)
    start = time.perf_counter()
    episodes = [naive_episode(model, tokenizer, protocol, tools, ex.question, settings) for ex in examples]
    seconds = time.perf_counter() - start
    generated = sum(e["generated"] for e in episodes)
    return {
        "episodes": len(episodes),
        "generated_tokens": generated,
        "prefill_tokens": sum(e["prefilled"] for e in episodes),
        "tool_turns": sum(e["tool_turns"] for e in episodes),
        "turns": sum(e["turns"] for e in episodes),
        "seconds": round(seconds, 3),
        "tokens_per_s": generated / seconds if seconds > 0 else 0.0,
    }


# ------------------------------------------------------------------------------------------------ ceiling


def run_ceiling(
    model: Any,
    tokenizer: Any,
    protocol: Protocol,
    examples: Sequence[Any],
    settings: BenchSettings,
    *,
    short: int = 8,
    extra: int = 32,
) -> dict[str, Any]:
    """HF ``generate`` at a constant full batch: the engine's prompts (each ``episodes`` times), no stop.

    Two calls of ``short`` and ``short + extra`` new tokens (``min_new_tokens`` = ``max_new_tokens``, so no row
    ends early and the batch stays full) separate the two rates: decode seconds per step from their difference,
    prefill seconds from the rest of the shorter call. These are the ceilings of this CPU for each kind of work
    at this batch (``generate`` pads to the longest prompt; prefill tokens/s counts the real ones).
    """
    from agentcredit.rollout.engine import question_of

    texts = [protocol.prompt(protocol.new_episode(question_of(ex)), tokenizer) for ex in examples]
    texts = [t for t in texts for _ in range(settings.episodes)]
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = side
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    greedy = settings.temperature == 0
    seconds = []
    for new in (short, short + extra):
        torch.manual_seed(settings.seed)
        start = time.perf_counter()
        model.generate(
            **enc,
            min_new_tokens=new,
            max_new_tokens=new,
            do_sample=not greedy,
            temperature=settings.temperature if not greedy else None,
            top_p=settings.top_p if not greedy else None,
            top_k=0,
            pad_token_id=pad,
        )
        seconds.append(time.perf_counter() - start)
    batch = len(texts)
    step = max(1e-9, (seconds[1] - seconds[0]) / extra)
    # the first new token comes from the prefill's own forward: the shorter call has short - 1 decode steps
    prefill = max(1e-9, seconds[0] - (short - 1) * step)
    prompt_tokens = int(enc["attention_mask"].sum())
    return {
        "batch": batch,
        "prompt_tokens": prompt_tokens,
        "padded_prompt_tokens": int(enc["input_ids"].numel()),
        "seconds": [round(x, 3) for x in seconds],
        "decode_tokens_per_s": batch / step,
        "prefill_tokens_per_s": prompt_tokens / prefill,
    }


def ceiling_efficiency(engine: dict[str, Any], ceiling: dict[str, Any]) -> dict[str, float]:
    """The engine's run set against the constant-batch ceiling.

    * ``decode``: the engine's one-token steps (tokens / seconds; a one-token prefill, such as a fork's recomputed
      last token, counts here too) over the ceiling's decode rate: the cost of a batch that drains as episodes
      end, of gathers and masks;
    * ``work``: the seconds the engine's token mix (its prefilled and decoded tokens) would take at the ceiling's
      two rates, over the seconds the whole rollout took (tools and sampling included);
    * ``generated``: generated tokens/s over the ceiling's decode tokens/s (the raw ratio; low when the episodes
      prefill long observations, which the ceiling never does).
    """
    ideal = (
        engine["prefill_tokens"] / ceiling["prefill_tokens_per_s"]
        + engine["decode_tokens"] / ceiling["decode_tokens_per_s"]
    )
    decode_rate = engine["decode_step_tokens"] / max(1e-9, engine["decode_seconds"])
    return {
        "decode": decode_rate / ceiling["decode_tokens_per_s"],
        "work": ideal / max(1e-9, engine["seconds"]),
        "generated": engine["tokens_per_s"] / ceiling["decode_tokens_per_s"],
    }


# ------------------------------------------------------------------------------------------------ engine


def _engine(
    model: Any,
    tokenizer: Any,
    protocol: Protocol,
    tools: ToolRuntime,
    settings: BenchSettings,
    *,
    reuse_prefix: bool = True,
) -> Any:
    from agentcredit.rollout.engine import EngineConfig, RolloutEngine

    config = EngineConfig(
        sampling=SamplingParams(temperature=settings.temperature, top_p=settings.top_p),
        max_segment_tokens=settings.max_segment_tokens,
        max_episode_tokens=settings.max_episode_tokens,
        max_turns=settings.max_turns,
        seed=settings.seed,
        max_batch=max(64, settings.prompts * settings.episodes),
        reuse_prefix=reuse_prefix,
    )
    return RolloutEngine.for_hf_model(model, tokenizer, protocol, tools, config)


def _strategy(name: str, episodes: int) -> Any:
    from agentcredit.rollout import strategies

    if name == "portool":
        return strategies.step_forks(episodes, 2, merge_identical=False)
    if name == "entropy_guided":
        return strategies.entropy_guided(1, episodes - 1)
    if name == "independent":
        return strategies.independent(episodes)
    raise ValueError(f"bench rollout: unknown tree strategy {name!r} (portool, entropy_guided, independent)")


def _engine_numbers(engine: Any, trees: Sequence[Any]) -> dict[str, Any]:
    stats, backend = engine.stats, engine.backend.stats
    return {
        "episodes": sum(len(t.leaves()) for t in trees),
        "generated_tokens": stats.generated_tokens,
        "prefill_tokens": stats.prefill_tokens,
        "decode_tokens": stats.decode_tokens,
        "decode_step_tokens": backend.decode_tokens,
        "decode_steps": backend.decode_steps,
        "decode_seconds": round(backend.decode_seconds, 3),
        "tool_turns": stats.tool_turns,
        "turns": stats.segments,
        "forks": stats.forks,
        "forward_calls": stats.forward_calls,
        "seconds": round(stats.seconds, 3),
        "tokens_per_s": stats.tokens_per_second,
    }


def run_engine(
    model: Any,
    tokenizer: Any,
    protocol: Protocol,
    tools: ToolRuntime,
    examples: Sequence[Any],
    reward: Callable,
    settings: BenchSettings,
) -> dict[str, Any]:
    from agentcredit.rollout.strategies import independent

    engine = _engine(model, tokenizer, protocol, tools, settings)
    trees = engine.run(list(examples), independent(settings.episodes), reward)
    return _engine_numbers(engine, trees)


def run_tree(
    model: Any,
    tokenizer: Any,
    protocol: Protocol,
    tools: ToolRuntime,
    examples: Sequence[Any],
    reward: Callable,
    settings: BenchSettings,
    name: str,
) -> dict[str, Any]:
    """One tree strategy with and without prefix reuse, same seed (hence the same trees)."""
    out: dict[str, Any] = {}
    for label, reuse in (("reuse", True), ("no_reuse", False)):
        engine = _engine(model, tokenizer, protocol, tools, settings, reuse_prefix=reuse)
        trees = engine.run(list(examples), _strategy(name, settings.episodes), reward, seed=settings.seed)
        out[label] = _engine_numbers(engine, trees)
        out[label]["tree_nodes"] = sum(len(t) for t in trees)
    out["same_trees"] = out["reuse"]["generated_tokens"] == out["no_reuse"]["generated_tokens"]
    out["prefill_ratio"] = out["reuse"]["prefill_tokens"] / max(1, out["no_reuse"]["prefill_tokens"])
    return out


# ------------------------------------------------------------------------------------------------ the benchmark


def _run_header(
    model_path: str, dtype: str, settings: BenchSettings, threads: int | None, **extra: Any
) -> dict[str, Any]:
    """What a benchmark run measured on (model, settings, threads, machine, load), after setting the threads."""
    if threads is not None:
        torch.set_num_threads(threads)
    result: dict[str, Any] = {
        "model": model_path,
        "dtype": dtype,
        "settings": {k: getattr(settings, k) for k in settings.__dataclass_fields__},
        **extra,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_average_start": _load_average(),
    }
    result["settings"]["trees"] = list(settings.trees)
    result["settings"]["overrides"] = list(settings.overrides)
    return result


def bench_rollout(
    model_path: str = "embedded",
    *,
    dtype: str = "float32",
    settings: BenchSettings | None = None,
    threads: int | None = None,
    skip_naive: bool = False,
    log: Log = print,
) -> dict[str, Any]:
    """Run the benchmark; returns a JSON-able dict (see the module docstring)."""
    from agentcredit.models.loading import load_base_model

    settings = settings or BenchSettings()
    result = _run_header(model_path, dtype, settings, threads)
    model, tokenizer = load_base_model(model_path, dtype=dtype, seed=settings.seed)
    examples, env = build_task(settings.task, settings.prompts, settings.overrides)
    protocol, tools, reward = env.protocol, env.tools, env.reward
    try:
        log(
            f"engine: {len(examples)} prompts x {settings.episodes} episodes ({settings.task}, {protocol.name})"
        )
        result["engine"] = run_engine(model, tokenizer, protocol, tools, examples, reward, settings)
        log(f"  {result['engine']['tokens_per_s']:.1f} tok/s, {result['engine']['tool_turns']} tool turns")
        if not skip_naive:
            log(f"naive generate loop: {len(examples)} episodes, one at a time")
            result["naive"] = run_naive(model, tokenizer, protocol, tools, examples, settings)
            log(f"  {result['naive']['tokens_per_s']:.1f} tok/s, {result['naive']['tool_turns']} tool turns")
            # the engine again after the naive loop: on a shared machine the load drifts, and the mean of a run
            # before and a run after is a fairer reference than either (both are reported)
            log(
                f"ceiling: generate at a constant batch of {len(examples) * settings.episodes}, no early stop"
            )
            result["ceiling"] = run_ceiling(model, tokenizer, protocol, examples, settings)
            log(
                f"  decode {result['ceiling']['decode_tokens_per_s']:.1f} tok/s, "
                f"prefill {result['ceiling']['prefill_tokens_per_s']:.1f} tok/s"
            )
            log("engine again")
            result["engine_after"] = run_engine(model, tokenizer, protocol, tools, examples, reward, settings)
            log(f"  {result['engine_after']['tokens_per_s']:.1f} tok/s")
        tree_examples = examples[: settings.tree_prompts]
        result["trees"] = {}
        for name in settings.trees:
            log(
                f"tree {name}: {len(tree_examples)} prompts, {settings.episodes} leaves each, with / without reuse"
            )
            result["trees"][name] = run_tree(
                model, tokenizer, protocol, tools, tree_examples, reward, settings, name
            )
            log(f"  prefilled tokens with / without reuse: {result['trees'][name]['prefill_ratio']:.3f}")
    finally:
        env.close()
    result["load_average_end"] = _load_average()
    runs = [result[k]["tokens_per_s"] for k in ("engine", "engine_after") if k in result]
    result["engine_tokens_per_s"] = sum(runs) / len(runs)
    if "naive" in result:
        result["naive_tokens_per_s"] = result["naive"]["tokens_per_s"]
        result["speedup"] = result["engine_tokens_per_s"] / max(1e-9, result["naive_tokens_per_s"])
        each = [ceiling_efficiency(result[k], result["ceiling"]) for k in ("engine", "engine_after")]
        result["of_ceiling"] = {name: sum(e[name] for e in each) / len(each) for name in each[0]}
    if "portool" in result["trees"]:
        result["tree_prefill_ratio"] = result["trees"]["portool"]["prefill_ratio"]
    return result


def format_result(result: dict[str, Any]) -> str:
    """A short human-readable summary of :func:`bench_rollout`'s result."""
    lines = [
        f"model {result['model']} ({result['dtype']}), task {result['settings']['task']}, "
        f"{result['settings']['prompts']} prompts, torch threads {result['torch_threads']}",
        f"load average start {result['load_average_start']} end {result['load_average_end']}",
        "",
        f"{'loop':<13}{'episodes':>9}{'generated':>11}{'prefilled':>11}{'tool turns':>12}{'seconds':>10}{'tok/s':>9}",
    ]
    for name in ("engine", "naive", "engine_after"):
        if name in result:
            r = result[name]
            lines.append(
                f"{name:<13}{r['episodes']:>9}{r['generated_tokens']:>11}{r['prefill_tokens']:>11}"
                f"{r['tool_turns']:>12}{r['seconds']:>10.1f}{r['tokens_per_s']:>9.1f}"
            )
    if "speedup" in result:
        lines.append(
            f"speedup engine (mean of both runs, {result['engine_tokens_per_s']:.1f} tok/s) / naive: "
            f"{result['speedup']:.1f}x"
        )
    if "of_ceiling" in result:
        c, share = result["ceiling"], result["of_ceiling"]
        lines.append(
            f"ceiling (generate, constant batch {c['batch']}): decode {c['decode_tokens_per_s']:.1f} tok/s, "
            f"prefill {c['prefill_tokens_per_s']:.1f} tok/s"
        )
        lines.append(
            f"engine / ceiling (mean of both runs): decode steps {share['decode']:.2f}, whole rollout's token "
            f"mix {share['work']:.2f}, generated tok/s {share['generated']:.2f}"
        )
    for name, tree in result.get("trees", {}).items():
        lines.append("")
        lines.append(f"tree {name}: prefilled with / without reuse = {tree['prefill_ratio']:.3f}")
        for label in ("reuse", "no_reuse"):
            r = tree[label]
            lines.append(
                f"  {label:<9} prefilled {r['prefill_tokens']:>7}  generated {r['generated_tokens']:>7}  "
                f"nodes {r['tree_nodes']:>5}  forks {r['forks']:>4}  {r['seconds']:.1f}s"
            )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ engine comparison
#: The paths ``bench rollout --compare`` sets side by side: today's HF engine (before issue 33: every question
#: prefills its whole prompt) and the engine with the prompts' common prefix prefilled once per call.
ENGINE_PATHS = {"hf_before": False, "hf_shared_prefix": True}
#: ``--paths`` may also name this one: the same engine with vLLM generating the segments (``rollout.backend: vllm``)
VLLM_PATH = "vllm"
COMPARE_PATHS = (*ENGINE_PATHS, VLLM_PATH)


def start_vllm(model: Any, tokenizer: Any, temperature: float, seed: int) -> dict[str, Any]:
    """vLLM started as the trainer starts it (config + tokenizer, weights pushed in), then one warm-up request (its
    first generate call compiles and packs kernels): the start-up is timed as a whole, and the memory it added."""
    from agentcredit.rollout.backend import SegmentRequest
    from agentcredit.rollout.vllm_backend import VLLMBackend, vllm_available

    if not vllm_available():
        raise ValueError(
            "bench rollout --paths vllm: vllm is not installed here (pip install 'agentcredit[vllm]')"
        )
    rss = _PeakRSS.rss()
    start = time.perf_counter()
    backend = VLLMBackend(
        model, tokenizer, threads=torch.get_num_threads(), temperature=temperature, seed=seed
    )
    warm = time.perf_counter()
    backend.generate(
        [SegmentRequest([tokenizer.eos_token_id or 0] * 8, 4)], SamplingParams(temperature=0), []
    )
    return {
        "backend": backend,
        "startup_seconds": round(time.perf_counter() - start, 3),
        "engine_start_seconds": round(backend.startup_seconds, 3),
        "first_push_seconds": round(backend.push_seconds[0], 3),
        "warmup_seconds": round(time.perf_counter() - warm, 3),
        "rss_added_mib": (_PeakRSS.rss() - rss) / 2**20,
        "vllm_version": __import__("vllm").__version__,
        "kv_cache_gib": os.environ.get("VLLM_CPU_KVCACHE_SPACE"),
    }


class _PeakRSS:
    """Peak resident memory of this process while a block runs, sampled every ``interval`` seconds (Linux
    /proc/self/statm; elsewhere the process's lifetime peak from ``resource``)."""

    def __init__(self, interval: float = 0.05):
        import threading

        self.interval, self.peak, self.start = interval, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    @staticmethod
    def rss() -> int:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            import resource

            return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.rss())

    def __enter__(self) -> _PeakRSS:
        self.start = self.peak = self.rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.rss())


def _compare_run(
    model: Any,
    tokenizer: Any,
    env: Any,
    examples: Sequence[Any],
    settings: BenchSettings,
    *,
    shared_prefix: bool,
    n_params: int,
    peak_flops: float,
    vllm: Any = None,
    shape: Any = None,
    cpu_peak_flops: float | None = None,
) -> dict[str, Any]:
    """One path's rollout; ``vllm``: a started :class:`~agentcredit.rollout.vllm_backend.VLLMBackend`, into which
    the weights are pushed first, as the trainer does before every step's rollout (this also empties vLLM's
    prefix cache, so no run reuses another's prompts)."""
    from agentcredit.rollout.engine import EngineConfig, RolloutEngine
    from agentcredit.rollout.strategies import independent

    config = EngineConfig(
        sampling=SamplingParams(temperature=settings.temperature, top_p=settings.top_p),
        max_segment_tokens=settings.max_segment_tokens,
        max_episode_tokens=settings.max_episode_tokens,
        max_turns=settings.max_turns,
        seed=settings.seed,
        max_batch=64,  # the trainer's default rollout.max_batch
        share_prompt_prefix=shared_prefix,
    )
    push = None
    if vllm is not None:
        push = vllm.push_weights(model)
        before = dict(vllm.stats.extra)
        engine = RolloutEngine(vllm, tokenizer, env.protocol, env.tools, config)
    else:
        engine = RolloutEngine.for_hf_model(model, tokenizer, env.protocol, env.tools, config)
    cpu = time.process_time()
    with _PeakRSS() as memory:
        trees = engine.run(list(examples), independent(settings.episodes), env.reward, seed=settings.seed)
    cpu = time.process_time() - cpu
    out = _engine_numbers(engine, trees)
    if vllm is not None:
        # what vLLM itself prefilled: the prompt tokens of its requests less those its prefix cache held
        sent = vllm.stats.extra["prompt_tokens"] - before["prompt_tokens"]
        cached = vllm.stats.extra["cached_prompt_tokens"] - before["cached_prompt_tokens"]
        out["requests"] = int(vllm.stats.extra["requests"] - before["requests"])
        out["request_prompt_tokens"] = int(sent)
        out["prefill_tokens"] = int(sent - cached)
        out["weight_push_seconds"] = round(push, 3)
    # CPU seconds of this process (all its threads): what the rollout cost, much less moved by other processes'
    # load than wall seconds (which wait for a core on a shared machine)
    out["cpu_seconds"] = round(cpu, 3)
    seconds = max(1e-9, out["seconds"])
    out["shared_prefix_tokens"] = engine.stats.shared_prefix_tokens
    out["prefill_tokens_per_s"] = out["prefill_tokens"] / seconds
    out["peak_rss_mib"] = memory.peak / 2**20
    out["rss_growth_mib"] = (memory.peak - memory.start) / 2**20
    # 2 N FLOPs per token fed (agentcredit.lab.bench.flops' convention: attention and the LM head left out)
    fed = out["prefill_tokens"] + out["decode_tokens"]
    out["of_fp32_peak"] = 2.0 * n_params * fed / seconds / peak_flops
    out["prefill_by_kind"] = prefill_decomposition(trees, out["shared_prefix_tokens"], out["prefill_tokens"])
    if vllm is None and shape is not None and cpu_peak_flops:
        out["flops"] = flop_accounting(shape, engine.backend.stats, trees, cpu, cpu_peak_flops)
    else:  # what a run must compute is the same whatever computes it
        out["needed"] = needed_work(trees)
    return out


def prefill_decomposition(
    trees: Sequence[Any], shared_prefix_tokens: int, prefill_tokens: int
) -> dict[str, int]:
    """What an engine run prefilled, by kind: the shared prompt prefix (prefilled once), the rest of each question's
    prompt (once per question: its episodes share one sequence until their first sampled token), the observations
    (tool outputs; every observation node once) and the rest, re-fed tokens (carl-segment's spliced extractions
    fed again after a truncation, a fork's recomputed last token): ``prefill_tokens`` less the other three."""
    prompts = sum(len(t.segment(0).token_ids) for t in trees)
    observations = sum(
        len(t.segment(i).token_ids)
        for t in trees
        for i in range(1, len(t))
        if t.segment(i).role == "observation"
    )
    shared = int(shared_prefix_tokens)
    question = prompts - (len(trees) * shared if shared else 0)
    return {
        "shared_prompt": shared,
        "question_prompt": question,
        "observations": observations,
        "refed": int(prefill_tokens) - shared - question - observations,
    }


def needed_work(trees: Sequence[Any]) -> dict[str, int]:
    """The forward work no engine can skip to produce these trees: the prompts' common prefix once, the rest of
    each prompt once, every observation once and every sampled token that the episode went on from (a leaf's last
    token is never fed), each at its position in the context (for attention: a token at position p reads p + 1
    positions), and one row of logits per context a token is sampled from. Re-fed tokens (a spliced extraction fed again at its new
    place, recomputed fork tokens) and padding are left out. ``{"tokens", "logit_rows", "attention_pairs",
    "decode_attention_pairs", "prompt_tokens", "observation_tokens", "generated_fed_tokens", "sequential_steps"}``
    (``decode_attention_pairs``: those of the sampled tokens fed back, the ones a decode step computes); the last: forwards that
    must run one after another, the most tokens sampled on one root-to-leaf path (each needs the logits of a forward
    that fed the token before it)."""
    from agentcredit.lab.bench.flops import context_pairs

    prompts = [t.segment(0).token_ids for t in trees]
    shared = common_prompt_prefix(prompts)
    prompt_tokens, pairs = shared, context_pairs(0, shared)
    observation_tokens = generated_fed = logit_rows = steps = decode_pairs = 0
    for tree, prompt in zip(trees, prompts, strict=True):
        prompt_tokens += len(prompt) - shared
        pairs += context_pairs(shared, len(prompt) - shared)
        # nodes whose last logits a policy segment's first token was drawn from
        sampled_after: set[int] = set()
        start = {0: 0}  # node -> position of its first token
        end = {0: len(prompt)}  # node -> length of the context that continues after it
        for node in range(1, len(tree)):  # a child's id is larger than its parent's
            seg, parent = tree.segment(node), tree.parent(node)
            n = len(seg.token_ids)
            start[node] = at = end[parent]
            end[node] = at + n
            if seg.role == "observation":
                observation_tokens += n
                pairs += context_pairs(at, n)
                continue
            # one row of logits per sampled token, but siblings draw their first token from the same row (the
            # episodes of a question all start from its prompt's last logits)
            logit_rows += n - 1
            sampled_after.add(parent)
            fed = n - 1 if tree.is_leaf(node) else n
            generated_fed += fed
            pairs += context_pairs(at, fed)
            decode_pairs += context_pairs(at, fed)
            if seg.info.get("spliced"):  # replacement: it goes on from the transient observation's place
                end[node] = start[parent] + n
        logit_rows += len(sampled_after)
        for leaf in tree.leaves():  # forwards one after another: one per token sampled on the way to the leaf
            chain = sum(
                len(tree.segment(i).token_ids) for i in tree.path(leaf) if tree.segment(i).role == "policy"
            )
            steps = max(steps, chain)
    return {
        "tokens": prompt_tokens + observation_tokens + generated_fed,
        "logit_rows": logit_rows,
        "attention_pairs": pairs,
        "decode_attention_pairs": decode_pairs,
        "prompt_tokens": prompt_tokens,
        "observation_tokens": observation_tokens,
        "generated_fed_tokens": generated_fed,
        "sequential_steps": steps,
    }


def flop_accounting(
    shape: Any, backend_stats: Any, trees: Sequence[Any], cpu_seconds: float, peak_per_cpu_second: float
) -> dict[str, Any]:
    """The FLOPs an HF-engine run computed (every fed position, padding and idle decode rows included; the LM head
    once per row and forward; attention over each step's whole width), the part real tokens needed, the FLOPs no
    engine can skip (:func:`needed_work`), and the GFLOP per CPU-second achieved against the measured peak."""
    from agentcredit.lab.bench.flops import forward_flops

    b = backend_stats
    computed = forward_flops(
        shape,
        tokens=b.tokens_computed,
        logit_rows=b.rows_computed,
        attention_pairs=b.attention_pairs_computed,
    )
    real = forward_flops(
        shape, tokens=b.tokens_fed, logit_rows=b.rows_computed, attention_pairs=b.attention_pairs_real
    )
    decode = forward_flops(
        shape,
        tokens=b.decode_tokens_computed,
        logit_rows=b.decode_tokens_computed,
        attention_pairs=b.decode_attention_pairs_computed,
    )
    prefill_cpu = max(1e-9, b.forward_cpu_seconds - b.decode_cpu_seconds)
    need = needed_work(trees)
    needed = forward_flops(
        shape, tokens=need["tokens"], logit_rows=need["logit_rows"], attention_pairs=need["attention_pairs"]
    )
    cpu = max(1e-9, cpu_seconds)
    return {
        "computed_gflop": {k: v / 1e9 for k, v in computed.items()},
        "real_tokens_gflop": real["total"] / 1e9,
        "needed_gflop": {k: v / 1e9 for k, v in needed.items()},
        "needed": need,
        "tokens_computed": b.tokens_computed,
        "tokens_fed": b.tokens_fed,
        "rows_computed": b.rows_computed,
        "gflop_per_cpu_second": computed["total"] / 1e9 / cpu,
        "of_cpu_peak": computed["total"] / cpu / peak_per_cpu_second,
        "forward_cpu_seconds": round(b.forward_cpu_seconds, 3),
        "decode_cpu_seconds": round(b.decode_cpu_seconds, 3),
        "forward_gflop_per_cpu_second": computed["total"] / 1e9 / max(1e-9, b.forward_cpu_seconds),
        # the one-token steps apart from the prefills: their FLOPs, rows and rate
        "decode_steps": b.decode_steps,
        "decode_rows_computed": b.decode_tokens_computed,
        "decode_rows_real": b.decode_tokens,
        "decode_gflop": decode["total"] / 1e9,
        "decode_gflop_per_cpu_second": decode["total"] / 1e9 / max(1e-9, b.decode_cpu_seconds),
        "decode_cpu_ms_per_step": 1e3 * b.decode_cpu_seconds / max(1, b.decode_steps),
        "prefill_gflop_per_cpu_second": (computed["total"] - decode["total"]) / 1e9 / prefill_cpu,
    }


def bench_compare(
    model_path: str = "embedded",
    *,
    dtype: str = "float32",
    settings: BenchSettings | None = None,
    sizes: Sequence[tuple[int, int]] = ((4, 4), (16, 4)),
    threads: int | None = None,
    skip_naive: bool = False,
    repeats: int = 1,
    paths: Sequence[str] = tuple(ENGINE_PATHS),
    log: Log = print,
) -> dict[str, Any]:
    """Today's HF engine against the improved one (and the naive loop) in ONE run, on the same prompts, seed and
    budgets, at each (questions, episodes per question) size: rollout seconds (one study step's rollout at the
    study's size), generated and prefilled tok/s, peak memory and the fraction of this CPU's measured fp32 matmul
    peak. The naive loop runs one episode per question at the first size. The paths alternate per size, each
    ``repeats`` times (before, after, before, after, ...), and the fastest run of each path is reported (all its
    seconds are kept), so a shared machine's drifting load hits both alike; the ratios are the numbers to quote.
    ``paths`` may add ``vllm`` (:data:`VLLM_PATH`): started once before the runs (its start-up, first weight push and
    warm-up are reported apart), its weights pushed again before each of its runs (timed)."""
    from agentcredit.lab.bench.flops import (
        DecoderShape,
        attention_flops,
        decode_attention_seconds,
        linear_flops_per_token,
        lm_head_flops_per_row,
        matmul_flops,
        matvec_bandwidth,
        streamed_linear_seconds,
        streamed_weights,
        weight_bytes_per_forward,
    )
    from agentcredit.lab.bench.train import non_embedding_parameters
    from agentcredit.models.loading import load_base_model

    settings = settings or BenchSettings()
    unknown = [p for p in paths if p not in COMPARE_PATHS]
    if unknown or not paths:
        raise ValueError(
            f"bench rollout --paths: {unknown or 'none'}; choose from {', '.join(COMPARE_PATHS)}"
        )
    result = _run_header(
        model_path,
        dtype,
        settings,
        threads,
        sizes=[list(s) for s in sizes],
        repeats=repeats,
        paths=list(paths),
    )
    peak = matmul_flops(torch.float32)
    result["fp32_matmul_peak_gflops"] = peak["best"] / 1e9
    # per CPU-second of this process: the peak to set the runs' CPU seconds against (the wall peak above is
    # depressed by whatever else runs on the machine; a CPU-second is the core's while this process holds it)
    cpu_peak = matmul_flops(torch.float32, clock="cpu")
    result["fp32_matmul_peak_gflop_per_cpu_second"] = cpu_peak["best"] / 1e9
    result["fp32_matmul_peak_gflop_per_cpu_second_median"] = cpu_peak["median"] / 1e9
    # a decode step reads every weight whatever its batch: the rate this CPU streams a matrix through a
    # matrix-vector product is the other floor (weight_stream_bound)
    bandwidth = matvec_bandwidth(torch.float32, clock="cpu")
    result["fp32_matvec_gb_per_cpu_second"] = bandwidth["best"] / 1e9
    result["fp32_matvec_gb_per_cpu_second_median"] = bandwidth["median"] / 1e9
    model, tokenizer = load_base_model(model_path, dtype=dtype, seed=settings.seed)
    n_params = non_embedding_parameters(model)
    shape = DecoderShape.from_config(model.config)
    result["model_shape"] = dict(vars(shape))
    result["flops_per_token"] = {
        "linear": linear_flops_per_token(shape),
        "lm_head_per_row": lm_head_flops_per_row(shape),
        "attention_per_context_position": attention_flops(shape, 1),
    }
    weight_bytes = weight_bytes_per_forward(shape, next(model.parameters()).element_size())
    result["weight_bytes_per_forward"] = weight_bytes
    examples, env = build_task(settings.task, max(q for q, _ in sizes), settings.overrides)
    result["protocol"] = env.protocol.name
    result["runs"] = {}
    vllm = None
    try:
        if VLLM_PATH in paths:
            log("starting vLLM (config + tokenizer, weights pushed in, one warm-up request)")
            started = start_vllm(model, tokenizer, settings.temperature, settings.seed)
            vllm = started.pop("backend")
            result["vllm"] = started
            log(f"  {started}, load {_load_average()}")
        for questions, episodes in sizes:
            size = f"{questions}x{episodes}"
            each = BenchSettings(
                **{
                    **result["settings"],
                    "trees": settings.trees,
                    "overrides": settings.overrides,
                    "episodes": episodes,
                }
            )
            result["runs"][size] = {}
            for rep in range(repeats):
                for name in paths:
                    log(f"{size}: {name} ({env.protocol.name}, {settings.task}), run {rep + 1} of {repeats}")
                    r = _compare_run(
                        model,
                        tokenizer,
                        env,
                        examples[:questions],
                        each,
                        shared_prefix=ENGINE_PATHS.get(name, True),
                        n_params=n_params,
                        peak_flops=peak["best"],
                        vllm=vllm if name == VLLM_PATH else None,
                        shape=shape,
                        cpu_peak_flops=cpu_peak["best"],
                    )
                    log(
                        f"  {r['seconds']:.1f} s, {r['tokens_per_s']:.1f} generated tok/s, generated "
                        f"{r['generated_tokens']}, prefilled {r['prefill_tokens']} (shared prefix "
                        f"{r['shared_prefix_tokens']}), CPU {r['cpu_seconds']:.1f} s, peak RSS "
                        f"{r['peak_rss_mib']:.0f} MiB, load {_load_average()}"
                    )
                    if "flops" in r:
                        f = r["flops"]
                        log(
                            f"  computed {f['computed_gflop']['total']:.0f} GFLOP, "
                            f"{f['gflop_per_cpu_second']:.2f} GFLOP per CPU-second ({f['of_cpu_peak']:.2f} of "
                            f"the peak), forward CPU {f['forward_cpu_seconds']:.1f} s (decode "
                            f"{f['decode_cpu_seconds']:.1f} s)"
                        )
                    best = result["runs"][size].get(name)
                    r["all_seconds"] = [*(best["all_seconds"] if best else []), r["seconds"]]
                    if best is None or r["seconds"] < best["seconds"]:  # the least disturbed run is kept
                        result["runs"][size][name] = r
                    else:
                        best["all_seconds"] = r["all_seconds"]
        if not skip_naive:
            questions = sizes[0][0]
            log(f"naive generate loop: {questions} episodes, one at a time")
            with _PeakRSS() as memory:
                naive = run_naive(model, tokenizer, env.protocol, env.tools, examples[:questions], settings)
            naive["prefill_tokens_per_s"] = naive["prefill_tokens"] / max(1e-9, naive["seconds"])
            naive["peak_rss_mib"] = memory.peak / 2**20
            fed = naive["prefill_tokens"] + naive["generated_tokens"]
            naive["of_fp32_peak"] = 2.0 * n_params * fed / max(1e-9, naive["seconds"]) / peak["best"]
            result["naive"] = naive
            log(f"  {naive['tokens_per_s']:.1f} generated tok/s")
    finally:
        env.close()
        if vllm is not None:
            vllm.close()
    result["load_average_end"] = _load_average()
    # every other path against the first one named (hf_before by default): rollout seconds, wall and CPU
    base = paths[0]
    result["baseline"] = base
    result["speedup"] = {
        size: {
            name: runs[base]["seconds"] / max(1e-9, r["seconds"]) for name, r in runs.items() if name != base
        }
        for size, runs in result["runs"].items()
    }
    result["cpu_speedup"] = {
        size: {
            name: runs[base]["cpu_seconds"] / max(1e-9, r["cpu_seconds"])
            for name, r in runs.items()
            if name != base
        }
        for size, runs in result["runs"].items()
    }
    result["bound"] = {
        size: _bound(runs, base, cpu_peak["best"], weight_bytes, bandwidth["best"])
        for size, runs in result["runs"].items()
    }
    # the kernel floors: every decode step at all the size's episodes (the most rows a step can hold), through this
    # CPU's fp32 products at that row count, measured now: "kernel" with each weight hot in cache (timed alone) and
    # all attention at the peak; "kernel_streamed" with every weight read once per forward, in a forward's order, as
    # a decode step reads them, and the sampled tokens' attention timed on a key/value cache per layer
    rows = {f"{q}x{e}": q * e for q, e in sizes}
    weights = None
    for size, bound in result["bound"].items():
        if bound:
            run = result["runs"][size][base]
            bound["kernel"] = _kernel_floor(
                run, shape, rows[size], cpu_peak["best"], *_hot_pass(shape, rows[size])
            )
            if weights is None:
                weights = streamed_weights(shape)
            streamed = streamed_linear_seconds(shape, rows[size], weights=weights)
            need = run["flops"]["needed"]
            # the sampled tokens' mean context: a token at position p reads p + 1 positions
            context = max(1, round(need["decode_attention_pairs"] / max(1, need["generated_fed_tokens"])))
            attention = decode_attention_seconds(shape, rows[size], context)
            bound["kernel_streamed"] = _kernel_floor(
                run,
                shape,
                rows[size],
                cpu_peak["best"],
                streamed["layers"],
                streamed["head"],
                attention_seconds_per_pair=attention / (rows[size] * context),
            )
            bound["kernel_streamed"]["decode_context"] = context
    del weights
    return result


def _hot_pass(shape: Any, rows: int) -> tuple[float, float]:
    """CPU seconds of one forward's products on ``rows`` rows, each weight timed alone (hot in cache):
    ``(all layers, LM head)``."""
    from agentcredit.lab.bench.flops import layer_shapes, linear_seconds

    layer = linear_seconds(layer_shapes(shape), rows)
    return shape.layers * layer, linear_seconds([(shape.hidden, shape.vocab)], rows)


def _kernel_floor(
    run: dict[str, Any],
    shape: Any,
    rows: int,
    cpu_peak_flops: float,
    layers_seconds: float,
    head_seconds: float,
    attention_seconds_per_pair: float | None = None,
) -> dict[str, Any]:
    """:func:`~agentcredit.lab.bench.flops.kernel_floor` of one run's needed work, the products timed at ``rows`` rows:
    ``layers_seconds`` for one pass through all the layers' products, ``head_seconds`` through the LM head; the
    sampled tokens' attention at ``attention_seconds_per_pair`` (all layers) when given, else at the peak with the
    rest."""
    from agentcredit.lab.bench.flops import attention_flops, kernel_floor, linear_flops_per_token

    need = run["flops"]["needed"]
    layer = layers_seconds / shape.layers / rows
    head = head_seconds / rows
    decode_pairs = need["decode_attention_pairs"] if attention_seconds_per_pair is not None else 0
    other = linear_flops_per_token(shape) * (need["prompt_tokens"] + need["observation_tokens"])
    other += attention_flops(shape, need["attention_pairs"] - decode_pairs)
    out = kernel_floor(
        run["cpu_seconds"],
        sampled_positions=need["generated_fed_tokens"],
        logit_rows=need["logit_rows"],
        other_flops=other,
        layer_seconds_per_row=layer,
        layers=shape.layers,
        head_seconds_per_row=head,
        peak_flops_per_cpu_second=cpu_peak_flops,
        decode_attention_pairs=decode_pairs,
        attention_seconds_per_pair=attention_seconds_per_pair or 0.0,
    )
    out["rows"] = rows
    out["layer_gflop_per_cpu_second"] = linear_flops_per_token(shape) / shape.layers / layer / 1e9
    out["head_gflop_per_cpu_second"] = 2 * shape.hidden * shape.vocab / head / 1e9
    if attention_seconds_per_pair is not None:
        out["attention_gflop_per_cpu_second"] = (
            attention_flops(shape, 1) / max(1e-12, attention_seconds_per_pair) / 1e9
        )
    return out


def _bound(
    runs: dict[str, Any], base: str, cpu_peak_flops: float, weight_bytes: int, bytes_per_cpu_second: float
) -> dict[str, Any]:
    """The Amdahl bound of one size: the CPU seconds the FLOPs no engine can skip (the baseline run's trees:
    :func:`needed_work`) take at the measured peak per CPU-second, and the largest speed-up over the baseline's
    CPU seconds that any fp32 engine on this CPU could reach; beside it the weight-streaming floor (the longest
    episode's forwards, one after another, each reading every weight: :func:`weight_stream_bound`)."""
    from agentcredit.lab.bench.flops import amdahl_bound, weight_stream_bound

    b = runs[base]
    needed = b["flops"]["needed_gflop"]["total"] if "flops" in b else None
    if needed is None:
        return {}
    out = amdahl_bound(b["cpu_seconds"], needed * 1e9, cpu_peak_flops)
    out["needed_gflop"] = needed
    steps = b["flops"]["needed"]["sequential_steps"]
    out["weight_stream"] = weight_stream_bound(b["cpu_seconds"], steps, weight_bytes, bytes_per_cpu_second)
    out["weight_stream"]["steps"] = steps
    floor = max(out["min_cpu_seconds"], out["weight_stream"]["min_cpu_seconds"])
    out["both"] = {"min_cpu_seconds": floor, "max_speedup": b["cpu_seconds"] / max(1e-9, floor)}
    out["measured_cpu_speedup"] = {
        name: b["cpu_seconds"] / max(1e-9, r["cpu_seconds"]) for name, r in runs.items() if name != base
    }
    return out


def format_compare(result: dict[str, Any]) -> str:
    """The comparison as a table, with the measured ratios."""
    s = result["settings"]
    lines = [
        f"model {result['model']} ({result['dtype']}), task {s['task']} ({result['protocol']}), torch threads "
        f"{result['torch_threads']}, temperature {s['temperature']} top-p {s['top_p']}, budgets "
        f"{s['max_segment_tokens']} tokens/segment, {s['max_episode_tokens']}/episode, {s['max_turns']} turns",
        f"load average start {result['load_average_start']} end {result['load_average_end']}; fp32 matmul peak "
        f"(best of 5) {result['fp32_matmul_peak_gflops']:.1f} GFLOP/s",
        "",
        f"{'size':<7}{'path':<18}{'episodes':>9}{'generated':>10}{'prefilled':>10}{'shared':>7}{'seconds':>9}"
        f"{'gen tok/s':>10}{'pre tok/s':>10}{'peak MiB':>9}{'of peak':>8}",
        f"(each path's fastest of {result['repeats']} runs; peak MiB = the process's peak RSS during the run)",
    ]
    rows = [(size, name, r) for size, runs in result["runs"].items() for name, r in runs.items()]
    if "naive" in result:
        rows.append((f"{result['sizes'][0][0]}x1", "naive", result["naive"]))
    for size, name, r in rows:
        lines.append(
            f"{size:<7}{name:<18}{r['episodes']:>9}{r['generated_tokens']:>10}{r['prefill_tokens']:>10}"
            f"{r.get('shared_prefix_tokens', 0):>7}{r['seconds']:>9.1f}{r['tokens_per_s']:>10.1f}"
            f"{r['prefill_tokens_per_s']:>10.1f}{r['peak_rss_mib']:>9.0f}{r['of_fp32_peak']:>8.3f}"
        )
    lines.append("")
    for size, runs in result["runs"].items():
        for name, r in runs.items():
            lines.append(
                f"{size} {name}: wall seconds of each run {r['all_seconds']}; CPU seconds of the reported run "
                f"{r['cpu_seconds']}"
            )
    base = result.get("baseline", "hf_before")
    for size, ratios in result["speedup"].items():
        runs = result["runs"][size]
        for name, ratio in ratios.items():
            r, b = runs[name], runs[base]
            lines.append(
                f"{size}: rollout seconds {base} / {name} = {ratio:.2f}x wall, "
                f"{result['cpu_speedup'][size][name]:.2f}x CPU (prefilled tokens "
                f"{r['prefill_tokens'] / max(1, b['prefill_tokens']):.2f}x; generated tokens "
                f"{r['generated_tokens']} vs {b['generated_tokens']})"
            )
    lines.extend(_format_flops(result))
    if "vllm" in result:
        v = result["vllm"]
        pushes = {size: runs[VLLM_PATH]["weight_push_seconds"] for size, runs in result["runs"].items()}
        lines.append(
            f"vllm {v['vllm_version']}: start-up {v['startup_seconds']:.1f} s (engine {v['engine_start_seconds']:.1f}"
            f" s, first weight push {v['first_push_seconds']:.2f} s, warm-up request {v['warmup_seconds']:.1f} s), "
            f"RSS added {v['rss_added_mib']:.0f} MiB (VLLM_CPU_KVCACHE_SPACE={v['kv_cache_gib']} GiB); weight push "
            f"before each reported run: {pushes} s; its prefilled = request prompt tokens not in vLLM's prefix "
            "cache"
        )
    if "naive" in result:
        first = result["runs"][next(iter(result["runs"]))]
        naive = result["naive"]["tokens_per_s"]
        ratios = ", ".join(f"{name} {r['tokens_per_s'] / max(1e-9, naive):.1f}x" for name, r in first.items())
        lines.append(f"generated tok/s vs naive: {ratios}")
    return "\n".join(lines)


def _format_flops(result: dict[str, Any]) -> list[str]:
    """The FLOP accounting of :func:`bench_compare`: per run, the prefill by kind, the FLOPs computed and needed,
    GFLOP per CPU-second against the peak, where the CPU seconds went; per size, the Amdahl bound."""
    if "fp32_matmul_peak_gflop_per_cpu_second" not in result:
        return []
    per = result["flops_per_token"]
    lines = [
        "",
        f"FLOPs (2 per multiply-add): linear layers {per['linear'] / 1e6:.1f} MFLOP per position fed, LM head "
        f"{per['lm_head_per_row'] / 1e6:.1f} MFLOP per row whose logits are computed, attention "
        f"{per['attention_per_context_position'] / 1e3:.1f} kFLOP per query-key pair; fp32 matmul peak "
        f"{result['fp32_matmul_peak_gflop_per_cpu_second']:.1f} GFLOP per CPU-second (best of 5; median "
        f"{result['fp32_matmul_peak_gflop_per_cpu_second_median']:.1f}); matrix-vector streaming "
        f"{result['fp32_matvec_gb_per_cpu_second']:.1f} GB per CPU-second (median "
        f"{result['fp32_matvec_gb_per_cpu_second_median']:.1f})",
        "prefilled by kind: shared prompt (once) + rest of each question's prompt + observations + re-fed "
        "(splices, fork recomputes)",
    ]
    for size, runs in result["runs"].items():
        for name, r in runs.items():
            k = r.get("prefill_by_kind")
            if k:
                lines.append(
                    f"  {size} {name}: {k['shared_prompt']} + {k['question_prompt']} + {k['observations']} + "
                    f"{k['refed']} = {r['prefill_tokens']}; decoded (sampled tokens fed back) {r['decode_tokens']}"
                )
    lines.append(
        f"{'size':<7}{'path':<18}{'fed':>8}{'computed':>9}{'logit rows':>11}{'GFLOP lin':>10}{'head':>7}"
        f"{'attn':>7}{'total':>7}{'needed':>7}{'CPU s':>8}{'GFLOP/CPUs':>11}{'of peak':>8}{'fwd CPU':>8}"
        f"{'decode':>7}{'other':>7}"
    )
    for size, runs in result["runs"].items():
        for name, r in runs.items():
            f = r.get("flops")
            if not f:
                continue
            c = f["computed_gflop"]
            other = r["cpu_seconds"] - f["forward_cpu_seconds"]
            lines.append(
                f"{size:<7}{name:<18}{f['tokens_fed']:>8}{f['tokens_computed']:>9}{f['rows_computed']:>11}"
                f"{c['linear']:>10.0f}{c['lm_head']:>7.0f}{c['attention']:>7.0f}{c['total']:>7.0f}"
                f"{f['needed_gflop']['total']:>7.0f}{r['cpu_seconds']:>8.1f}{f['gflop_per_cpu_second']:>11.2f}"
                f"{f['of_cpu_peak']:>8.2f}{f['forward_cpu_seconds']:>8.1f}{f['decode_cpu_seconds']:>7.1f}"
                f"{other:>7.1f}"
            )
    for size, runs in result["runs"].items():
        for name, r in runs.items():
            f = r.get("flops")
            if f and "decode_steps" in f:
                steps = max(1, f["decode_steps"])
                lines.append(
                    f"  {size} {name}: decode {f['decode_steps']} one-token steps, "
                    f"{f['decode_rows_real'] / steps:.1f} real rows per step ({f['decode_rows_computed'] / steps:.1f}"
                    f" computed), {f['decode_cpu_ms_per_step']:.1f} CPU ms per step, "
                    f"{f['decode_gflop_per_cpu_second']:.1f} GFLOP per CPU-second; prefill forwards "
                    f"{f['prefill_gflop_per_cpu_second']:.1f} GFLOP per CPU-second"
                )
    lines.append(
        "(fed: real positions; computed: with padding and idle decode rows; needed: what no engine can skip, "
        "see below; fwd CPU: CPU seconds inside the model's forwards, decode: of which one-token steps; other: "
        "the rest of the rollout's CPU seconds: sampling, Python, cache copies, tools)"
    )
    for size, bound in result.get("bound", {}).items():
        if not bound:
            continue
        b = result["runs"][size][result["baseline"]]
        need = b["flops"]["needed"]
        g = b["flops"]["needed_gflop"]
        measured = ", ".join(f"{n} {x:.2f}x" for n, x in bound["measured_cpu_speedup"].items())
        lines.append(
            f"{size}: Amdahl bound: the work no engine can skip is {need['tokens']} positions (prompts "
            f"{need['prompt_tokens']} with the shared prefix once, observations {need['observation_tokens']}, "
            f"sampled tokens fed back {need['generated_fed_tokens']}) and {need['logit_rows']} logit rows: "
            f"{g['total']:.0f} GFLOP (linear {g['linear']:.0f}, LM head {g['lm_head']:.0f}, attention "
            f"{g['attention']:.0f}), {bound['min_cpu_seconds']:.1f} CPU s at the peak, so no fp32 engine on this "
            f"CPU can beat {result['baseline']}'s {b['cpu_seconds']:.1f} CPU s by more than "
            f"{bound['max_speedup']:.2f}x (measured: {measured})"
        )
        w = bound["weight_stream"]
        lines.append(
            f"{size}: weight-streaming floor: the longest episode samples {w['steps']} tokens, so at least "
            f"{w['steps']} forwards run one after another, each reading {result['weight_bytes_per_forward'] / 2**20:.0f}"
            f" MiB of weights: {w['min_cpu_seconds']:.1f} CPU s at {result['fp32_matvec_gb_per_cpu_second']:.1f} GB"
            f" per CPU-second (alone: <= {w['max_speedup']:.2f}x); both floors: {bound['both']['min_cpu_seconds']:.1f}"
            f" CPU s, <= {bound['both']['max_speedup']:.2f}x"
        )
        k = bound.get("kernel")
        if k:
            lines.append(
                f"{size}: kernel floor (hot: each weight timed alone, so it stays in cache): even with every decode "
                f"step at all {k['rows']} episodes' rows, this CPU's "
                f"fp32 products at {k['rows']} rows run at {k['layer_gflop_per_cpu_second']:.1f} GFLOP per "
                f"CPU-second through a layer's weights and {k['head_gflop_per_cpu_second']:.1f} through the LM "
                f"head: the {need['generated_fed_tokens']} sampled tokens' forwards take {k['decode_seconds']:.1f} "
                f"CPU s, the {need['logit_rows']} logit rows {k['head_seconds']:.1f} s, prompts, observations and "
                f"attention at the peak {k['other_seconds']:.1f} s: {k['min_cpu_seconds']:.1f} CPU s, so no engine "
                f"on these fp32 kernels beats {result['baseline']} by more than {k['max_speedup']:.2f}x"
            )
        k = bound.get("kernel_streamed")
        if k:
            lines.append(
                f"{size}: kernel floor (streamed: every weight read once per forward, in a forward's order, as a "
                f"decode step reads them; the sampled tokens' attention timed on a key/value cache per layer at "
                f"their mean context, {k['decode_context']}): at {k['rows']} rows "
                f"{k['layer_gflop_per_cpu_second']:.1f} GFLOP per CPU-second through the layers, "
                f"{k['head_gflop_per_cpu_second']:.1f} through the LM head, {k['attention_gflop_per_cpu_second']:.1f}"
                f" in decode attention: sampled tokens {k['decode_seconds']:.1f} CPU s, logit rows "
                f"{k['head_seconds']:.1f} s, their attention {k['attention_seconds']:.1f} s, prompts and observations "
                f"at the peak {k['other_seconds']:.1f} s: {k['min_cpu_seconds']:.1f} CPU s, so no engine on these "
                f"fp32 kernels beats {result['baseline']} by more than {k['max_speedup']:.2f}x"
            )
    return lines
