"""The ``agentcredit`` command line. Commands stay thin: each parses options and calls library code."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from agentcredit.tools.base import (  # standard library only: keeps `--help` fast
    ToolUnavailableError,
    UserCodeError,
)

app = typer.Typer(
    name="agentcredit",
    help="RL for tool-using LLM agents with fine-grained credit assignment.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def main() -> None:
    """agentcredit: train, evaluate and compare credit-assignment methods for tool-using agents."""
    from agentcredit.progress import line_buffered_stdout
    from agentcredit.runtime import fix_malloc_mmap_threshold

    fix_malloc_mmap_threshold()  # large freed blocks go back to the system (peak RSS; see agentcredit.runtime)
    line_buffered_stdout()  # `make demo | tee log`: SFT losses and held-out lines appear as they happen


@app.command("serve-search")
def serve_search(
    corpus: Annotated[
        Path, typer.Option("--corpus", help="JSONL passages: {id, title, text} or {id, contents}.")
    ],
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="TCP port (0 picks a free one).")
    ] = 8000,
    host: Annotated[str, typer.Option("--host", help="Bind address; localhost by default.")] = "127.0.0.1",
    topk: Annotated[
        int, typer.Option("--topk", min=1, help="Passages per query when a request sends no topk.")
    ] = 3,
    dense: Annotated[
        bool, typer.Option("--dense", help="Dense retrieval (needs the 'dense' extra), not BM25.")
    ] = False,
    model: Annotated[
        Path | None, typer.Option("--model", help="Local sentence-transformers model dir (--dense).")
    ] = None,
    max_concurrency: Annotated[
        int,
        typer.Option(
            "--max-concurrency",
            min=1,
            help="Connections and requests in flight; past it a request gets a 503.",
        ),
    ] = 32,
) -> None:
    """Serve search over HTTP with Search-R1's retrieval-server API (POST /retrieve), for Search-R1 / verl."""
    from agentcredit.tools.search.server import serve  # lazy: keeps `agentcredit --help` fast

    if model is not None and not dense:
        raise typer.BadParameter("--model only applies with --dense", param_hint="--model")
    try:
        serve(
            corpus,
            host=host,
            port=port,
            topk=topk,
            dense=dense,
            model_path=model,
            max_concurrency=max_concurrency,
        )
    except (FileNotFoundError, ValueError, ImportError, OSError) as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        raise typer.Exit(code=2) from exc


# ------------------------------------------------------------------------------------------------ training
ConfigOpt = Annotated[
    str, typer.Option("--config", "-c", help="A preset name (see configs/) or a YAML file.")
]
#: ``--config`` of the commands that run the demo's preset when given none (agentcredit.config.demo_preset)
DemoConfigOpt = Annotated[
    str | None,
    typer.Option(
        "--config",
        "-c",
        help="A preset name (see configs/) or a YAML file (default: the demo's, carl-segment-arith-tools).",
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override a config key: section.key=value (repeatable)."),
]


def _fail(exc: Exception) -> None:
    """One red ``error: ...`` line on stderr, no traceback, exit status 2 (a tool that cannot run included, and
    :class:`UserCodeError`: your reward or environment failing, named with the example)."""
    typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code=2) from exc


def _config(config: str | None, overrides: list[str] | None):
    """The config of ``--config`` (None: the demo's preset) and ``--set``; a bad key, or a ``model.device`` this
    machine does not have, is one line and exit 2 before anything loads."""
    from agentcredit.config import demo_preset, load_config
    from agentcredit.models.device import config_device

    try:
        cfg = load_config(config or demo_preset(), overrides or [])
        config_device(cfg)
    except ValueError as exc:  # ConfigError, and DeviceUnavailable (asking for a GPU torch does not see)
        _fail(exc)
    return cfg


