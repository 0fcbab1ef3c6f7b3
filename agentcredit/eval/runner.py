"""``agentcredit eval``: evaluate a model, run or checkpoint on a task; write ``episodes.jsonl`` + ``summary.json``.

The environment (protocol, tools, outcome reward) is built from the config exactly as in training, so the
numbers are comparable with the training curves. Greedy decoding by default (carl-segment §6: temperature 0 for
final numbers); ``samples=k`` with a temperature gives k sampled episodes per question.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentcredit.config import Config, ConfigError, load_config
from agentcredit.credit.methods import DEFAULT_METHOD

Log = Callable[[str], None]


@dataclass
class EvalOptions:
    split: str | None = None  # default: the config's task.eval_split
    limit: int | None = None  # default: the config's task.eval_limit
    samples: int = 1
    temperature: float = 0.0
    tiers: bool = False  # carl-segment Tier 1 / Tier 2 labels (5 no-tool samples per question)
    tier_samples: int = 5  # carl-segment.md §4.1: 5
    seed: int = 0
    task: str | None = None  # replaces the config's task.name (e.g. bfcl:irrelevance)

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise ValueError(f"samples must be >= 1, got {self.samples}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.samples > 1 and self.temperature == 0:
            raise ValueError("samples > 1 with greedy decoding repeats one episode: give a temperature > 0")
        if self.tier_samples < 1:
            raise ValueError(f"tier_samples must be >= 1, got {self.tier_samples}")


#: The preset ``--task bfcl:...`` evaluates with when neither ``--config`` nor a run's config is given: the
#: default method's (evaluation trains nothing, so any method's ``<method>-bfcl`` pair reads the same task).
BFCL_PRESET = f"{DEFAULT_METHOD}-bfcl"


def eval_config(
    config: str | Path | None, overrides: list[str], run_config: Config | None, task: str | None = None
) -> Config:
    """The config to evaluate with: ``--config`` (+ overrides), else the evaluated run's own config; ``task``
    replaces its task.name. A BFCL task needs no config: the ``bfcl`` task preset (protocol chat) is used."""
    from agentcredit.tasks.bfcl import is_bfcl

    if task is not None:
        overrides = [*overrides, f"task.name={task}"]
        if config is None and run_config is None and is_bfcl(task):
            config = BFCL_PRESET
    if config is not None:
        return load_config(config, overrides)
    if run_config is None:
        raise ConfigError("--config is required unless --model is a run or checkpoint directory")
    data = run_config.model_dump(mode="json")
    from agentcredit.config import apply_overrides, validate_config

    apply_overrides(data, overrides)
    return validate_config(data, source="the run's config.yaml")


def default_out_dir(model: str, config: Config, split: str) -> Path:
    path = Path(model)
    if (path / "config.yaml").is_file() and (path / "checkpoints").is_dir():
        return path / f"eval-{split}"
    name = path.name or str(model)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return (
        Path("runs") / f"eval-{name}-{config.task.name.replace(':', '_').replace('/', '_')}-{split}-{stamp}"
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # strict JSON has no NaN; null reads as "not defined" (e.g. AUC with one tier empty)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for record in records:
            fh.write(json.dumps(_jsonable(record)) + "\n")


def run_eval(
    model: str,
    config: str | Path | None = None,
    *,
    overrides: list[str] | None = None,
    options: EvalOptions | None = None,
    out_dir: Path | None = None,
    log: Log = print,
) -> dict[str, Any]:
    """Evaluate ``model`` (see :mod:`agentcredit.eval.loading`) and write the results; returns summary.json's data
    (:func:`~agentcredit.eval.evaluate.summary_file`: flat, the metrics at the top level) and ``out_dir``."""
    from agentcredit.environment import build_environment
    from agentcredit.eval.evaluate import critic_metrics, evaluate, rollout_caps, summary_file
    from agentcredit.eval.loading import load_for_eval
    from agentcredit.models.device import config_device
    from agentcredit.tasks import load_examples
    from agentcredit.tasks.bfcl import summary_tables

    options = options or EvalOptions()
    start = time.perf_counter()
    loaded = load_for_eval(model, seed=options.seed)
    cfg = eval_config(config, list(overrides or []), loaded.run_config, options.task)
    loaded.to(config_device(cfg))  # model.device of the evaluation's config
    split = options.split or cfg.task.eval_split
    limit = options.limit or cfg.task.eval_limit
    examples = load_examples(cfg, split=split, limit=limit)
    if not examples:
        raise ValueError(f"task {cfg.task.name!r} split {split!r}: no examples")
    log(
        f"evaluating {loaded.source} on {cfg.task.name}/{split}: {len(examples)} questions x {options.samples}"
    )

    tiers = None
    if options.tiers:
        if cfg.protocol.name not in ("codefence", "chat"):
            raise ValueError(
                "--tiers labels questions with the critic warm-up's no-tool prompt, which only the codefence and chat "
                f"protocols have (this config uses protocol.name={cfg.protocol.name!r})"
            )
        from agentcredit.train.warmup import tier_labels

        log(f"tier labels: {options.tier_samples} no-tool samples per question (the warm-up's tiers, §4.1)")
        tiers = tier_labels(loaded.model, loaded.tokenizer, cfg, examples, options.tier_samples, options.seed)

    env = build_environment(cfg)
    try:
        summary, records = evaluate(
            loaded.model,
            loaded.tokenizer,
            env,
            examples,
            value_head=loaded.value_head,
            critic_model=loaded.critic_model,
            tiers=tiers,
            samples=options.samples,
            temperature=options.temperature,
            **rollout_caps(cfg),
            seed=options.seed,
            progress=f"eval {split}",
        )
    finally:
        env.close()
    reliability = critic_metrics(records, tiers=tiers)[1] if loaded.value_head is not None else None
    if tiers is not None:
        for record in records:
            record["tier_label"] = tiers[record["id"]]
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(model, cfg, split)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(out_dir / "episodes.jsonl", records)
    bfcl_fields = summary_tables(cfg.task.name, summary)  # BFCL: the leaderboard's own column names
    result = summary_file(
        summary,
        model=loaded.source,
        method=cfg.method,
        task=cfg.task.name,
        split=split,
        questions=len(examples),
        samples=options.samples,
        temperature=options.temperature,
        seconds=time.perf_counter() - start,
        reliability=reliability,
        tiers=tiers,
        **bfcl_fields,
    )
    (out_dir / "summary.json").write_text(json.dumps(_jsonable(result), indent=2))
    log(format_summary(summary))
    if result.get("leaderboard"):
        log(f"BFCL v4 (bfcl-eval {result['bfcl_eval_version']}), leaderboard columns:")
        log(format_summary(result["leaderboard"]))
    log(f"wrote {out_dir / 'episodes.jsonl'} and {out_dir / 'summary.json'}")
    result["out_dir"] = str(out_dir)
    return result


def format_summary(summary: dict[str, float]) -> str:
    """The summary as aligned ``metric  value`` lines (overall first, then per tier, then critic)."""

    def order(key: str) -> tuple[int, str]:
        return (key.startswith("critic/") * 2 + ("/" in key and not key.startswith("critic/")), key)

    width = max(len(k) for k in summary)
    return "\n".join(
        f"{k:<{width}}  {v:.4f}" for k, v in sorted(summary.items(), key=lambda kv: order(kv[0]))
    )
