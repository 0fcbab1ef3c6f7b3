"""``agentcredit compare``: one report comparing training runs side by side.

For each run directory it reads ``metrics.jsonl`` (per-step training metrics), ``config.yaml`` (method, task) and
the final evaluation when there is one: ``eval_summary.json`` / ``eval_episodes.jsonl`` (written by ``train``) or
``eval-*/summary.json`` / ``episodes.jsonl`` (written by ``agentcredit eval --model RUN_DIR``). It writes

* ``report.md`` with the PNG plots beside it (``plots/``), and
* ``report.html``, self-contained (the same plots embedded as base64, inline CSS), to send or archive as is.

Contents: a table of final metrics, the methods' settings and regime diagnostics (:func:`diagnostics`, e.g. the
share of PORTool trees with no success; a run whose settings make it a variant is marked so), learning curves
(reward, accuracy, tool calls and policy tokens per episode over steps), a reliability diagram for every run whose
evaluation episodes carry critic values V(s_0), and the mean seconds per step split into rollout / signals / update
as stacked bars.
"""

from __future__ import annotations

import base64
import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agentcredit.config import OLD_ESTIMATORS
from agentcredit.credit.methods import METHODS, Method, resolve_method

CURVES = (
    ("reward/mean", "mean reward"),
    ("accuracy", "accuracy"),
    ("episode/tool_calls", "tool calls / episode"),
    ("episode/policy_tokens", "policy tokens / episode"),
)
PHASES = (("time/rollout", "rollout"), ("time/signals", "signals"), ("time/update", "update"))
TABLE = (
    ("accuracy", "accuracy"),
    ("em", "EM"),
    ("f1", "F1"),
    ("substring_em", "substring EM"),
    ("tool_calls", "tool calls/ep"),
    ("tool_call_rate", "tool-call rate"),
    ("policy_tokens", "tokens/ep"),
    ("critic/ece", "critic ECE"),
    ("critic/auc_v_s0", "AUC V(s0)"),
    ("critic/explained_variance", "critic EV"),
)

#: Training-time diagnostics of no one method, after the methods' own (``Method.diagnostics``): the
#: sequential fork rounds of an entropy-guided rollout, the drift from the reference.
GENERAL_DIAGNOSTICS = (
    ("critical/rounds", "fork rounds"),
    ("policy/kl_ref", "KL to ref"),
)


def diagnostics() -> list[tuple[str, str]]:
    """(metric key, label) of every diagnostic a report looks for: each registered method's, then the general
    ones."""
    out = [d for method in METHODS.values() for d in method.diagnostics] + list(GENERAL_DIAGNOSTICS)
    return list(dict.fromkeys(out))


def method_parts(algorithm: dict[str, Any]) -> tuple[Method, ...]:
    """The parts (estimating method, then modifiers) of a saved config's method: from ``algorithm.method``, or, in an
    older config, from its ``estimator`` / ``shaping`` / ``reweight`` parts (old runs stay readable)."""
    name = algorithm.get("method")
    if name is None:
        parts = [algorithm.get("estimator"), algorithm.get("shaping"), algorithm.get("reweight")]
        parts[0] = OLD_ESTIMATORS.get(str(parts[0]), parts[0])
        name = "+".join(str(p) for p in parts if p and p != "none")
    try:
        return resolve_method(str(name))[0].parts
    except ValueError:  # a method registered by the run's own code, or no method at all
        return ()


def method_sections(algorithm: dict[str, Any]) -> list[str]:
    """The settings sections of a saved config's method, each part's."""
    return [part.section for part in method_parts(algorithm)]


def run_settings(cfg: dict[str, Any]) -> str:
    """The settings each part of a run's method asks a report to show (``Method.report_settings``) as
    ``key=value`` pairs, after the label its ``Method.variant`` gives a run that is not the paper's method."""
    algorithm = cfg.get("algorithm") or {}
    labels, out = [], []
    for part in method_parts(algorithm):
        for dotted in part.report_settings:
            node: Any = cfg
            for key in dotted.split("."):
                node = node.get(key) if isinstance(node, dict) else None
            if node is not None:
                out.append(f"{dotted.rsplit('.', 1)[-1]}={node}")
        label = part.variant(algorithm.get(part.section) or {}) if part.variant else None
        if label:
            labels.append(label)
    return ", ".join([*labels, *out])


