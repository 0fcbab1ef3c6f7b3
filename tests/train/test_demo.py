"""``agentcredit demo`` end to end on the tiny random Llama: every stage runs and writes what the report names."""

from __future__ import annotations

import json
import re

import pytest

from agentcredit.run import DEMO_ROWS, demo_failed_gate, demo_table, run_demo


@pytest.mark.slow
def test_demo_runs_every_stage_and_writes_its_report(tmp_path):
    lines: list[str] = []
    result = run_demo(
        tmp_path,
        sft_examples=8,
        sft_epochs=1,
        warmup_questions=4,
        rl_steps=1,
        eval_limit=4,
        overrides=(
            "model.name=tiny",  # the model to fine-tune; the RL stage must still start from the SFT output
            "rollout.prompts_per_step=2",
            "rollout.n=2",
            "rollout.max_new_tokens=16",
            "rollout.max_episode_tokens=48",
            "train.tensorboard=false",
        ),
        log=lines.append,
    )
    assert [line[:5] for line in lines if line.startswith("[")] == [
        "[1/5]",
        "[2/5]",
        "[3/5]",
        "[4/5]",
        "[5/5]",
    ]
    # which rollout backend ran (issue 33: the demo says it)
    assert [line for line in lines if line.startswith("[4/5]")][0].endswith("(rollout backend: hf)")
    for stage in ("before", "after"):
        assert result[stage]["episodes"] == 4
        assert 0.0 <= result[stage]["accuracy"] <= 1.0
    rl_config = (tmp_path / "carl-segment" / "config.yaml").read_text()
    assert f"name: {tmp_path / 'start-model'}" in rl_config  # not the base model named by the override
    assert (tmp_path / "start-model" / "value_head.pt").is_file()  # RL starts from the warmed-up critic
    assert "critic/ece" in result["before"] and "critic/ece" in result["after"]
    report = (tmp_path / "report.md").read_text()
    for label, _ in DEMO_ROWS:
        assert f"| {label}" in report
    assert (tmp_path / "carl-segment" / "episodes" / "step-000001.jsonl").stat().st_size > 0
    assert re.search(r"peak RSS \d+\.\d\d GiB \(\d+\.\d\d GB\)", report)
    # four warm-up questions cannot pass the gate: the demo says first what it shows instead (issue 48)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rl_started_on_passed_gate"] is False
    assert report.splitlines()[2] == f"**{demo_failed_gate('carl-segment')}**"
    assert f"warning: {demo_failed_gate('carl-segment')}" in lines
    assert len((tmp_path / "eval_after_rl.jsonl").read_text().splitlines()) == 4
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert json.dumps(summary["after_rl"], sort_keys=True) == json.dumps(
        result["after"], sort_keys=True
    )  # NaN-safe


def test_the_demo_table_is_its_method_after_sft_and_after_rl():
    """The table's layout, pinned: the RL column is headed by the demo's method and as wide as its header."""
    table = demo_table({"accuracy": 0.5}, {"accuracy": 0.75}, "carl-segment").splitlines()
    width = max(len(label) for label, _ in DEMO_ROWS)
    assert table[0] == f"| {'metric':<{width}} | {'after SFT':>10} | after carl-segment |"
    assert table[1] == f"|{'-' * (width + 2)}|{'-' * 12}|{'-' * 20}|"
    assert table[2] == f"| {'accuracy':<{width}} | {0.5:>10.3f} | {0.75:>18.3f} |"
    assert table[3].endswith(f"| {'nan':>10} | {'nan':>18} |")