@app.command()
def train(
    config: DemoConfigOpt = None,
    set_: SetOpt = None,
    resume: Annotated[
        Path | None, typer.Option("--resume", help="Continue the run in this directory.")
    ] = None,
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Where the run is written.")] = None,
    allow_failed_gate: Annotated[
        bool,
        typer.Option(
            "--allow-failed-gate",
            help="Train although the model's critic warm-up gate failed (train.allow_failed_gate).",
        ),
    ] = False,
    cold_start: Annotated[
        bool,
        typer.Option(
            "--cold-start",
            help="Train although the model has no critic warm-up, for a method that warms its critic up first "
            "(carl-segment; the paper's cold-start ablation): train.cold_start.",
        ),
    ] = False,
) -> None:
    """Train a method (rollout -> credit assignment -> PPO update), then evaluate on the eval split."""
    from agentcredit.config import ConfigError
    from agentcredit.run import config_for_resume, run_train

    set_ = [
        *(set_ or []),
        *(["train.allow_failed_gate=true"] if allow_failed_gate else []),
        *(["train.cold_start=true"] if cold_start else []),
    ]
    try:
        cfg = config_for_resume(resume, set_) if resume is not None else _config(config, set_)
        run_train(cfg, run_dir=run_dir, resume=resume)
    except (ConfigError, FileNotFoundError, ValueError, ToolUnavailableError, UserCodeError) as exc:
        _fail(exc)


@app.command()
def sft(
    out: Annotated[Path, typer.Option("--out", help="Directory for the fine-tuned model.")],
    config: DemoConfigOpt = None,
    set_: SetOpt = None,
    examples: Annotated[int, typer.Option(min=1, help="Training questions to demonstrate.")] = 256,
    epochs: Annotated[int, typer.Option(min=1)] = 2,
    lr: Annotated[float, typer.Option(help="Learning rate.")] = 5e-5,
    rejection: Annotated[
        int,
        typer.Option(
            min=0, help="Rejection sampling: k samples per question, keep the correct ones (0 = scripted)."
        ),
    ] = 0,
) -> None:
    """Supervised fine-tuning on demonstrations in the preset's protocol format."""
    from agentcredit.run import run_sft

    try:
        run_sft(
            _config(config, set_), out, examples=examples, epochs=epochs, lr=lr, rejection_samples=rejection
        )
    except (FileNotFoundError, ValueError, ToolUnavailableError, UserCodeError) as exc:
        _fail(exc)


@app.command()
def warmup(
    out: Annotated[Path, typer.Option("--out", help="Directory for the warmed-up model and value head.")],
    config: DemoConfigOpt = None,
    set_: SetOpt = None,
    questions: Annotated[
        int | None,
        typer.Option(
            min=4,
            help="Warm-up questions, 20% held out for the gate (default: the 300 that judge it on 60; "
            "paper: 32K rollouts).",
        ),
    ] = None,
    head_epochs: Annotated[
        int, typer.Option(min=0, help="Head-only epochs on cached boundary features (seconds on a CPU).")
    ] = 50,
    steps: Annotated[
        int,
        typer.Option(
            min=0, help="Joint head + backbone steps after them (paper: >= 1,800; ~20 s each here)."
        ),
    ] = 0,
    pairs: Annotated[int, typer.Option(min=4, help="(state, R) pairs per joint step (paper: 256).")] = 64,
) -> None:
    """carl-segment critic warm-up: tier labels, forced/no-tool buckets, critic training and the gate."""
    from agentcredit.run import run_warmup
    from agentcredit.train.warmup import WarmupSettings

    cfg = _config(config, set_)
    try:
        run_warmup(
            cfg,
            out,
            questions=questions,
            settings=WarmupSettings(
                head_epochs=head_epochs, steps=steps, pairs_per_step=pairs, seed=cfg.train.seed
            ),
        )
    except (FileNotFoundError, ValueError, ToolUnavailableError, UserCodeError) as exc:
        _fail(exc)


