"""``agentcredit bench train``: seconds per training step and per phase for each method, and ratios to GRPO.

Every method runs its preset ``<method>-<task>`` with the same overrides for the parts that set the cost of a
rollout, so differences come from the method itself:

* the same prompts: the first ``prompts`` training questions, all of them in every step;
* the same rollout budget: ``episodes`` leaves per prompt (independent: n = episodes; entropy-guided: n0 = 1
  and n = episodes - 1 forks; PORTool: n = episodes trajectories) and the task preset's token and turn caps;
* the same base weights (loaded once, copied per method) and the same seed.

What stays per method is what defines it: critic, teacher, reference model, update epochs and minibatches, LoRA
(portool), protocol (portool's JSON tool calls). Each method's overhead is its mean seconds per step divided by
GRPO's, measured in the same process; GRPO runs first and again last and the reference is the mean of the two, so
drifting load on a shared machine shows up (both are reported) instead of biasing every ratio one way. The load
average at the start and end is recorded.

The update's FLOPs are printed twice, 6 N per token: for the positions fed to the decoder, where a prefix the rows
of a micro-batch share is forwarded once (:mod:`agentcredit.models.packing`), and for the rows' own tokens, what
row-by-row forwarding would feed.

Tokens per phase are counted by forward pre-hooks on the decoders of the policy, the KL reference and the TIPS
teacher (every input position fed, padding included: that is the work done), so
:mod:`agentcredit.lab.bench.flops` can turn them into achieved FLOP/s.
"""

from __future__ import annotations

import copy
import gc
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from agentcredit.credit import METHODS as REGISTERED
from agentcredit.models.device import peak_gpu_memory_gib

METHODS = tuple(REGISTERED)  # every method the credit registry declares
PHASES = ("rollout", "signals", "update")

Log = Callable[[str], None]


def budget_overrides(strategy: str, *, prompts: int, episodes: int) -> list[str]:
    """Overrides that give any rollout strategy ``episodes`` leaves for each of ``prompts`` prompts."""
    if episodes < 2:
        raise ValueError(f"episodes must be >= 2 (group-relative methods need a group), got {episodes}")
    common = [f"rollout.prompts_per_step={prompts}"]
    if strategy == "independent":
        return [*common, f"rollout.n={episodes}"]
    if strategy == "entropy_guided":
        return [*common, "rollout.n0=1", f"rollout.n={episodes - 1}"]
    if strategy == "step_forks":
        return [*common, f"rollout.n={episodes}"]
    raise ValueError(f"unknown rollout strategy {strategy!r}")


class PhaseTokens:
    """Counts input positions fed to hooked decoders, attributed to the phase that is running; also the process CPU
    seconds of each phase and the engine's stats of the last rollout (``rollout/...``: its generation CPU seconds
    apart from the tool threads')."""

    def __init__(self) -> None:
        self.phase: str | None = None
        self.tokens: dict[str, int] = dict.fromkeys(PHASES, 0)
        self.cpu: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.rollout_stats: dict[str, float] = {}
        self._handles: list[Any] = []

    def hook(self, model: torch.nn.Module | None) -> None:
        if model is None:
            return
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else model

        def count(_module: Any, args: tuple, kwargs: dict) -> None:
            ids = kwargs.get("input_ids")
            if ids is None and args:
                ids = args[0]
            if ids is None:
                ids = kwargs.get("inputs_embeds")
                n = int(ids.shape[0] * ids.shape[1]) if ids is not None else 0
            else:
                n = int(ids.numel())
            if self.phase is not None:
                self.tokens[self.phase] += n

        self._handles.append(decoder.register_forward_pre_hook(count, with_kwargs=True))

    def wrap(self, trainer: Any) -> None:
        """Attribute the trainer's rollout / compute_signals / update calls to their phases."""
        for phase, name in (("rollout", "rollout"), ("signals", "compute_signals"), ("update", "update")):
            method = getattr(trainer, name)

            def wrapped(*args: Any, _method: Any = method, _phase: str = phase, **kwargs: Any) -> Any:
                self.phase = _phase
                start = time.process_time()
                try:
                    result = _method(*args, **kwargs)
                    if _phase == "rollout" and isinstance(result, tuple):  # the trainer's (trees, stats)
                        self.rollout_stats = dict(result[1])
                    return result
                finally:
                    self.cpu[_phase] += time.process_time() - start
                    self.phase = None

            setattr(trainer, name, wrapped)  # instance attribute: learn() calls self.<name>

    def reset(self) -> None:
        self.tokens = dict.fromkeys(PHASES, 0)
        self.cpu = dict.fromkeys(PHASES, 0.0)
        self.rollout_stats = {}

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def non_embedding_parameters(model: torch.nn.Module) -> int:
    """Parameters that do matmul work per token: all but the input embedding (tied LM head counted once, below).

    The LM head is applied only where a log-prob or a next token is needed, so it is left out of the per-token
    count (Kaplan et al.'s convention N = non-embedding parameters).
    """
    embedding = model.get_input_embeddings().weight
    return sum(p.numel() for p in model.parameters() if p is not embedding)


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _mean(values: Sequence[float]) -> float:
    return float(statistics.fmean(values)) if values else float("nan")


