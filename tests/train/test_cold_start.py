"""A run that starts RL without a passed critic warm-up gate says so (issue 48).

carl-segment calls its critic warm-up essential (carl-segment-level-credit.txt l. 94: the cold-start ablation trails
by ~9 EM). A carl-segment run from a model without ``warmup_summary.json`` used to start cold without a word; now RL
does not start unless ``train.cold_start`` (``--cold-start``) asks for the paper's cold-start ablation, and such a
run says so in its first lines, in every step's metrics and in its report."""

from __future__ import annotations

import json

import pytest
from train_helpers import EXAMPLES, SMALL
from typer.testing import CliRunner

from agentcredit.cli import app
from agentcredit.config import load_config
from agentcredit.eval.report import write_report
from agentcredit.models.loading import load_base_model
from agentcredit.train.trainer import Trainer
from agentcredit.train.warmup import WarmupGateFailed, gate_line, start_gate

ONE_STEP = [*SMALL, "train.steps=1"]


def _tiny_dir(directory):
    model, tokenizer = load_base_model("tiny", seed=0)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _trainer(config, run_dir=None):
    model, tokenizer = load_base_model("tiny", seed=0)
    return Trainer(
        config,
        model=model,
        tokenizer=tokenizer,
        examples=list(EXAMPLES),
        run_dir=run_dir,
        log=run_dir is not None,
    )


def test_no_warmup_is_recorded_for_a_warmed_critic_only(tmp_path):
    record = start_gate(load_config("carl-segment-arith-tools", [f"model.name={tmp_path}"]))
    assert record is not None and record["missing"] is True and record["passed"] is False
    assert "COLD critic" in gate_line(record)
    # PPO's and TIPS's token critics have no warm-up in their paper (TIPS Table 10: critic_warmup 0)
    assert start_gate(load_config("ppo-arith-tools", [f"model.name={tmp_path}"])) is None
    assert start_gate(load_config("grpo-arith-tools", [f"model.name={tmp_path}"])) is None


def test_rl_does_not_start_cold_unless_asked(tmp_path):
    trainer = _trainer(load_config("carl-segment-arith-tools", ONE_STEP))
    try:
        with pytest.raises(WarmupGateFailed, match=r"no critic warm-up.*--cold-start"):
            trainer.train(progress=False)
        assert trainer.step == 0
    finally:
        trainer.close()


def test_a_cold_start_says_so_in_its_metrics_and_report(tmp_path):
    run = tmp_path / "run"
    trainer = _trainer(load_config("carl-segment-arith-tools", [*ONE_STEP, "train.cold_start=true"]), run)
    try:
        history = trainer.train(progress=False)
    finally:
        trainer.close()
    assert history[0]["critic/cold_start"] == 1.0 and history[0]["critic/warmup_gate_passed"] == 0.0
    assert json.loads((run / "warmup_gate.json").read_text())["missing"] is True
    text = write_report([run], tmp_path / "report")["markdown"].read_text()
    assert "RL started with a COLD critic" in text


def test_cli_train_refuses_a_cold_start_in_one_line_and_writes_nothing(tmp_path):
    model = _tiny_dir(tmp_path / "m")
    args = [
        "train",
        "-c",
        "carl-segment-arith-tools",
        "--set",
        f"model.name={model}",
        "--run-dir",
        str(tmp_path / "r"),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no critic warm-up" in errors[0] and "--cold-start" in errors[0], (
        result.output
    )
    run = tmp_path / "r"
    assert not run.exists() or [p.name for p in run.iterdir()] == [".lock"]
