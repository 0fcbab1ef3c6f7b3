"""``train.eval_every``: held-out evaluation during training lands in metrics.jsonl (it used to be ignored)."""

from __future__ import annotations

import json

import pytest
from train_helpers import SMALL

from agentcredit.config import load_config
from agentcredit.eval.evaluate import SUMMARY_FIELDS, summary_metrics
from agentcredit.run import heldout_evaluation, run_train


def test_eval_every_logs_held_out_metrics_at_those_steps(tmp_path):
    config = load_config(
        "grpo-arith-tools",
        [*SMALL, "train.steps=2", "train.eval_every=1", "task.eval_limit=3", "rollout.max_new_tokens=16"],
    )
    lines: list[str] = []
    run_train(config, run_dir=tmp_path / "run", progress=False, log=lines.append)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [1, 2]
    for r in evals:
        assert (
            r["eval/episodes"] == 3.0 and "eval/easy/tool_call_rate" in r or "eval/hard/tool_call_rate" in r
        )
        assert r["time/eval"] > 0
    assert sum("held-out" in line for line in lines) == 2
    assert any(
        line.endswith("; rollout backend: hf") for line in lines
    )  # issue 33: it says which backend ran
    # the final evaluation has `agentcredit eval`'s summary.json shape: what was evaluated, then flat metrics
    final = json.loads((tmp_path / "run" / "eval_summary.json").read_text())
    assert list(final)[: len(SUMMARY_FIELDS)] == list(SUMMARY_FIELDS) and "metrics" not in final
    assert (final["method"], final["task"], final["split"], final["questions"]) == (
        "grpo",
        "arith-tools",
        "test",
        3,
    )
    assert final["accuracy"] == summary_metrics(final)["accuracy"] and "seconds" not in summary_metrics(final)


def test_the_held_out_evaluation_is_built_from_the_eval_split_only_when_asked():
    assert heldout_evaluation(load_config("grpo-arith-tools", [*SMALL, "train.eval_every=0"])) is None
    config = load_config("grpo-arith-tools", [*SMALL, "train.eval_every=2", "task.eval_limit=3"])
    heldout = heldout_evaluation(config)
    assert list(heldout.sets) == [config.task.eval_split] and len(heldout.sets[config.task.eval_split]) == 3
    assert heldout.every == 2 and heldout.due(2) and not heldout.due(1)


def test_an_unreadable_held_out_split_stops_the_run_before_its_directory_is_made(tmp_path):
    """The held-out sets load before the run directory is claimed: a mistyped ``task.eval_split`` used to leave
    a directory holding only the run's ``.lock`` behind."""
    config = load_config("grpo-arith-tools", [*SMALL, "train.eval_every=1", "task.eval_split=nosuch"])
    with pytest.raises(ValueError, match="no split 'nosuch'"):
        run_train(config, run_dir=tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