def bench_method(
    method: str,
    *,
    base_model: Any,
    tokenizer: Any,
    task: str,
    steps: int,
    warmup_steps: int,
    prompts: int,
    episodes: int,
    overrides: Sequence[str],
    model_name: str,
) -> dict[str, Any]:
    """Time ``steps`` training steps of one method (after ``warmup_steps`` untimed ones)."""
    from agentcredit.config import load_config
    from agentcredit.tasks import load_examples
    from agentcredit.train.trainer import Trainer

    preset = f"{method}-{task}"
    probe = load_config(preset, ["train.tensorboard=false"])
    budget = budget_overrides(probe.rollout.strategy, prompts=prompts, episodes=episodes)
    cfg = load_config(
        preset,
        [
            f"model.name={model_name}",
            *budget,
            f"train.steps={steps + warmup_steps}",
            "train.tensorboard=false",
            *overrides,
        ],
    )
    examples = load_examples(cfg, limit=prompts)
    if len(examples) < prompts:
        raise ValueError(f"{preset}: only {len(examples)} training questions for {prompts} prompts")
    trainer = Trainer(cfg, model=copy.deepcopy(base_model), tokenizer=tokenizer, examples=examples, log=False)
    counter = PhaseTokens()
    for model in (trainer.model, *trainer.frozen_models()):
        counter.hook(model)
    counter.wrap(trainer)
    per_step = []
    if trainer.device.type == "cuda":  # model.device=cuda in the overrides: this method's own GPU peak
        torch.cuda.reset_peak_memory_stats(trainer.device)
    try:
        for i in range(warmup_steps + steps):
            counter.reset()
            metrics = trainer.train_step().metrics
            if i < warmup_steps:
                continue
            per_step.append(
                {
                    "seconds": metrics["time/step"],
                    **{p: metrics[f"time/{p}"] for p in PHASES},
                    "tokens": dict(counter.tokens),
                    "cpu": dict(counter.cpu),
                    "generation_cpu": counter.rollout_stats.get(
                        "rollout/generation_cpu_seconds", float("nan")
                    ),
                    "tool_seconds": counter.rollout_stats.get("rollout/tool_seconds", float("nan")),
                    "tool_calls": counter.rollout_stats.get("rollout/tool_calls", float("nan")),
                    "generated_tokens": metrics.get("rollout/generated_tokens", float("nan")),
                    "episodes": metrics.get("episode/count", float("nan")),
                    "policy_tokens_per_episode": metrics.get("episode/policy_tokens", float("nan")),
                    "tool_calls_per_episode": metrics.get("episode/tool_calls", float("nan")),
                    "update_tokens_in_rows": metrics.get("update/tokens_in_rows", float("nan")),
                    "update_tokens_forwarded": metrics.get("update/tokens_forwarded", float("nan")),
                }
            )
    finally:
        counter.close()
        trainer.close()
    a, o = cfg.algorithm, cfg.optim
    gpu_peak = peak_gpu_memory_gib(trainer.device)
    return {
        "method": method,
        "preset": preset,
        "device": str(trainer.device),
        **({"gpu_peak_gib": gpu_peak} if gpu_peak is not None else {}),
        "settings": {
            "strategy": cfg.rollout.strategy,
            "protocol": cfg.protocol.name,
            "critic": a.critic,
            "kl_coef": a.kl_coef,
            "epochs": o.epochs,
            "minibatch_size": o.minibatch_size,
            "lora": cfg.model.lora.enabled,
            "rollout_backend": cfg.rollout.backend,
        },
        "steps": per_step,
        "seconds_per_step": _mean([s["seconds"] for s in per_step]),
        **{f"{p}_seconds": _mean([s[p] for s in per_step]) for p in PHASES},
        "tokens_per_step": {p: _mean([s["tokens"][p] for s in per_step]) for p in PHASES},
        "generated_tokens_per_step": _mean([s["generated_tokens"] for s in per_step]),
        "episodes_per_step": _mean([s["episodes"] for s in per_step]),
        "rollout_tokens_per_second": _mean([s["generated_tokens"] / s["rollout"] for s in per_step]),
        # process CPU seconds per phase, and the rollout's generation alone (the engine thread, tool threads apart)
        **{f"{p}_cpu_seconds": _mean([s["cpu"][p] for s in per_step]) for p in PHASES},
        "generation_cpu_seconds": _mean([s["generation_cpu"] for s in per_step]),
        "generation_tokens_per_cpu_second": _mean(
            [s["generated_tokens"] / s["generation_cpu"] for s in per_step]
        ),
        "tool_seconds": _mean([s["tool_seconds"] for s in per_step]),
        "tool_calls_per_step": _mean([s["tool_calls"] for s in per_step]),
        # the update's decoder work with shared prefixes forwarded once, and what row-by-row forwarding would feed
        # (the rows' own tokens, no padding): their ratio is the update FLOPs the packing saves
        "update_tokens_in_rows": _mean([s["update_tokens_in_rows"] for s in per_step]),
        "update_tokens_forwarded": _mean([s["update_tokens_forwarded"] for s in per_step]),
    }