@dataclass
class RunData:
    name: str
    path: Path
    method: str
    task: str
    metrics: list[dict[str, Any]]
    final: dict[str, float] = field(default_factory=dict)  # final evaluation (or the last training step)
    final_source: str = ""
    episodes: list[dict[str, Any]] = field(default_factory=list)  # final evaluation episodes
    warmup_gate: dict[str, Any] | None = (
        None  # <run>/warmup_gate.json: the critic's warm-up gate at the start
    )
    settings: str = ""  # run_settings(config)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    from agentcredit.tasks.example import iter_jsonl

    return [row for _, row in iter_jsonl(path)]


def _final_eval(run: Path) -> tuple[dict[str, float], list[dict[str, Any]], str]:
    """The newest final evaluation of a run: ``eval-*/summary.json`` (agentcredit eval), else ``eval_summary.json``."""
    from agentcredit.eval.evaluate import summary_metrics  # one reader for both writers' files

    candidates = sorted(run.glob("eval*/summary.json"), key=lambda p: p.stat().st_mtime)
    if candidates:
        summary_path = candidates[-1]
        data = json.loads(summary_path.read_text())
        episodes_path = summary_path.parent / "episodes.jsonl"
    elif (run / "eval_summary.json").is_file():
        summary_path = run / "eval_summary.json"
        data = json.loads(summary_path.read_text())
        episodes_path = run / "eval_episodes.jsonl"
    else:
        return {}, [], ""
    episodes = _read_jsonl(episodes_path) if episodes_path.is_file() else []
    return summary_metrics(data), episodes, str(summary_path.relative_to(run))


def load_run(path: str | Path) -> RunData:
    """Read one run directory; an error names what is missing."""
    import yaml

    path = Path(path)
    metrics_path = path / "metrics.jsonl"
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: not a directory")
    if not metrics_path.is_file():
        raise FileNotFoundError(f"{path}: not a run directory (no metrics.jsonl)")
    metrics = _read_jsonl(metrics_path)
    if not metrics:
        raise ValueError(f"{metrics_path}: no steps logged yet")
    method, task, settings = "?", "?", ""
    if (path / "config.yaml").is_file():
        cfg = yaml.safe_load((path / "config.yaml").read_text()) or {}
        method = str(cfg.get("method") or (cfg.get("algorithm") or {}).get("method") or "?")
        task = str((cfg.get("task") or {}).get("name", "?"))
        settings = run_settings(cfg)
    final, episodes, source = _final_eval(path)
    if not final:
        last = metrics[-1]
        final = {
            "accuracy": last.get("accuracy"),
            "tool_calls": last.get("episode/tool_calls"),
            "policy_tokens": last.get("episode/policy_tokens"),
            "critic/explained_variance": last.get("critic/explained_variance"),
        }
        final = {k: float(v) for k, v in final.items() if v is not None}
        source = f"last training step ({last.get('step')})"
    gate_path = path / "warmup_gate.json"
    gate = json.loads(gate_path.read_text()) if gate_path.is_file() else None
    return RunData(path.name, path, method, task, metrics, final, source, episodes, gate, settings)


def gate_notes(runs: list[RunData]) -> list[str]:
    """One line per run whose critic started on a failed warm-up gate (train.allow_failed_gate) or with no warm-up
    at all (train.cold_start)."""
    from agentcredit.train.warmup import gate_line

    return [f"{run.name}: {line}." for run in runs if (line := gate_line(run.warmup_gate)) is not None]


def _unique_names(runs: list[RunData]) -> None:
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.name] = seen.get(run.name, 0) + 1
    for run in runs:
        if seen[run.name] > 1:
            run.name = f"{run.path.parent.name}/{run.path.name}"


