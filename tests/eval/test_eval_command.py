"""`agentcredit eval` end to end on the tiny model: base model, HF dir with a critic, run and checkpoint dirs, CLI."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from agentcredit.cli import app
from agentcredit.config import ConfigError
from agentcredit.eval.loading import load_for_eval, value_head_from_state
from agentcredit.eval.runner import EvalOptions, eval_config, run_eval
from agentcredit.models.heads import BoundaryValueHead, TokenValueHead


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_eval_base_model_writes_episodes_and_summary(tiny_overrides, tmp_path):
    result = run_eval(
        "tiny",
        "grpo-arith-tools",
        overrides=tiny_overrides,
        options=EvalOptions(limit=2),
        out_dir=tmp_path,
        log=lambda _m: None,
    )
    episodes = _lines(tmp_path / "episodes.jsonl")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(episodes) == 2 and summary["questions"] == 2 and summary["temperature"] == 0.0
    for key in ("accuracy", "em", "f1", "substring_em", "tool_calls", "policy_tokens", "tool_call_rate"):
        assert key in summary
    assert summary["reliability"] is None and "critic/ece" not in result and "metrics" not in summary
    assert {s["role"] for s in episodes[0]["segments"]} >= {"prompt", "policy"}


def test_eval_options_and_config_are_checked():
    with pytest.raises(ValueError, match="greedy"):
        EvalOptions(samples=3)
    with pytest.raises(ValueError, match="temperature"):
        EvalOptions(temperature=-1)
    with pytest.raises(ConfigError, match="--config is required"):
        eval_config(None, [], None)


def test_tiers_need_the_codefence_protocol(tiny_overrides, tmp_path):
    with pytest.raises(ValueError, match="codefence"):
        run_eval(
            "tiny",
            "portool-arith-tools",
            overrides=tiny_overrides,
            options=EvalOptions(limit=1, tiers=True),
            out_dir=tmp_path,
            log=lambda _m: None,
        )


def test_model_dir_with_value_head_gets_critic_metrics_and_tiers(tiny, tiny_overrides, tmp_path):
    model, tokenizer = tiny
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    torch.save(BoundaryValueHead(model.config.hidden_size).state_dict(), tmp_path / "model" / "value_head.pt")
    loaded = load_for_eval(tmp_path / "model")
    assert isinstance(loaded.value_head, BoundaryValueHead) and loaded.run_config is None
    result = run_eval(
        str(tmp_path / "model"),
        "carl-segment-arith-tools",
        overrides=tiny_overrides,
        options=EvalOptions(limit=2, tiers=True, tier_samples=2),
        out_dir=tmp_path / "out",
        log=lambda _m: None,
    )
    m = result
    assert m["critic/v_s0_mean"] == pytest.approx(0.5)  # zero-initialised last layer: V = sigmoid(0)
    assert "critic/ece" in m and "critic/explained_variance" in m and "critic/auc_v_s0" in m
    assert set(result["tiers"].values()) <= {"tier1", "tier2"}
    episodes = _lines(tmp_path / "out" / "episodes.jsonl")
    assert all(e["v_s0"] == pytest.approx(0.5) and e["tier_label"] in ("tier1", "tier2") for e in episodes)
    assert len(json.loads((tmp_path / "out" / "summary.json").read_text())["reliability"]) == 10


@pytest.mark.slow
def test_run_and_checkpoint_directories_load_the_trained_weights(tiny, tiny_overrides, tmp_path):
    from agentcredit.config import load_config
    from agentcredit.train.trainer import Trainer

    cfg = load_config(
        "ppo-arith-tools",
        [*tiny_overrides, "rollout.prompts_per_step=1", "rollout.n=2", "train.steps=1", "optim.lr=1e-2"],
    )
    trainer = Trainer(cfg, run_dir=tmp_path / "run")
    try:
        trainer.train(progress=False)
    finally:
        trainer.close()
    loaded = load_for_eval(tmp_path / "run")
    assert isinstance(loaded.value_head, TokenValueHead) and loaded.run_config.method == "ppo"
    for name, p in trainer.model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], p), name
    ckpt = next((tmp_path / "run" / "checkpoints").iterdir())
    assert "step 1" in load_for_eval(ckpt).source
    # without --config the run's own config is used; the default output goes inside the run
    result = run_eval(str(tmp_path / "run"), None, overrides=["task.eval_limit=1"], log=lambda _m: None)
    assert result["method"] == "ppo" and (tmp_path / "run" / "eval-test" / "summary.json").is_file()
    assert "critic/explained_variance" in result


def test_load_errors_say_what_is_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_for_eval(tmp_path / "missing")
    with pytest.raises(ValueError, match="not a model directory"):
        load_for_eval(tmp_path)
    with pytest.raises(ValueError, match="not a value head"):
        value_head_from_state({"w": torch.zeros(1)}, 4, where="x.pt")


def test_cli_eval_view_and_compare(tiny_overrides, tmp_path):
    runner = CliRunner()
    sets = [arg for o in tiny_overrides for arg in ("--set", o)]
    out = tmp_path / "eval"
    res = runner.invoke(
        app, ["eval", "--model", "tiny", "-c", "grpo-arith-tools", "--limit", "1", *sets, "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["view", str(out / "episodes.jsonl"), "--out", str(tmp_path / "page.html")])
    assert res.exit_code == 0 and (tmp_path / "page.html").is_file(), res.output
    res = runner.invoke(app, ["eval", "--model", "tiny", "-c", "grpo-arith-tools", "--samples", "2"])
    assert res.exit_code == 2 and "temperature" in res.output
    res = runner.invoke(app, ["compare", str(tmp_path / "nothing-here")])
    assert res.exit_code == 2 and "not a directory" in res.output


@pytest.mark.slow
def test_eval_embedded_model_with_tiers(tmp_path):
    result = run_eval(
        "embedded",
        "carl-segment-arith-tools",
        # short budgets: the base model rarely stops on its own, and 2 x (1 + 5 tier samples) episodes run here
        overrides=["rollout.max_new_tokens=48", "rollout.max_episode_tokens=96"],
        options=EvalOptions(limit=2, tiers=True),
        out_dir=tmp_path,
        log=lambda _m: None,
    )
    m = result
    assert m["episodes"] == 2 and 0 <= m["accuracy"] <= 1 and m["policy_tokens"] > 0
    assert any(k.startswith("tier") for k in m)  # Tier 1 / Tier 2 split from 5 no-tool samples
    assert len(_lines(tmp_path / "episodes.jsonl")) == 2


def test_eval_on_your_own_questions_drops_the_old_tasks_options(tiny_overrides, tmp_path):
    """Issue 35: `eval --config RUN/config.yaml --set task.name=jsonl:FILE` on an arith-tools run raised a TypeError
    (the run's easy_fraction reached the JSONL loader). The options belong to the old task: dropped, said once."""
    from agentcredit.config import TaskOptionsDropped, dump_config, load_config

    run_config = tmp_path / "config.yaml"
    demo = ["task.options={easy_fraction: 0.34, medium_fraction: 0.33}"]  # as `agentcredit demo` writes them
    run_config.write_text(dump_config(load_config("grpo-arith-tools", demo)))
    assert "easy_fraction" in load_config(run_config).task.options
    questions = tmp_path / "mine.jsonl"
    questions.write_text(
        '{"question": "What is 6*7?", "answer": 42}\n{"question": "What is 2+2?", "answer": 4}\n'
    )
    new_task = f"task.name=jsonl:{questions}"
    with pytest.warns(
        TaskOptionsDropped,
        match=r"from 'arith-tools' to 'jsonl:.*dropped .*\['easy_fraction', 'medium_fraction'\]",
    ):
        config = load_config(run_config, [new_task])
    assert config.task.options == {}
    kept = load_config(run_config, [new_task, "task.options.answer_field=answer"])  # options for the new task
    assert kept.task.options == {"answer_field": "answer"}
    assert load_config(run_config, ["task.split=test"]).task.options == load_config(run_config).task.options
    result = CliRunner().invoke(
        app,
        ["eval", "--model", "tiny", "--config", str(run_config), "--set", new_task, "--limit", "2",
         "--out", str(tmp_path / "out"), *[a for o in tiny_overrides for a in ("--set", o)]],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["questions"] == 2


def test_task_options_a_loader_does_not_take_are_one_error(tmp_path):
    from agentcredit.tasks import load_task

    questions = tmp_path / "mine.jsonl"
    questions.write_text('{"question": "What is 6*7?", "answer": 42}\n')
    with pytest.raises(ValueError, match=r"task.options \['easy_fraction'\] are not options of task 'jsonl:"):
        load_task(f"jsonl:{questions}", easy_fraction=0.5)
    with pytest.raises(
        ValueError, match=r"\['answer_field'\] are not options of task 'arith-tools' .*easy_fraction"
    ):
        load_task("arith-tools", limit=2, answer_field="x")
