"""Evaluation never scores a tool that could not run as if it had answered (issue 11, item 2).

An episode whose tool results carry ``infra=True`` (the sandbox or the corpus was unavailable) is listed under
``infra_failures`` in its record, counted in the summary and left out of accuracy and every other number; a run
whose sandbox cannot run at all stops before any work with one error line.
"""

from __future__ import annotations

from dataclasses import asdict

import pytest
from typer.testing import CliRunner

from agentcredit.cli import app
from agentcredit.eval.evaluate import critic_metrics, episode_records, summarize
from agentcredit.tasks import Example
from agentcredit.tools.base import ToolUnavailableError
from agentcredit.tools.sandbox import tool as ps

EXAMPLE = Example(
    "q1", "Question: what is 12*7?", ["84"], "arith-tools", {"metric": "numeric", "tier": "hard"}
)
BROKEN = (
    "python: ERROR: the python sandbox is unavailable: bwrap: execvp /tmp/x/.venv/bin/python: No such file"
)


def _record(correct: float, infra: list[str] | None = None, tier: str = "hard", value: float = 0.5) -> dict:
    return {
        "id": f"q{correct}{bool(infra)}{tier}",
        "info": {"tier": tier},
        "answer": "84" if correct else "1",
        "reward": correct,
        "correct": correct,
        "em": correct,
        "f1": correct,
        "substring_em": correct,
        "tool_calls": 1,
        "policy_tokens": 10,
        "infra_failures": infra or [],
        "values": [value],
        "v_s0": value,
    }


def test_summary_counts_infra_failures_and_leaves_them_out_of_accuracy():
    records = [_record(1.0), _record(0.0), _record(0.0, [BROKEN]), _record(0.0, [BROKEN], tier="easy")]
    summary = summarize(records)
    assert summary["infra_failures"] == 2.0
    assert summary["episodes"] == 2.0  # the scored ones
    assert summary["accuracy"] == 0.5  # not 0.25: the two broken episodes say nothing about the model
    assert "easy/accuracy" not in summary and summary["hard/episodes"] == 2.0
    assert summarize([_record(1.0)])["infra_failures"] == 0.0


def test_summary_of_only_infra_failures_raises():
    with pytest.raises(ToolUnavailableError, match="all 2 evaluation episodes hit a tool that could not run"):
        summarize([_record(0.0, [BROKEN]), _record(1.0, [BROKEN])])


def test_critic_metrics_leave_infra_failures_out():
    clean = critic_metrics([_record(1.0, value=0.9), _record(0.0, value=0.1)])[0]
    mixed = critic_metrics(
        [_record(1.0, value=0.9), _record(0.0, value=0.1), _record(0.0, [BROKEN], value=0.9)]
    )[0]
    assert mixed["critic/brier"] == clean["critic/brier"]
    assert mixed["critic/boundary_states"] == 2.0


def test_episode_records_list_the_infra_failures_of_their_path(tree):
    invoke = tree.path(3)[1]  # the tool-calling episode: prompt -> invoke -> observation -> commit
    tree.segment(invoke).info["results"] = [
        {
            "name": "python",
            "output": "ERROR: the python sandbox is unavailable: ...",
            "ok": False,
            "infra": True,
        }
    ]
    records = episode_records([tree], [EXAMPLE])
    by_answer = {r["answer"]: r for r in records}
    assert by_answer["84"]["infra_failures"] == ["python: ERROR: the python sandbox is unavailable: ..."]
    assert by_answer["86"]["infra_failures"] == []  # the other episode of the group never called the tool
    summary = summarize(records)
    assert summary["infra_failures"] == 1.0 and summary["episodes"] == 1.0 and summary["accuracy"] == 0.0


@pytest.fixture
def broken_sandbox(monkeypatch, tmp_path):
    """The sandbox's interpreter is gone (as a venv under /tmp was inside bubblewrap); restored after the test."""
    previous = ps.configure(python=str(tmp_path / "gone" / "bin" / "python"))
    monkeypatch.setattr(ps, "_modes", {})
    monkeypatch.setattr(ps, "_announced", set())
    monkeypatch.setattr(ps, "_checked", set())
    yield
    ps.configure(**asdict(previous))


def test_eval_command_stops_before_any_episode_with_one_message(broken_sandbox, tiny_overrides, tmp_path):
    result = CliRunner().invoke(
        app,
        ["eval", "--model", "tiny", "--config", "carl-segment-arith-tools", "--limit", "2",
         "--out", str(tmp_path / "out"), *[x for o in tiny_overrides for x in ("--set", o)]],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the python sandbox cannot run code here" in errors[0], result.output
    assert "To fix it" in errors[0]
    assert "Traceback" not in result.output
    assert not (tmp_path / "out" / "episodes.jsonl").exists()