def _series(run: RunData, key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i, record in enumerate(run.metrics):
        value = record.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            xs.append(float(record.get("step", i + 1)))
            ys.append(float(value))
    return xs, ys


# ------------------------------------------------------------------------------------------------ plots
def _figure():
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    return plt


def plot_learning_curves(runs: list[RunData], path: Path) -> Path:
    plt = _figure()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), constrained_layout=True)
    for ax, (key, label) in zip(axes.flat, CURVES, strict=True):
        for run in runs:
            xs, ys = _series(run, key)
            if xs:
                ax.plot(
                    xs,
                    ys,
                    marker="o" if len(xs) < 30 else None,
                    markersize=3,
                    label=f"{run.name} ({run.method})",
                )
        ax.set_title(label)
        ax.set_xlabel("training step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(3, len(labels)))
    fig.suptitle("Learning curves (training rollouts)")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def critic_points(run: RunData) -> tuple[list[float], list[float]] | None:
    """(V(s_0), outcome) of the run's evaluation episodes, or None when they carry no critic values."""
    pairs = [(r["v_s0"], r["correct"]) for r in run.episodes if r.get("v_s0") is not None and "correct" in r]
    if not pairs:
        return None
    return [float(np.clip(v, 0.0, 1.0)) for v, _ in pairs], [float(c) for _, c in pairs]


def plot_calibration(runs: list[RunData], path: Path) -> Path | None:
    """Reliability diagram (10 equal-width bins of V(s_0)) for each run with critic values; None if none has."""
    from agentcredit.credit.metrics import expected_calibration_error, reliability_table

    data = [(run, critic_points(run)) for run in runs]
    data = [(run, pts) for run, pts in data if pts is not None]
    if not data:
        return None
    plt = _figure()
    fig, (ax, ax_count) = plt.subplots(
        2, 1, figsize=(6.5, 7.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]}, constrained_layout=True
    )
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey", label="perfect calibration")
    width = 0.1 / (len(data) + 1)
    for i, (run, (probs, outcomes)) in enumerate(data):
        table = reliability_table(probs, outcomes, 10)
        ece = expected_calibration_error(probs, outcomes, 10)
        xs = [r["predicted"] for r in table if r["count"]]
        ys = [r["observed"] for r in table if r["count"]]
        ax.plot(xs, ys, marker="o", label=f"{run.name} ({run.method}), ECE {ece:.3f}, n={len(probs)}")
        lows = [r["low"] + (i + 0.5) * width for r in table]
        ax_count.bar(lows, [r["count"] for r in table], width=width, label=run.name)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("observed success rate")
    ax.set_title("Critic calibration: V(s0) vs outcome (evaluation episodes)")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    ax_count.set_xlabel("predicted V(s0) (10 equal-width bins)")
    ax_count.set_ylabel("episodes")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def phase_means(run: RunData) -> dict[str, float]:
    out = {}
    for key, label in PHASES:
        _, ys = _series(run, key)
        out[label] = float(np.mean(ys)) if ys else 0.0
    return out


