"""A study's pre-arm phase on the tiny model: preconditions on training questions, power, a timed step per arm,
refusal with the measured values (exit 2) and the override that stamps every verdict."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agentcredit.cli import app
from agentcredit.lab.study import Study, StudyError, load_study
from tests.lab.test_study import tiny_study, write

PRE = [
    {
        "name": "tier 2 better without the tool",
        "source": "carl-segment l. 373",
        "measure": "tool_gap",
        "tier": "tier2",
        "questions": 4,
        "samples": 1,
        "op": ">=",
        "threshold": 0.1,
    },
    {
        "name": "easy alone",
        "source": "issue 32",
        "measure": "metric",
        "metric": "easy/accuracy",
        "prompt": "no_tool",
        "questions": 4,
        "samples": 1,
        "op": ">=",
        "threshold": 0.9,
    },
    {
        "name": "trees hold a success",
        "source": "portool l. 442-447",
        "measure": "group_success",
        "arm": "grpo",
        "questions": 4,
        "op": ">=",
        "threshold": 0.7,
    },
    {
        "name": "critic EV > 0",
        "source": "carl-segment l. 208",
        "measure": "warmup_gate",
        "metric": "explained_variance",
        "op": ">",
        "threshold": 0.0,
    },
]


def preregistered(**changes):
    spec = tiny_study(preconditions=PRE, **changes)
    spec["claims"][0]["paper_effect"] = {"value": -0.44, "source": "carl-segment Table 3"}
    return spec


@pytest.mark.slow
def test_an_unmet_regime_stops_before_the_warm_up_with_the_measured_values(tmp_path):
    # the untrained tiny model answers nothing: every precondition on the policy fails
    path = write(tmp_path / "s.yaml", preregistered())
    study = Study(load_study(path), tmp_path / "study", source=path, log=lambda _: None)
    study.prepare(resume=False)
    with pytest.raises(
        StudyError, match="precondition\\(s\\) not met: tier 2 better without the tool: measured"
    ):
        study.run()
    record = json.loads((tmp_path / "study" / "preflight" / "preflight.json").read_text())
    assert [p["met"] for p in record["preconditions"]] == [False, False, False]
    assert all(p["source"] for p in record["preconditions"])
    trees = next(p for p in record["preconditions"] if p["measure"] == "group_success")["detail"]
    assert len(trees["per_question"]) == 4  # per training question: [tier, correct, trajectories]
    assert sum(r["groups"] for r in trees["by_part"].values()) == 4
    # the untrained model answers nothing
    assert all(r["with_success"] == 0 for r in trees["by_part"].values())
    assert not (tmp_path / "study" / "start" / "model").exists()  # the warm-up was not paid for
    assert not (tmp_path / "study" / "runs").exists()
    report = (tmp_path / "study" / "report" / "report.md").read_text()
    assert "regime" in report.lower()
    # the per-tier breakdown of the trees, as counts, not as a raw dict
    assert "per hop / tier: " in report and " trees, 0/" in report and "'groups'" not in report


@pytest.mark.slow
def test_the_override_measures_power_and_budget_and_stamps_every_verdict(tmp_path):
    path = write(tmp_path / "s.yaml", preregistered())
    out = tmp_path / "study"
    result = CliRunner().invoke(
        app,
        ["study", "--config", path, "--out", str(out), "--preflight-only", "--allow-unmet-regime",
         "--allow-underpowered"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    record = json.loads((out / "preflight" / "preflight.json").read_text())
    assert record["complete"] and record["overrides"] == {"regime": True, "power": True}
    assert set(record["timing"]) == {"grpo", "carl-segment"}
    assert record["budget"]["planned_cpu_hours"] > 0
    # no step ran on a GPU: the record keeps a one-GPU estimate with its assumptions, the report labels it
    estimate = record["budget"]["gpu_estimate"]
    assert (
        estimate["kind"] == "estimate"
        and 0 < estimate["low"]["planned_gpu_hours"] < estimate["high"]["planned_gpu_hours"]
    )
    assert "not measured" in estimate["assumptions"]["source"]
    rows = {r["claim"]: r for r in record["power"]}
    assert rows["fewer calls"]["effect"] == pytest.approx(0.44) and rows["fewer calls"]["mde"] is not None
    assert not (out / "runs").exists()
    report = (out / "report" / "report.md").read_text()
    assert "Preflight" in report and "MDE" in report and "Planned" in report
    assert "GPU hours (estimate, not measured)" in report and "predates" not in report
    assert report.count("(regime not met)") == len(preregistered()["claims"])  # every verdict is stamped
    published = Study(load_study(path), out, source=path).publish(tmp_path / "docs")
    assert tmp_path / "docs" / "preflight.json" in published  # the measured regime goes with the report
    # without the override the same study refuses, exit 2, one line
    again = CliRunner().invoke(app, ["study", "--config", path, "--out", str(out), "--resume"])
    assert again.exit_code == 2 and "precondition(s) not met" in again.output
