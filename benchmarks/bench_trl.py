"""agentcredit's GRPO step next to TRL's ``GRPOTrainer`` on the same model, task, batch and number of completions.

    .venv/bin/pip install -e '.[compare]'        # TRL (and datasets); keeps the installed torch / transformers
    .venv/bin/python benchmarks/bench_trl.py [--steps 2] [--prompts 2] [--completions 4] [--json] [--out FILE]

Both sides: the embedded SmolLM2-135M-Instruct (the same converted weights), the first ``--prompts`` arith-tools
training questions rendered with the grpo preset's own system prompt (codefence protocol) through the chat
template, ``--completions`` completions per prompt at temperature 1, one optimiser step per batch, one epoch,
KL to the reference with beta = 0.001 (the preset's kl_coef), lr 1e-5, fp32 on CPU.

What differs, and why: TRL runs **single-turn** here. Its tool loop (``tools=`` / ``environment_factory=``) parses
JSON tool calls with the tokenizer's response schema, which SmolLM2's chat template does not define, and it cannot
speak the codefence protocol (python in a code fence, output spliced into the assistant turn). So TRL generates one
completion of at most ``rollout.max_new_tokens`` tokens (the preset's per-segment cap, which is what bounds an
episode without a tool call in agentcredit) and is scored by the boxed answer; agentcredit runs its full
multi-turn engine (tools execute when the model writes code). The base model rarely calls a tool, so the work per
step is close; generated tokens per step are printed for both so the ratio can be read per token too.

Reported: seconds per step (wall time of the whole optimiser step, rollout included), and rollout tokens per
second (completion tokens / generation time; TRL's generation time is measured around its
``_generate_single_turn``). Ratios are agentcredit / TRL: above 1 means agentcredit takes longer (s/step) or
generates faster (tokens/s). The machine's load average is printed: quote it with the numbers.
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

from agentcredit.bench.train import bench_train, load_average
from agentcredit.config import load_config
from agentcredit.environment import build_environment, load_examples, outcome_reward
from agentcredit.tasks.scoring import extract_boxed


def trl_grpo(
    steps: int, prompts: int, completions: int, *, model_name: str = "embedded", seed: int = 0
) -> dict[str, Any]:
    """Time ``steps`` TRL GRPO steps; returns per-step seconds, generation seconds and completion tokens."""
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
    gen: dict[str, list[float]] = {"seconds": [], "tokens": []}

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001 - TrainerCallback signature
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
            step_times.append(time.perf_counter() - self.start)

    class TimedGRPO(GRPOTrainer):
        def _generate_single_turn(self, *args: Any, **kwargs: Any):
            start = time.perf_counter()
            completion_ids, logprobs = super()._generate_single_turn(*args, **kwargs)
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
        trainer.train()
    return {
        "step_seconds": step_times,
        "generation_seconds": gen["seconds"],
        "completion_tokens": gen["tokens"],
        "seconds_per_step": statistics.fmean(step_times),
        "generated_tokens_per_step": statistics.fmean(gen["tokens"]),
        "rollout_tokens_per_second": statistics.fmean(
            t / s for t, s in zip(gen["tokens"], gen["seconds"], strict=True)
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--completions", type=int, default=4)
    parser.add_argument(
        "--model", default="embedded", help="'embedded' (the comparison) or 'tiny' (a smoke test)"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    load_start = load_average()
    ours = bench_train(
        ["grpo"],
        steps=args.steps,
        prompts=args.prompts,
        episodes=args.completions,
        model=args.model,
        log=lambda _m: None,
    )["methods"]["grpo"]
    theirs = trl_grpo(args.steps, args.prompts, args.completions, model_name=args.model)
    result = {
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "model": args.model,
        "agentcredit": {
            "seconds_per_step": ours["seconds_per_step"],
            "step_seconds": [s["seconds"] for s in ours["steps"]],
            "rollout_seconds": ours["rollout_seconds"],
            "generated_tokens_per_step": ours["generated_tokens_per_step"],
            "rollout_tokens_per_second": ours["rollout_tokens_per_second"],
        },
        "trl": theirs,
    }
    result["ratio_seconds_per_step"] = ours["seconds_per_step"] / theirs["seconds_per_step"]
    result["ratio_rollout_tokens_per_second"] = (
        ours["rollout_tokens_per_second"] / theirs["rollout_tokens_per_second"]
    )
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text)
    if args.json:
        print(text)
        return
    a, t = result["agentcredit"], result["trl"]
    print("| | s/step | generated tokens/step | rollout tokens/s |")
    print("|---|---|---|---|")
    print(
        f"| agentcredit grpo | {a['seconds_per_step']:.2f} | {a['generated_tokens_per_step']:.0f} | "
        f"{a['rollout_tokens_per_second']:.1f} |"
    )
    print(
        f"| TRL GRPOTrainer (single-turn) | {t['seconds_per_step']:.2f} | {t['generated_tokens_per_step']:.0f} | "
        f"{t['rollout_tokens_per_second']:.1f} |"
    )
    print(
        f"| ratio agentcredit / TRL | {result['ratio_seconds_per_step']:.2f} | | "
        f"{result['ratio_rollout_tokens_per_second']:.2f} |"
    )
    print(f"load average {result['load_average_start']} -> {result['load_average_end']}")


if __name__ == "__main__":
    main()