def plot_phase_times(runs: list[RunData], path: Path) -> Path:
    plt = _figure()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(runs) + 3), 4.8), constrained_layout=True)
    names = [f"{run.name}\n({run.method})" for run in runs]
    bottom = np.zeros(len(runs))
    for _, label in PHASES:
        values = np.array([phase_means(run)[label] for run in runs])
        ax.bar(names, values, bottom=bottom, label=label)
        bottom += values
    for x, total in enumerate(bottom):
        ax.annotate(f"{total:.1f}s", (x, total), ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("seconds per step (mean over steps)")
    ax.set_title("Time per training step by phase")
    ax.set_ylim(0, max(float(bottom.max()), 1e-9) * 1.12)  # room for the totals above the bars
    ax.legend(title="phase", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------ tables
def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def ev_first_positive_step(metrics: list[dict[str, Any]]) -> int | None:
    """The first training step whose ``critic/explained_variance`` is > 0 (None: never, or no critic).

    Read from the per-step log, so runs older than the trainer's ``critic/ev_first_positive_step`` metric have
    it too; a step where EV is undefined (absent, or NaN in old logs) does not count, and an old log's 0.0 for
    an undefined EV is not > 0 either.
    """
    for i, record in enumerate(metrics):
        ev = record.get("critic/explained_variance")
        if isinstance(ev, int | float) and ev > 0:
            return int(record.get("step", i + 1))
    return None


def _has_critic(run: RunData) -> bool:
    return any("critic/value_mean" in record for record in run.metrics)


def metrics_table(runs: list[RunData]) -> tuple[list[str], list[list[str]]]:
    keys = [(k, label) for k, label in TABLE if any(k in run.final for run in runs)]
    tiers = sorted({k.split("/")[0] for run in runs for k in run.final if k.endswith("/tool_call_rate")})
    critics = any(_has_critic(run) for run in runs)
    header = ["run", "method", "task", "steps", "s/step", *[label for _, label in keys]]
    # when a PPO / TIPS critic starts to explain the returns: before it, advantages are REINFORCE's
    header += ["critic EV > 0 from step"] if critics else []
    header += [f"{t} tool rate" for t in tiers] + ["final metrics from"]
    rows = []
    for run in runs:
        _, step_times = _series(run, "time/step")
        row = [
            run.name,
            run.method,
            run.task,
            str(len(run.metrics)),
            _fmt(float(np.mean(step_times)) if step_times else None),
        ]
        row += [_fmt(run.final.get(k)) for k, _ in keys]
        if critics:
            first = ev_first_positive_step(run.metrics)
            row.append("–" if not _has_critic(run) else ("never" if first is None else str(first)))
        row += [_fmt(run.final.get(f"{t}/tool_call_rate")) for t in tiers]
        row.append(run.final_source)
        rows.append(row)
    return header, rows


def diagnostics_table(runs: list[RunData]) -> tuple[list[str], list[list[str]]] | None:
    """Each run's method settings and, for every :func:`diagnostics` metric a run logged, "mean over training
    steps (last step)"; None when no run has either."""
    keys = [(k, label) for k, label in diagnostics() if any(_series(run, k)[1] for run in runs)]
    if not keys and not any(run.settings for run in runs):
        return None
    header = ["run", "method", "settings", *[label for _, label in keys]]
    rows = []
    for run in runs:
        row = [run.name, run.method, run.settings or "–"]
        for key, _ in keys:
            _, ys = _series(run, key)
            row.append(f"{float(np.mean(ys)):.3f} ({ys[-1]:.3f})" if ys else "–")
        rows.append(row)
    return header, rows


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></figure>'


CSS = (
    "body{font:14px/1.5 system-ui,sans-serif;max-width:1200px;margin:24px auto;padding:0 16px;color:#222}"
    "table{border-collapse:collapse;font-variant-numeric:tabular-nums}"
    "th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f2f2f2}"
    "td:first-child,td:nth-child(2),td:nth-child(3),td:last-child{text-align:left}"
    "img{max-width:100%;border:1px solid #eee}figure{margin:12px 0}"
)


def write_report(run_dirs: list[str | Path], out_dir: str | Path) -> dict[str, Path]:
    """Write ``report.md`` (+ ``plots/*.png``) and a self-contained ``report.html``; returns their paths."""
    if not run_dirs:
        raise ValueError("compare: give at least one run directory")
    runs = [load_run(p) for p in run_dirs]
    _unique_names(runs)
    out_dir = Path(out_dir)
    plots = out_dir / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    figures = [
        ("Learning curves", plot_learning_curves(runs, plots / "learning_curves.png")),
        ("Time per step by phase", plot_phase_times(runs, plots / "phase_times.png")),
    ]
    calibration = plot_calibration(runs, plots / "calibration.png")
    if calibration is not None:
        figures.insert(1, ("Critic calibration", calibration))
    header, rows = metrics_table(runs)
    notes = gate_notes(runs)
    phase_header = ["run", "rollout s", "signals s", "update s", "total s"]
    phase_rows = []
    for run in runs:
        p = phase_means(run)
        phase_rows.append([run.name, *(f"{p[label]:.2f}" for _, label in PHASES), f"{sum(p.values()):.2f}"])
    no_critic = (
        "" if calibration is not None else "No run's evaluation episodes carry critic values V(s0).\n\n"
    )
    intro = (
        f"Runs compared: {', '.join(r.name for r in runs)}. Final metrics come from each run's last evaluation "
        "(greedy, held-out split) when it has one, else from its last training step (training rollouts)."
    )
    diagnostics = diagnostics_table(runs)
    diagnostics_title = "Method settings and diagnostics (mean over training steps, last step in brackets)"
    md = [
        "# agentcredit comparison",
        intro,
        "## Final metrics",
        *[f"**Warning**: {note}" for note in notes],
        _markdown_table(header, rows),
        "## Mean time per step by phase",
        _markdown_table(phase_header, phase_rows),
    ]
    if diagnostics is not None:
        md += [f"## {diagnostics_title}", _markdown_table(*diagnostics)]
    for title, path in figures:
        md += [f"## {title}", f"![{title}](plots/{path.name})"]
    if no_critic:
        md.append(no_critic.strip())
    markdown = out_dir / "report.md"
    markdown.write_text("\n\n".join(md) + "\n")
    parts = [
        f"<h1>agentcredit comparison</h1><p>{html.escape(intro)}</p>",
        "<h2>Final metrics</h2>",
        *[f"<p><strong>Warning</strong>: {html.escape(note)}</p>" for note in notes],
        _html_table(header, rows),
        "<h2>Mean time per step by phase</h2>",
        _html_table(phase_header, phase_rows),
    ]
    if diagnostics is not None:
        parts += [f"<h2>{html.escape(diagnostics_title)}</h2>", _html_table(*diagnostics)]
    for title, path in figures:
        parts += [f"<h2>{html.escape(title)}</h2>", _img(path, title)]
    if no_critic:
        parts.append(f"<p>{html.escape(no_critic.strip())}</p>")
    page = out_dir / "report.html"
    page.write_text(
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>agentcredit comparison</title>"
        f"<style>{CSS}</style></head><body>{''.join(parts)}</body></html>",
        encoding="utf-8",
    )
    return {"markdown": markdown, "html": page, "plots": plots}