def bench_train(
    methods: Sequence[str] | None = None,
    *,
    steps: int = 2,
    warmup_steps: int = 0,
    prompts: int = 2,
    episodes: int = 4,
    model: str = "embedded",
    task: str = "arith-tools",
    overrides: Sequence[str] = (),
    seed: int = 0,
    log: Log = print,
) -> dict[str, Any]:
    """Benchmark ``methods`` (default: every method of the registry); GRPO is the reference, measured first and again last."""
    from agentcredit.models.loading import load_base_model

    methods = list(methods or METHODS)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    others = [m for m in methods if m != "grpo"]
    # GRPO first and, when other methods run, once more at the end: on a shared machine the load drifts, and the
    # reference is the mean of the two (both are reported, so the drift is visible)
    order = ["grpo", *others, *(["grpo"] if others else [])]
    base_model, tokenizer = load_base_model(model, "float32", seed=seed)
    result: dict[str, Any] = {
        "model": model,
        "task": task,
        "prompts": prompts,
        "episodes_per_prompt": episodes,
        "steps": steps,
        "warmup_steps": warmup_steps,
        "overrides": list(overrides),
        "non_embedding_parameters": non_embedding_parameters(base_model),
        "parameters": sum(p.numel() for p in base_model.parameters()),
        "torch_threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_start": load_average(),
        "methods": {},
    }
    start = time.perf_counter()
    for method in order:
        log(f"bench train: {method} ({warmup_steps} warm-up + {steps} timed steps)")
        entry = bench_method(
            method,
            base_model=base_model,
            tokenizer=tokenizer,
            task=task,
            steps=steps,
            warmup_steps=warmup_steps,
            prompts=prompts,
            episodes=episodes,
            overrides=[f"train.seed={seed}", *overrides],
            model_name=model,
        )
        if method in result["methods"]:
            result["grpo_repeat"] = entry
        else:
            result["methods"][method] = entry
        log(f"  {entry['seconds_per_step']:.2f} s/step")
        gc.collect()
    reference = reference_times(result["methods"]["grpo"], result.get("grpo_repeat"))
    result["grpo_reference"] = reference
    for entry in result["methods"].values():
        entry["ratio_to_grpo"] = entry["seconds_per_step"] / reference["seconds_per_step"]
        for p in PHASES:
            ref = reference[f"{p}_seconds"]
            entry[f"{p}_ratio_to_grpo"] = entry[f"{p}_seconds"] / ref if ref > 0 else float("nan")
    result["load_average_end"] = load_average()
    result["wall_seconds"] = time.perf_counter() - start
    return result


def reference_times(first: dict[str, Any], repeat: dict[str, Any] | None) -> dict[str, float]:
    """GRPO's seconds per step and per phase: the mean of its first and repeated measurement (or the first)."""
    keys = ["seconds_per_step", *(f"{p}_seconds" for p in PHASES)]
    runs = [first] if repeat is None else [first, repeat]
    return {k: _mean([r[k] for r in runs]) for k in keys}


def format_bench_table(result: dict[str, Any]) -> str:
    """A markdown table: seconds per step and per phase, ratio to GRPO, budget actually used."""
    head = (
        "| method | s/step | rollout | signals | update | x GRPO | rollout x | signals x | update x "
        "| episodes | gen. tokens | epochs | update GFLOP packed / row-by-row |"
    )
    lines = [head, "|" + "---|" * 13]
    n = result["non_embedding_parameters"]
    for name, e in result["methods"].items():
        lines.append(
            f"| {name} | {e['seconds_per_step']:.2f} | {e['rollout_seconds']:.2f} | {e['signals_seconds']:.2f} "
            f"| {e['update_seconds']:.2f} | {e['ratio_to_grpo']:.2f} | {e['rollout_ratio_to_grpo']:.2f} "
            f"| {e['signals_ratio_to_grpo']:.2f} | {e['update_ratio_to_grpo']:.2f} | {e['episodes_per_step']:.0f} "
            f"| {e['generated_tokens_per_step']:.0f} | {e['settings']['epochs']} "
            f"| {6 * n * e['update_tokens_forwarded'] / 1e9:.0f} / {6 * n * e['update_tokens_in_rows'] / 1e9:.0f} |"
        )
    load = f"load average {result.get('load_average_start')} -> {result.get('load_average_end')}"
    backends = sorted({e["settings"].get("rollout_backend", "hf") for e in result["methods"].values()})
    repeat = result.get("grpo_repeat")
    if repeat is not None:
        load += (
            f"; GRPO measured first {result['methods']['grpo']['seconds_per_step']:.2f} s/step and last "
            f"{repeat['seconds_per_step']:.2f} s/step, ratios use the mean"
        )
    return "\n".join(lines) + (
        f"\n\n{result['model']} on {result['task']}: {result['prompts']} prompts x {result['episodes_per_prompt']} "
        f"episodes, {result['steps']} timed steps per method; {result['torch_threads']} torch threads; rollout "
        f"backend {', '.join(backends)}; {load}"
    )