@app.command()
def study(
    config: Annotated[Path, typer.Option("--config", "-c", help="Study file (see studies/).")],
    out: Annotated[
        Path | None, typer.Option("--out", help="Study directory (default runs/study-<name>).")
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the study in --out: finished runs are kept.")
    ] = False,
    only: Annotated[
        list[str] | None,
        typer.Option("--arm", help="Run only this arm (repeatable); others are left for later."),
    ] = None,
    max_runs: Annotated[
        int | None,
        typer.Option(
            "--max-runs", min=0, help="Train at most this many runs (0: build the shared start only)."
        ),
    ] = None,
    report_only: Annotated[
        bool, typer.Option("--report-only", help="Rewrite the report from the runs there.")
    ] = False,
    publish: Annotated[
        Path | None,
        typer.Option(
            "--publish",
            help="Then copy the report, plots, held-out sets and per-run metrics (no models) to this folder.",
        ),
    ] = None,
    from_published: Annotated[
        Path | None,
        typer.Option(
            "--from-published",
            help="Continue a study from the folder --publish wrote (e.g. on a fresh clone): its ended runs go "
            "into a new --out; the start is rebuilt and must match the published start's weights.",
        ),
    ] = None,
    preflight_only: Annotated[
        bool,
        typer.Option(
            "--preflight-only",
            help="Measure the preconditions, the power and the budget (a timed step per arm), then stop.",
        ),
    ] = False,
    allow_unmet_regime: Annotated[
        bool,
        typer.Option(
            "--allow-unmet-regime",
            help="Run the arms although a precondition is not met; every verdict is stamped 'regime not met'.",
        ),
    ] = False,
    allow_underpowered: Annotated[
        bool,
        typer.Option(
            "--allow-underpowered", help="Run the arms although a claim's MDE exceeds the effect it tests."
        ),
    ] = False,
) -> None:
    """Compare methods from one shared start over seeds on fixed held-out sets; ends in a report with verdicts."""
    from agentcredit.lab.study import Study, StudyError, load_study
    from agentcredit.lab.study_report import write_study_report

    try:
        spec = load_study(config)
        study_dir = out or Path("runs") / f"study-{spec.name}"
        runner = Study(spec, study_dir, source=str(config))
        if report_only:
            paths = write_study_report(runner.layout, study_dir / "report")
            typer.echo(f"report: {paths['markdown']}")
        else:
            if from_published is not None:
                restored = runner.restore(from_published)
                typer.echo(f"restored {restored} ended runs from {from_published}")
            runner.prepare(resume=resume or from_published is not None)
            result = runner.run(
                only=only,
                max_runs=max_runs,
                preflight_only=preflight_only,
                allow_unmet_regime=allow_unmet_regime,
                allow_underpowered=allow_underpowered,
            )
            typer.echo(f"report: {result['markdown']} and {result['html']}")
        if publish is not None:
            typer.echo(f"published {len(runner.publish(publish))} files to {publish}")
    except (StudyError, FileNotFoundError, ValueError, ToolUnavailableError, UserCodeError) as exc:
        _fail(exc)


@app.command()
def demo(
    out: Annotated[
        Path | None, typer.Option("--out", help="Output directory (default runs/demo-<time>).")
    ] = None,
    rl_steps: Annotated[int, typer.Option(min=1, help="carl-segment steps.")] = 8,
    warmup_questions: Annotated[int, typer.Option(min=4, help="Critic warm-up questions.")] = 48,
    sft_examples: Annotated[int, typer.Option(min=8)] = 128,
    eval_limit: Annotated[int, typer.Option(min=4)] = 64,
    set_: SetOpt = None,
) -> None:
    """The main job on the embedded model: SFT, critic warm-up, evaluate, carl-segment, evaluate, the table."""
    from agentcredit.run import run_demo

    try:
        run_demo(
            out,
            rl_steps=rl_steps,
            sft_examples=sft_examples,
            warmup_questions=warmup_questions,
            eval_limit=eval_limit,
            overrides=tuple(set_ or ()),
        )
    except (ToolUnavailableError, UserCodeError) as exc:  # stop with what to fix, not 8 minutes later
        _fail(exc)


