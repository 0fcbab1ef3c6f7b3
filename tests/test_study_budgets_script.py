"""scripts/study_budgets.py: the budgets quoted in the studies' comment blocks, checked by hand-worked arithmetic."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "study_budgets.py"


@pytest.fixture(scope="module")
def sb():
    spec = importlib.util.spec_from_file_location("study_budgets", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["study_budgets"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_probe_gpu_hours_by_hand(sb):
    # carl-critical-mechanism's main part: 200 questions x 3 rounds of ~50 forwards (low) or 330 + 97 + 330 (high)
    low, high = sb.probe_gpu_hours(200, 150, 757)
    assert low == pytest.approx(200 * 150 * 0.010 / 3600)  # 300 s = 0.0833 h = 5 min
    assert high == pytest.approx(200 * 757 * 0.050 / 3600)  # 7,570 s = 2.103 h
    assert sb._span(low, high) == "5.0 GPU-min-2.1 GPU h"


def test_carl_critical_row_matches_its_study_comment(sb):
    row = sb.study_budget("carl-critical-mechanism")
    # its caps: 320 tokens and 10 turns an episode, 96 an action: (320 + 10) + (96 + 1) + (320 + 10) = 757
    assert "150-757 forwards" in row["gpu_inputs"]
    assert row["gpu"] == "5.0 GPU-min-2.1 GPU h"  # the file's own "~5 GPU-minutes to ~2.1 GPU hours"
    assert row["cpu"].startswith(
        "2,230 CPU-s"
    )  # the report's "2,230 s of CPU (user + system) for 200 questions"


def test_start_means_by_hand(sb):
    heldout = {
        "a": {"episodes": 2, "policy_tokens": 10.0, "tool_calls": 1.0},
        "b": {"episodes": 1, "policy_tokens": 40.0, "tool_calls": 4.0},
    }
    m = sb.start_means(heldout, {"prompt": 100.0, "observation_per_call": 5.0})
    # policy (2 x 10 + 40) / 3 = 20; calls (2 x 1 + 4) / 3 = 2; observations 2 x 5; prefills the prompt + 2
    assert m == pytest.approx(
        {"prompt": 100.0, "policy": 20.0, "observation": 10.0, "prefills": 3.0, "tool_calls": 2.0}
    )


def test_the_borrowed_tokens_come_from_published_records(sb):
    """The prompt and observation tokens the ran studies borrow are computed from episode records in the repo
    (they were constants measured on unpublished files: 84.72 / 10.89 and 821.53 / 305.52, the same values)."""
    arith, kb = sb.borrowed("arith"), sb.borrowed("kb")
    assert (round(arith["prompt"], 2), round(arith["observation_per_call"], 2)) == (84.72, 10.89)
    assert (round(kb["prompt"], 2), round(kb["observation_per_call"], 2)) == (821.53, 305.52)
    assert arith["from"] == "arith-tool-can-hurt's start, 300 held-out episodes"


def test_report_parsers(sb):
    assert sb.report_wall_hours("x. Wall time of the finished runs: 8.95 h (start: 0.90 h). y") == (
        8.95,
        0.90,
    )
    text = (
        "**GPU hours (estimate, not measured): 0.14–4.3** on one GPU for the same plan (0.99–31.9 to decide)."
    )
    assert sb.report_gpu_range(text) == ("0.14–4.3", "0.99–31.9")
    with pytest.raises(ValueError, match="report.md"):
        sb.report_wall_hours("no wall time here")


def test_the_ran_studies_method_reproduces_a_preflight_estimate(sb):
    """The path that prices the studies whose arms ran (published start means + the borrowed prompt and
    observation tokens), run on arith-tool-can-hurt, gives the range its report printed from the full records."""
    from agentcredit.lab.gpu_estimate import gpu_estimate_range
    from agentcredit.lab.study_spec import load_study

    spec = load_study(ROOT / "studies" / "arith-tool-can-hurt.yaml")
    folder = ROOT / "docs" / "results" / "arith-tool-can-hurt"
    heldout = json.loads((folder / "start" / "summary.json").read_text())["heldout"]
    _, est = sb.arms_estimate(
        spec, {a.name for a in spec.arms}, sb.start_means(heldout, sb.borrowed("arith"))
    )
    assert gpu_estimate_range(est) == sb.report_gpu_range((folder / "report.md").read_text())[0] == "0.14–4.3"


def _numbers(text: str) -> list[float]:
    return [float(n.replace(",", "")) for n in re.findall(r"\d[\d,]*(?:\.\d+)?", text)]


def _block(study: Path, opening: str) -> list[str]:
    """The comment lines from the one starting with ``opening`` to the next line that is not a comment."""
    lines = study.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(opening))
    block = []
    for line in lines[first:]:
        if not line.startswith("#"):
            break
        block.append(line.lstrip("#").strip())
    return block


@pytest.mark.parametrize("study", sorted(p.stem for p in (ROOT / "studies").glob("*.yaml")))
def test_every_study_file_quotes_the_scripts_numbers(sb, study):
    """Each study file's budget comment states the script's GPU range (and, in the blocks issue 49 added, its CPU
    figure), to the comment's rounding: a report republished with other numbers fails here until the comment follows."""
    row = sb.study_budget(study)
    path = ROOT / "studies" / f"{study}.yaml"
    if (
        study == "carl-critical-mechanism"
    ):  # its block predates the script: "# One GPU (estimate, not measured; ..."
        lines, wanted = _block(path, "# One GPU (estimate"), _numbers(row["gpu"])
    else:
        lines = _block(path, "# Budget (added after the run, issue 49; not pre-registered): ")
        wanted = _numbers(row["gpu"]) + _numbers(row["cpu"])[:1]
        assert len(lines) <= 6
        assert "estimate, not measured" in " ".join(lines) and "CPU" in " ".join(lines)
    said = _numbers(" ".join(lines))
    for x in wanted:
        assert any(math.isclose(x, y, rel_tol=0.01) for y in said), f"{study}: {x} not in its budget comment"
