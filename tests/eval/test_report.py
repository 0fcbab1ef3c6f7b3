"""compare: the report from hand-made run directories (metrics, evaluations with and without a critic)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentcredit.eval.evaluate import summary_file, summary_metrics
from agentcredit.eval.report import load_run, metrics_table, phase_means, write_report


def _run(path, method, steps, *, critic=False, eval_dir=True):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(f"method: {method}\ntask:\n  name: arith-tools\n")
    lines = []
    for step in range(1, steps + 1):
        lines.append(
            {
                "step": step,
                "reward/mean": 0.1 * step,
                "accuracy": 0.1 * step,
                "episode/tool_calls": 1.0 / step,
                "episode/policy_tokens": 50.0 + step,
                "time/rollout": 2.0,
                "time/signals": 0.5 + step,  # means: 0.5 + (steps + 1) / 2
                "time/update": 1.0,
                "time/step": 3.5 + step,
            }
        )
    (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    if not eval_dir:
        return path
    out = path / "eval-test"
    out.mkdir()
    metrics = {"accuracy": 0.5, "em": 0.5, "tool_calls": 0.25, "easy/tool_call_rate": 0.0}
    episodes = []
    for i, (v, c) in enumerate([(0.15, 0), (0.25, 0), (0.75, 1), (0.85, 1)]):
        ep = {"id": f"q{i}", "correct": float(c), "reward": float(c), "segments": []}
        if critic:
            ep.update(v_s0=v, values=[v])
        episodes.append(ep)
    if critic:
        metrics["critic/ece"] = 0.2
    summary = summary_file(metrics, model=str(path), method=method, questions=4, samples=1, seconds=99.0)
    (out / "summary.json").write_text(json.dumps(summary))  # agentcredit eval's shape: flat
    (out / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    return path


def test_report_has_table_curves_calibration_and_phases(tmp_path):
    a = _run(tmp_path / "runs" / "a", "grpo", 3)
    b = _run(tmp_path / "runs" / "b", "carl-segment", 4, critic=True)
    c = _run(tmp_path / "other" / "a", "ppo", 2, eval_dir=False)  # same dir name: disambiguated by its parent
    paths = write_report([a, b, c], tmp_path / "report")
    md = paths["markdown"].read_text()
    assert "| runs/a | grpo | arith-tools | 3 |" in md and "| other/a | ppo |" in md
    assert "last training step (2)" in md and "eval-test/summary.json" in md
    for png in ("learning_curves.png", "calibration.png", "phase_times.png"):
        assert (paths["plots"] / png).stat().st_size > 10_000  # a real figure, not an empty canvas
        assert f"plots/{png}" in md
    page = paths["html"].read_text()
    assert page.count("data:image/png;base64,") == 3 and "<img" in page and "plots/" not in page


def test_report_without_critics_skips_calibration(tmp_path):
    a = _run(tmp_path / "a", "grpo", 2)
    paths = write_report([a], tmp_path / "report")
    assert not (paths["plots"] / "calibration.png").exists()
    assert "carry critic values" in paths["markdown"].read_text()


def test_load_run_reads_metrics_and_phase_means(tmp_path):
    run = load_run(_run(tmp_path / "r", "gear", 3))
    assert run.method == "gear" and len(run.metrics) == 3 and run.final["accuracy"] == 0.5
    assert phase_means(run) == {"rollout": 2.0, "signals": pytest.approx(2.5), "update": 1.0}
    header, rows = metrics_table([run])
    assert header[:5] == ["run", "method", "task", "steps", "s/step"] and rows[0][4] == "5.500"
    assert "easy tool rate" in header


def test_load_run_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        load_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{oops\n')
    with pytest.raises(ValueError, match="line 2"):
        load_run(tmp_path)
    with pytest.raises(ValueError, match="at least one"):
        write_report([], tmp_path / "out")


def test_one_summary_shape_is_read_for_both_writers_and_old_files(tmp_path):
    """eval's summary.json and train's eval_summary.json share one flat shape (issue 35); files written before it
    (metrics nested under "metrics") still read. What was evaluated is never taken for a metric."""
    run = _run(tmp_path / "a", "grpo", 2)
    assert load_run(run).final == {"accuracy": 0.5, "em": 0.5, "tool_calls": 0.25, "easy/tool_call_rate": 0.0}
    flat = summary_file({"accuracy": 1.0}, model="m", questions=3, seconds=2.0, tiers={"q": "tier1"})
    assert (
        summary_metrics(flat)
        == {"accuracy": 1.0}
        == summary_metrics({"metrics": {"accuracy": 1.0}, "seconds": 2})
    )
    with pytest.raises(ValueError, match=r"metrics named like fields \['questions'\]"):
        summary_file({"questions": 1.0})


def test_report_shows_gears_trigger_rate_and_segment_share(tmp_path):
    """issue 31: GEAR's normalisation can go flat (nearly every token a trigger) and nothing showed it; compare now
    lists gear/trigger_rate and gear/frac_in_segments as mean over the training steps (last step)."""
    gear = _run(tmp_path / "gear", "gear", 2)
    lines = [json.loads(x) for x in (gear / "metrics.jsonl").read_text().splitlines()]
    for record, (trigger, inside, clamp) in zip(lines, [(0.9, 1.0, 0.0), (0.1, 0.4, 0.5)], strict=True):
        record.update(
            {"gear/trigger_rate": trigger, "gear/frac_in_segments": inside, "gear/clamp_max_share": clamp}
        )
    (gear / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    grpo = _run(tmp_path / "grpo", "grpo", 2)
    paths = write_report([gear, grpo], tmp_path / "report")
    md = paths["markdown"].read_text()
    assert "GEAR trigger rate | GEAR tokens in segments | GEAR clamp_max share |" in md
    assert "| gear | gear | – | 0.500 (0.100) | 0.700 (0.400) | 0.250 (0.500) |" in md  # settings: none
    assert "| grpo | grpo | – | – | – | – |" in md
    assert "GEAR trigger rate" in paths["html"].read_text()
    # runs without a method diagnostic get no such section
    only = write_report([grpo], tmp_path / "report2")["markdown"].read_text()
    assert "Method settings and diagnostics" not in only


def test_a_run_config_from_before_and_after_issue_37_reads_the_same():
    """A saved run's config.yaml names its method at the top (before issue 37: method plus algorithm parts) or in
    algorithm.method (since): the report reads both, and the method's run settings by its sections."""
    import yaml

    from agentcredit.config import dump_config, load_config
    from agentcredit.eval.report import method_sections, run_settings

    old = {
        "method": "portool-shifted-outcome",
        "algorithm": {
            "estimator": "portool",
            "shaping": "none",
            "reweight": "none",
            "portool": {"outcome_shift": 1.0},
        },
    }
    new = yaml.safe_load(dump_config(load_config("portool-shifted-outcome-arith-tools")))
    assert "method" not in new and new["algorithm"]["method"] == "portool-shifted-outcome"
    for cfg in (old, new):
        assert method_sections(cfg["algorithm"]) == ["portool"]
        assert run_settings(cfg).startswith("VARIANT (not PORTool)")
    assert method_sections({"estimator": "segment", "shaping": "tips"}) == ["carl_segment", "tips"]
    assert method_sections({"method": "carl-critical"}) == ["carl_critical"]
    assert "forks_per_round=1" in run_settings(
        yaml.safe_load(dump_config(load_config("carl-critical-arith-tools")))
    )


def test_carl_critical_reports_its_reward_and_follows_the_paper_where_it_can():
    """Issue 48: carl-critical's QA presets train on the paper's format reward + F1 (carl-critical-actions.txt
    l. 513: ``set_f1_format``); the numeric presets keep the task's match, a labelled deviation in the method's preset
    and docs/specs; every report lists the metric beside the run."""
    import yaml

    from agentcredit.config import CONFIG_DIR, dump_config, load_config
    from agentcredit.eval.report import run_settings

    cfg = yaml.safe_load(dump_config(load_config("carl-critical-kb-multihop")))
    assert cfg["task"]["metric"] == "set_f1_format"
    assert f"metric={cfg['task']['metric']}" in run_settings(cfg)
    preset = (CONFIG_DIR / "methods" / "carl-critical.yaml").read_text()
    assert "l. 513" in preset and "labelled deviation" in preset
    specs = (Path(__file__).parents[2] / "docs" / "specs" / "README.md").read_text()
    assert "set_f1_format" in specs and "**a labelled deviation**" in specs