# ------------------------------------------------------------------------------------------------ evaluation
@app.command("eval")
def eval_(
    model: Annotated[
        str, typer.Option("--model", "-m", help="'embedded', a model dir, a run dir or a checkpoint dir.")
    ],
    config: Annotated[
        str | None, typer.Option("--config", "-c", help="Preset or YAML (default: the run's own config).")
    ] = None,
    set_: SetOpt = None,
    task: Annotated[
        str | None,
        typer.Option(help="Task to evaluate on (replaces task.name), e.g. bfcl:irrelevance or bfcl:all."),
    ] = None,
    split: Annotated[str | None, typer.Option(help="Split (default: task.eval_split).")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Questions (default: task.eval_limit).")] = None,
    samples: Annotated[int, typer.Option(min=1, help="Episodes per question (needs --temperature).")] = 1,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 = greedy.")] = 0.0,
    tiers: Annotated[
        bool, typer.Option("--tiers", help="Tier 1/2 labels from 5 no-tool samples (carl-segment §4.1).")
    ] = False,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    out: Annotated[
        Path | None, typer.Option("--out", help="Output dir for episodes.jsonl + summary.json.")
    ] = None,
) -> None:
    """Evaluate a model on a task: EM/F1/accuracy, tool calls, tiers, critic AUC/ECE/EV; writes every episode."""
    from agentcredit.config import ConfigError
    from agentcredit.eval.runner import EvalOptions, run_eval

    try:
        options = EvalOptions(
            split=split,
            limit=limit,
            samples=samples,
            temperature=temperature,
            tiers=tiers,
            seed=seed,
            task=task,
        )
        run_eval(model, config, overrides=set_ or [], options=options, out_dir=out)
    except (
        ConfigError,
        FileNotFoundError,
        ValueError,
        ToolUnavailableError,
        UserCodeError,
        ImportError,
    ) as exc:
        _fail(exc)


@app.command()
def compare(
    runs: Annotated[list[Path], typer.Argument(help="Run directories (metrics.jsonl, config.yaml, evals).")],
    out: Annotated[Path, typer.Option("--out", help="Report directory.")] = Path("report"),
) -> None:
    """One report (report.md + self-contained report.html) comparing runs: metrics, curves, calibration, time."""
    from agentcredit.eval.report import write_report

    try:
        paths = write_report(runs, out)
    except (FileNotFoundError, ValueError) as exc:
        _fail(exc)
    typer.echo(f"wrote {paths['markdown']} and {paths['html']}")


@app.command()
def view(
    episodes: Annotated[Path, typer.Argument(help="Episodes JSONL (train.dump_episodes_every or eval).")],
    out: Annotated[Path | None, typer.Option("--out", help="HTML page (default: beside the JSONL).")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Show at most this many episodes.")] = None,
    scale: Annotated[
        float | None, typer.Option(min=0.0, help="|advantage| at full colour (default: the file's max).")
    ] = None,
) -> None:
    """A self-contained HTML page with every token coloured by the advantage it received."""
    from agentcredit.eval.viewer import write_viewer

    try:
        page = write_viewer(episodes, out, limit=limit, scale=scale)
    except (FileNotFoundError, ValueError) as exc:
        _fail(exc)
    typer.echo(f"wrote {page}")


@app.command("probe")
def probe_cmd(
    study: Annotated[
        Path, typer.Option("--study", help="The probe's study file (its 'kind' names the method).")
    ],
    out: Annotated[
        Path | None, typer.Option("--out", help="Where its records and summaries go (default runs/<name>).")
    ] = None,
    part: Annotated[str, typer.Option("--part", help="pilot (planning SDs) or main (verdicts).")] = "main",
) -> None:
    """A method's mechanism probe, pre-registered in a study file: does its signal do what its paper says?"""
    from agentcredit.config import ConfigError
    from agentcredit.lab.mechanism import format_summary, load_spec, run_probe

    if part not in ("pilot", "main"):
        _fail(ValueError(f"--part must be pilot or main, got {part!r}"))
    try:
        spec = load_spec(study)
        summary = run_probe(spec, out or Path("runs") / spec.name, part=part, log=typer.echo)  # type: ignore[arg-type]
    except (ConfigError, FileNotFoundError, ValueError, ToolUnavailableError) as exc:
        _fail(exc)
    typer.echo(format_summary(summary))


@app.command("probe-credit")
def probe_credit_cmd(
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            "-c",
            help="A preset name (see configs/), a YAML file or a run's config.yaml (default: the probe's, "
            "portool-kb-multihop).",
        ),
    ] = None,
    set_: SetOpt = None,
    prompts: Annotated[
        int, typer.Option(min=1, help="Training prompts to roll out (the run's first ones).")
    ] = 8,
    estimator: Annotated[
        list[str] | None,
        typer.Option(
            "--estimator",
            help="A method whose estimate credits the rollouts, by name (repeat; default: every critic-free one).",
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Also write the numbers as JSON here.")] = None,
) -> None:
    """Where each credit estimator puts its credit (tool-call vs answer steps), on the same rollouts."""
    import json

    from agentcredit.config import ConfigError
    from agentcredit.lab.probe import PROBE_ESTIMATORS, PROBE_PRESET, format_probe, probe_credit

    cfg = _config(config or PROBE_PRESET, set_)
    try:
        result = probe_credit(
            cfg, prompts=prompts, estimators=estimator or list(PROBE_ESTIMATORS), log=typer.echo
        )
    except (ConfigError, FileNotFoundError, ValueError, ToolUnavailableError, UserCodeError) as exc:
        _fail(exc)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    typer.echo(format_probe(result))


bench_app = typer.Typer(help="Benchmarks: rollout engine and training step time.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("train")
def bench_train_cmd(
    methods: Annotated[
        list[str] | None, typer.Option("--methods", help="Methods to time (default: all of them).")
    ] = None,
    steps: Annotated[int, typer.Option(min=1, help="Timed steps per method.")] = 2,
    warmup_steps: Annotated[int, typer.Option("--warmup", min=0, help="Untimed steps first.")] = 0,
    prompts: Annotated[int, typer.Option(min=1, help="Prompts per step (the same for every method).")] = 2,
    episodes: Annotated[int, typer.Option(min=2, help="Episodes (leaves) per prompt.")] = 4,
    model: Annotated[str, typer.Option(help="'embedded', 'tiny' or a model dir.")] = "embedded",
    task: Annotated[str, typer.Option(help="Task of the presets <method>-<task>.")] = "arith-tools",
    set_: SetOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="Also write the JSON result here.")] = None,
) -> None:
    """Seconds per training step and per phase for each method, and each one's ratio to GRPO (same run)."""
    import json

    from agentcredit.config import ConfigError
    from agentcredit.lab.bench.train import bench_train, format_bench_table

    try:
        result = bench_train(
            methods or None,
            steps=steps,
            warmup_steps=warmup_steps,
            prompts=prompts,
            episodes=episodes,
            model=model,
            task=task,
            overrides=set_ or [],
            log=(lambda _msg: None) if json_out else typer.echo,
        )
    except (ConfigError, FileNotFoundError, ValueError, ToolUnavailableError, UserCodeError) as exc:
        _fail(exc)
    text = json.dumps(result, indent=2)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    typer.echo(text if json_out else format_bench_table(result))


@bench_app.command("rollout")
def bench_rollout_cmd(
    model: Annotated[
        str, typer.Option(help="'embedded' or a local model dir (e.g. an SFT checkpoint).")
    ] = "embedded",
    dtype: Annotated[str, typer.Option(help="Weights of both loops: float32 or bfloat16.")] = "float32",
    prompts: Annotated[int, typer.Option(min=1, help="Prompts of the task (the same for both loops).")] = 16,
    episodes: Annotated[int, typer.Option(min=2, help="Engine episodes per prompt (tree leaves too).")] = 4,
    task: Annotated[
        str,
        typer.Option(
            help="kb-multihop (tags + BM25) or arith-tools (codefence + sandbox); its grpo preset with --set."
        ),
    ] = "kb-multihop",
    tree_prompts: Annotated[int, typer.Option(min=1, help="Prompts of the tree-strategy runs.")] = 8,
    max_segment_tokens: Annotated[int, typer.Option(min=1, help="Token cap per segment.")] = 128,
    max_episode_tokens: Annotated[int, typer.Option(min=1, help="Token cap per episode.")] = 384,
    skip_naive: Annotated[
        bool, typer.Option("--skip-naive", help="Only the engine and the tree strategies.")
    ] = False,
    set_: SetOpt = None,
    threads: Annotated[
        int | None, typer.Option(min=1, help="torch threads (default: torch's choice).")
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the result as one JSON object (last line).")
    ] = False,
    compare: Annotated[
        bool,
        typer.Option(
            "--compare",
            help="Today's HF engine vs the shared-prompt-prefix engine (and the naive loop) in one run, at "
            "--study-prompts x --episodes and --prompts x --episodes.",
        ),
    ] = False,
    study_prompts: Annotated[
        int, typer.Option(min=1, help="--compare: questions of a study step (the studies: 4).")
    ] = 4,
    max_turns: Annotated[int, typer.Option(min=1, help="Policy segments per episode.")] = 4,
    repeats: Annotated[
        int, typer.Option(min=1, help="--compare: runs of each path per size (the fastest is reported).")
    ] = 1,
    paths: Annotated[
        str,
        typer.Option(
            help="--compare: comma-separated paths, the first is the baseline of the ratios: hf_before, "
            "hf_shared_prefix, vllm (needs vllm installed)."
        ),
    ] = "hf_before,hf_shared_prefix",
    temperature: Annotated[
        float, typer.Option(min=0.0, help="Sampling temperature of every loop (the studies: 1.0).")
    ] = 0.7,
    top_p: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Top-p of every loop (the studies: 1.0).")
    ] = 0.95,
) -> None:
    """Tokens/s of the batched engine vs a naive generate loop, and prefix reuse in tree rollouts."""
    import json

    from agentcredit.config import ConfigError
    from agentcredit.lab.bench.rollout import (
        BenchSettings,
        bench_compare,
        bench_rollout,
        format_compare,
        format_result,
    )

    settings = BenchSettings(
        prompts=prompts,
        episodes=episodes,
        task=task,
        tree_prompts=tree_prompts,
        max_segment_tokens=max_segment_tokens,
        max_episode_tokens=max_episode_tokens,
        max_turns=max_turns,
        overrides=tuple(set_ or ()),
        temperature=temperature,
        top_p=top_p,
    )
    if compare:
        try:
            result = bench_compare(
                model,
                dtype=dtype,
                settings=settings,
                sizes=((study_prompts, episodes), (prompts, episodes)),
                threads=threads,
                skip_naive=skip_naive,
                repeats=repeats,
                paths=[p.strip() for p in paths.split(",") if p.strip()],
                log=(lambda _msg: None) if json_out else typer.echo,
            )
        except (ConfigError, FileNotFoundError, ValueError, ToolUnavailableError, UserCodeError) as exc:
            _fail(exc)
        typer.echo(json.dumps(result) if json_out else format_compare(result))
        return
    try:
        result = bench_rollout(
            model,
            dtype=dtype,
            settings=settings,
            threads=threads,
            skip_naive=skip_naive,
            log=(lambda _msg: None) if json_out else typer.echo,
        )
    except (ConfigError, FileNotFoundError, ValueError, ToolUnavailableError, UserCodeError) as exc:
        _fail(exc)
    typer.echo(json.dumps(result) if json_out else format_result(result))


if __name__ == "__main__":
    app()
