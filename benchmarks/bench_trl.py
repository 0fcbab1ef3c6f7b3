"""agentcredit's GRPO step next to TRL's ``GRPOTrainer`` on the same model, task, batch and number of completions.

    .venv/bin/pip install -e '.[compare]'        # TRL (and datasets); keeps the installed torch / transformers
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_trl.py [--batches 2x4,4x8,8x8] [--steps 2] [--json] [--out F]

Both sides: the embedded SmolLM2-135M-Instruct (the same converted weights), the first ``P`` arith-tools training
questions rendered with the grpo preset's own system prompt (codefence protocol) through the chat template, ``N``
completions per prompt at temperature 1, one optimiser step per batch, one epoch, KL to the reference with beta =
0.001 (the preset's kl_coef), lr 1e-5, fp32 on CPU. Every ``PxN`` batch of ``--batches`` runs both sides in one
process (which side goes first alternates from batch to batch, so a drifting load does not favour one side).

What differs, and why: TRL runs **single-turn** here. Its tool loop (``tools=`` / ``environment_factory=``) parses
JSON tool calls with the tokenizer's response schema, which SmolLM2's chat template does not define, and it cannot
speak the codefence protocol (python in a code fence, output spliced into the assistant turn). So TRL generates one
completion of at most ``rollout.max_new_tokens`` tokens (the preset's per-segment cap, which is what bounds an
episode without a tool call in agentcredit) and is scored by the boxed answer; agentcredit runs its full
multi-turn engine (tools execute when the model writes code). The base model rarely calls a tool, so the work per
step is close; generated tokens per step are printed for both so the ratio can be read per token.

Reported per side and batch, as means over the steps: **generation tokens per CPU-second** (process CPU time, not
wall: on a shared machine the wall clock also counts the time spent waiting for a core). TRL's generation is its
``_generate_single_turn`` (process CPU); agentcredit's is the rollout engine's loop thread
(``EngineStats.generation_cpu_seconds``: forwards, sampling and the protocol's checks, without the tool threads,
whose wall seconds are printed apart). The update column is the rest of the step in process CPU seconds (reference
and old log-probs, advantages, the optimiser step; TRL's also scores the rewards). Run it with one torch thread
(``OMP_NUM_THREADS=1``): the loop thread then does all of agentcredit's generation work. Ratios are agentcredit /
TRL: above 1 means agentcredit generates more tokens per CPU-second. The load average is printed: quote it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from agentcredit.config import load_config
from agentcredit.environment import build_environment
from agentcredit.lab.bench.train import bench_train, load_average
from agentcredit.rewards import outcome_reward
from agentcredit.tasks import load_examples
from agentcredit.tasks.scoring import extract_boxed


def trl_grpo(
    steps: int,
    prompts: int,
    completions: int,
    *,
    model_name: str = "embedded",
    seed: int = 0,
    generation_only: bool = False,
) -> dict[str, Any]:
    """Time ``steps`` TRL GRPO steps; returns per-step seconds, generation seconds and completion tokens.
    ``generation_only``: call the trainer's own ``_generate`` on the step's prompts instead of training."""
    try:
        from datasets import Dataset
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as exc:
        raise SystemExit(
            f"bench_trl needs the 'compare' extra: pip install -e '.[compare]' ({exc})"
        ) from None
    from agentcredit.models.loading import load_base_model

    cfg = load_config("grpo-arith-tools")
    examples = load_examples(cfg, limit=prompts)
    env = build_environment(cfg)
    try:
        rows = []
        for ex in examples:
            state = env.protocol.new_episode(ex.question)
            rows.append({"prompt": [dict(m) for m in env.protocol.messages(state)], "id": ex.id})
    finally:
        env.close()
    by_id = {ex.id: ex for ex in examples}

    def reward(completions: list, id: list[str], **_: Any) -> list[float]:  # noqa: A002 - TRL passes columns by name
        out = []
        for completion, example_id in zip(completions, id, strict=True):
            text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
            out.append(outcome_reward(by_id[example_id], extract_boxed(text)))
        return out

    model, tokenizer = load_base_model(model_name, "float32", seed=seed)
    step_times: list[float] = []
    step_cpu: list[float] = []
    gen: dict[str, list[float]] = {"seconds": [], "cpu": [], "tokens": []}

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001 - TrainerCallback signature
            self.start, self.cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
            step_times.append(time.perf_counter() - self.start)
            step_cpu.append(time.process_time() - self.cpu)

    class TimedGRPO(GRPOTrainer):
        def _generate_single_turn(self, *args: Any, **kwargs: Any):
            start, cpu = time.perf_counter(), time.process_time()
            completion_ids, logprobs = super()._generate_single_turn(*args, **kwargs)
            gen["cpu"].append(time.process_time() - cpu)
            gen["seconds"].append(time.perf_counter() - start)
            gen["tokens"].append(float(sum(len(c) for c in completion_ids)))
            return completion_ids, logprobs

    with tempfile.TemporaryDirectory() as tmp:
        # TRL builds its reference model from the policy's name_or_path, so it gets a model directory: the same
        # weights agentcredit loads, saved once (fp32)
        model_dir = Path(tmp) / "model"
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        del model
        args = GRPOConfig(
            output_dir=tmp,
            model_init_kwargs={"dtype": "float32"},
            per_device_train_batch_size=prompts * completions,  # completions per optimiser step
            gradient_accumulation_steps=1,
            num_generations=completions,
            max_completion_length=cfg.rollout.max_new_tokens,  # what bounds a no-tool episode here
            temperature=1.0,
            top_p=1.0,
            beta=cfg.algorithm.kl_coef,
            learning_rate=cfg.optim.lr,
            num_iterations=1,
            max_steps=steps,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
            seed=seed,
        )
        trainer = TimedGRPO(
            model=str(model_dir),
            reward_funcs=reward,
            args=args,
            train_dataset=Dataset.from_list(rows * (steps * completions)),
            processing_class=tokenizer,
            callbacks=[Timer()],
        )
        if (
            generation_only
        ):  # the step's batch: each prompt num_generations times, as TRL's sampler repeats it
            trainer.model.train()
            for _ in range(steps):
                trainer._generate([row["prompt"] for row in rows for _ in range(completions)])
            return {
                "generation_seconds": gen["seconds"],
                "generation_cpu_seconds": gen["cpu"],
                "completion_tokens": gen["tokens"],
                **_generation_means(gen["tokens"], gen["cpu"], gen["seconds"]),
            }
        trainer.train()
    return {
        "step_seconds": step_times,
        "step_cpu_seconds": step_cpu,
        "generation_seconds": gen["seconds"],
        "generation_cpu_seconds": gen["cpu"],
        "completion_tokens": gen["tokens"],
        "seconds_per_step": statistics.fmean(step_times),
        "generated_tokens_per_step": statistics.fmean(gen["tokens"]),
        "generation_cpu_seconds_per_step": statistics.fmean(gen["cpu"]),
        "generation_tokens_per_cpu_second": statistics.fmean(
            t / c for t, c in zip(gen["tokens"], gen["cpu"], strict=True)
        ),
        # the rest of the step: reward scoring, old and reference log-probs, advantages, the optimiser step
        "update_cpu_seconds_per_step": statistics.fmean(
            s - c for s, c in zip(step_cpu, gen["cpu"], strict=True)
        ),
        "rollout_tokens_per_second": statistics.fmean(
            t / s for t, s in zip(gen["tokens"], gen["seconds"], strict=True)
        ),
    }


def _generation_means(tokens: list[float], cpu: list[float], wall: list[float]) -> dict[str, float]:
    return {
        "generated_tokens_per_step": statistics.fmean(tokens),
        "generation_cpu_seconds_per_step": statistics.fmean(cpu),
        "generation_tokens_per_cpu_second": statistics.fmean(t / c for t, c in zip(tokens, cpu, strict=True)),
        "rollout_tokens_per_second": statistics.fmean(t / w for t, w in zip(tokens, wall, strict=True)),
    }


def agentcredit_generation(
    steps: int, prompts: int, completions: int, *, model_name: str = "embedded"
) -> dict:
    """``steps`` rollouts of the GRPO trainer's own engine on the step's prompts (no update in between)."""
    from agentcredit.models.loading import load_base_model
    from agentcredit.train.trainer import Trainer

    cfg = load_config(
        "grpo-arith-tools",
        [f"model.name={model_name}", f"rollout.prompts_per_step={prompts}", f"rollout.n={completions}"]
        + ["train.tensorboard=false"],
    )
    model, tokenizer = load_base_model(model_name, "float32", seed=0)
    trainer = Trainer(
        cfg, model=model, tokenizer=tokenizer, examples=load_examples(cfg, limit=prompts), log=False
    )
    out: dict[str, list[float]] = {k: [] for k in ("tokens", "cpu", "seconds", "tool_seconds", "tool_calls")}
    try:
        for step in range(steps):
            trainer.step = step  # the engine's seed, as in training step ``step``
            _, stats = trainer.rollout(load_examples(cfg, limit=prompts))
            out["tokens"].append(stats["rollout/generated_tokens"])
            out["cpu"].append(stats["rollout/generation_cpu_seconds"])
            out["seconds"].append(stats["rollout/seconds"])
            out["tool_seconds"].append(stats["rollout/tool_seconds"])
            out["tool_calls"].append(stats["rollout/tool_calls"])
    finally:
        trainer.close()
    return {
        "generation_seconds": out["seconds"],
        "generation_cpu_seconds": out["cpu"],
        "completion_tokens": out["tokens"],
        "tool_seconds": out["tool_seconds"],
        "tool_calls": out["tool_calls"],
        **_generation_means(out["tokens"], out["cpu"], out["seconds"]),
        "tool_seconds_per_step": statistics.fmean(out["tool_seconds"]),
    }


def agentcredit_grpo(
    steps: int, prompts: int, completions: int, *, model_name: str = "embedded"
) -> dict[str, Any]:
    """Time ``steps`` agentcredit GRPO steps (:func:`agentcredit.lab.bench.train.bench_train`), the same numbers."""
    e = bench_train(
        ["grpo"], steps=steps, prompts=prompts, episodes=completions, model=model_name, log=lambda _m: None
    )
    e = e["methods"]["grpo"]
    return {
        "step_seconds": [s["seconds"] for s in e["steps"]],
        "step_cpu_seconds": [sum(s["cpu"].values()) for s in e["steps"]],
        "generation_seconds": [s["rollout"] for s in e["steps"]],
        "generation_cpu_seconds": [s["generation_cpu"] for s in e["steps"]],
        "rollout_cpu_seconds": [s["cpu"]["rollout"] for s in e["steps"]],
        "tool_seconds": [s["tool_seconds"] for s in e["steps"]],
        "tool_calls": [s["tool_calls"] for s in e["steps"]],
        "completion_tokens": [s["generated_tokens"] for s in e["steps"]],
        "seconds_per_step": e["seconds_per_step"],
        "generated_tokens_per_step": e["generated_tokens_per_step"],
        "generation_cpu_seconds_per_step": e["generation_cpu_seconds"],
        "generation_tokens_per_cpu_second": e["generation_tokens_per_cpu_second"],
        "update_cpu_seconds_per_step": e["signals_cpu_seconds"] + e["update_cpu_seconds"],
        "tool_seconds_per_step": e["tool_seconds"],
        "rollout_tokens_per_second": e["rollout_tokens_per_second"],
    }


def parse_batches(text: str) -> list[tuple[int, int]]:
    """``"2x4,4x8"`` -> ``[(2, 4), (4, 8)]`` (prompts x completions per prompt)."""
    out = []
    for part in text.split(","):
        try:
            prompts, completions = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--batches: {part!r} is not PROMPTSxCOMPLETIONS (e.g. 4x8)") from None
        if prompts < 1 or completions < 2:
            raise SystemExit(f"--batches: {part!r} needs >= 1 prompt and >= 2 completions (a GRPO group)")
        out.append((prompts, completions))
    return out


def parse_steps(text: str, batches: int) -> list[int]:
    """``"2"`` -> the same steps for every batch; ``"8,2,1"`` -> one per batch (as many as ``--batches`` has)."""
    try:
        steps = [int(x) for x in text.split(",")]
    except ValueError:
        raise SystemExit(f"--steps: {text!r} is not a number or a comma-separated list of numbers") from None
    if len(steps) == 1:
        steps *= batches
    if len(steps) != batches or min(steps) < 1:
        raise SystemExit(f"--steps: {text!r} needs one number >= 1, or one per batch ({batches})")
    return steps


def format_table(result: dict[str, Any]) -> str:
    head = (
        "| batch | side | gen. tokens/step | gen. CPU s/step | **gen. tokens / CPU-s** | tool s/step (wall) "
        "| update CPU s/step | step s (wall) |"
    )
    lines = [head, "|" + "---|" * 8]
    for b in result["batches"]:
        for side in ("agentcredit", "trl"):
            e = b[side]
            tools = f"{e['tool_seconds_per_step']:.2f}" if side == "agentcredit" else "-"
            update = f"{e['update_cpu_seconds_per_step']:.2f}" if "update_cpu_seconds_per_step" in e else "-"
            step = f"{e['seconds_per_step']:.2f}" if "seconds_per_step" in e else "-"
            lines.append(
                f"| {b['batch']} | {side} | {e['generated_tokens_per_step']:.0f} "
                f"| {e['generation_cpu_seconds_per_step']:.2f} | {e['generation_tokens_per_cpu_second']:.1f} "
                f"| {tools} | {update} | {step} |"
            )
        update = f"{b['ratio_update_cpu_seconds']:.2f}x" if "ratio_update_cpu_seconds" in b else "-"
        lines.append(
            f"| {b['batch']} | **agentcredit / TRL** | | | **{b['ratio_generation_tokens_per_cpu_second']:.2f}x** "
            f"| | {update} | |"
        )
    lines.append("")
    lines.append(
        f"{result['model']}, steps per side: "
        + ", ".join(f"{b['batch']} x {b['steps']}" for b in result["batches"])
        + f"{' (generation only)' if result.get('generation_only') else ''}, {result['torch_threads']} torch thread(s); "
        f"load average {result['load_average_start']} -> {result['load_average_end']}"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="2x4,4x8,8x8", help="PROMPTSxCOMPLETIONS, comma-separated")
    parser.add_argument(
        "--steps",
        default="2",
        help="steps per side: one number for every batch, or one per batch (e.g. 8,2,1): at 2x4 a step's tokens "
        "vary ~2x between steps of one distribution, so the small batch needs more steps to compare means",
    )
    parser.add_argument(
        "--model", default="embedded", help="'embedded' (the comparison) or 'tiny' (a smoke test)"
    )
    parser.add_argument(
        "--generation-only",
        action="store_true",
        help="time each side's generation alone (the trainers' own generate calls, no update): a third of the CPU",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch

    result: dict[str, Any] = {
        "load_average_start": load_average(),
        "model": args.model,
        "steps": args.steps,
        "generation_only": args.generation_only,
        "torch_threads": torch.get_num_threads(),
        "batches": [],
    }
    only = args.generation_only
    ours = agentcredit_generation if only else agentcredit_grpo
    batches = parse_batches(args.batches)
    steps_per_batch = parse_steps(args.steps, len(batches))
    result["steps"] = steps_per_batch
    for i, ((prompts, completions), steps) in enumerate(zip(batches, steps_per_batch, strict=True)):
        sides = {
            "agentcredit": lambda p=prompts, n=completions, k=steps: ours(k, p, n, model_name=args.model),
            "trl": lambda p=prompts, n=completions, k=steps: trl_grpo(
                k, p, n, model_name=args.model, generation_only=only
            ),
        }
        order = ["agentcredit", "trl"] if i % 2 == 0 else ["trl", "agentcredit"]
        entry: dict[str, Any] = {"batch": f"{prompts}x{completions}", "steps": steps, "order": order}
        for side in order:
            entry[side] = sides[side]()
            entry[f"load_average_after_{side}"] = load_average()
        a, t = entry["agentcredit"], entry["trl"]
        entry["ratio_generation_tokens_per_cpu_second"] = (
            a["generation_tokens_per_cpu_second"] / t["generation_tokens_per_cpu_second"]
        )
        if not only:
            entry["ratio_update_cpu_seconds"] = (
                a["update_cpu_seconds_per_step"] / t["update_cpu_seconds_per_step"]
            )
        result["batches"].append(entry)
        if args.out:  # written after every batch, so a long run keeps what it measured
            args.out.write_text(json.dumps(result, indent=2))
        if not args.json:
            print(
                f"{entry['batch']}: generation tokens per CPU-second, agentcredit / TRL = "
                f"{entry['ratio_generation_tokens_per_cpu_second']:.2f}",
                flush=True,
            )
    result["load_average_end"] = load_average()
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2) if args.json else format_table(result))


if __name__ == "__main__":
    main()
