"""Demonstrations, SFT and training never learn from a tool that could not run (issue 11, item 2).

Before: with the sandbox unavailable, every scripted demonstration of a hard arith-tools question carried
``ERROR: the python sandbox is unavailable: ...`` as the tool's output, was still rewarded 1 (the script knows the
answer) and went into SFT; ``make demo`` ran to its end on it. Now the preflight stops the command first, and a
tool result marked ``infra`` stops demonstrations, rejection sampling and training with ToolUnavailableError.
"""

from __future__ import annotations

from dataclasses import asdict
from functools import partial

import pytest
from train_helpers import EXAMPLES, SMALL
from typer.testing import CliRunner

from agentcredit.cli import app
from agentcredit.config import load_config
from agentcredit.environment import Environment
from agentcredit.models.loading import load_base_model
from agentcredit.protocols import get_protocol
from agentcredit.rewards import outcome_reward
from agentcredit.rollout.tree import RolloutTree, Segment
from agentcredit.tools.base import ToolRuntime, ToolUnavailableError, unavailable
from agentcredit.tools.sandbox import tool as ps
from agentcredit.train.sft import demonstrations, rejection_sample
from agentcredit.train.trainer import Trainer

UNAVAILABLE = (
    "ERROR: the python sandbox is unavailable: bwrap: execvp /tmp/clone/.venv/bin/python: No such file"
)


def _env(config, python) -> Environment:
    protocol = get_protocol(config.protocol.name, **dict(config.protocol.options))
    return Environment(protocol, ToolRuntime({"python": python}), partial(outcome_reward), None)


@pytest.fixture(scope="module")
def config():
    return load_config("grpo-arith-tools", SMALL)


@pytest.fixture(scope="module")
def tiny():
    return load_base_model("tiny", seed=0)


def test_demonstrations_stop_on_an_unavailable_tool(config, tiny):
    env = _env(config, lambda args: unavailable(UNAVAILABLE))
    try:
        with pytest.raises(
            ToolUnavailableError, match="demonstrations stopped: the 'python' tool could not run"
        ):
            demonstrations(env, tiny[1], EXAMPLES, config.protocol.name)
    finally:
        env.close()


def test_demonstrations_keep_the_codes_own_errors(config, tiny):
    # A tool that answers (even with an ERROR text of its own, or the same words printed by code) is no
    # infrastructure failure: the demonstrations are built as before.
    env = _env(config, lambda args: "ERROR: the python sandbox is unavailable (printed by the code)")
    try:
        trees = demonstrations(env, tiny[1], EXAMPLES, config.protocol.name)
    finally:
        env.close()
    assert len(trees) == len(EXAMPLES)


def _engine_tree(tokenizer, infra: bool) -> RolloutTree:
    """A one-episode tree shaped as the engine leaves it: tool results in the invoking segment's info."""
    enc = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    tree = RolloutTree(Segment(enc("What is 17*23?"), "What is 17*23?", role="prompt", kind="prompt"))
    text = "```python\nprint(17*23)\n```"
    ids = enc(text)
    invoke = tree.add(
        Segment(ids, text, role="policy", kind="invoke", logprobs=[-1.0] * len(ids), entropies=[0.5] * len(ids),
                info={"calls": [{"name": "python", "arguments": {"code": "print(17*23)"}}],
                      "results": [{"name": "python", "output": UNAVAILABLE if infra else "391\n", "ok": not infra,
                                   "seconds": 0.0, "infra": infra}]}),
        0,
    )  # fmt: skip
    answer = "The answer is \\boxed{391}."
    ids = enc(answer)
    leaf = tree.add(
        Segment(
            ids, answer, role="policy", kind="commit", logprobs=[-1.0] * len(ids), entropies=[0.5] * len(ids)
        ),
        invoke,
    )
    tree.nodes[leaf].info["answer"] = "391"
    tree.set_reward(leaf, 1.0)
    return tree


class _FakeEngine:
    def __init__(self, trees):
        self.trees = trees
        self.stats = type("Stats", (), {"to_dict": lambda self: {"generated_tokens": 1.0}})()

    def run(self, examples, strategy, reward):
        return self.trees


def test_training_stops_on_an_episode_with_an_unavailable_tool(config, tiny, monkeypatch):
    model, tokenizer = tiny
    env = _env(config, lambda args: "391\n")
    trainer = Trainer(config, model=model, tokenizer=tokenizer, environment=env, examples=EXAMPLES, log=False)
    try:
        monkeypatch.setattr(
            trainer.rollouts, "engine", lambda env, step: _FakeEngine([_engine_tree(tokenizer, infra=False)])
        )
        trees, _ = trainer.rollout(EXAMPLES[:1])  # a clean episode trains as before
        assert len(trees) == 1
        monkeypatch.setattr(
            trainer.rollouts, "engine", lambda env, step: _FakeEngine([_engine_tree(tokenizer, infra=True)])
        )
        with pytest.raises(ToolUnavailableError, match=r"training \(step 1\) stopped: a tool could not run"):
            trainer.rollout(EXAMPLES[:1])
    finally:
        trainer.close()


def test_rejection_sampling_stops_on_an_episode_with_an_unavailable_tool(config, tiny):
    env = _env(config, lambda args: "391\n")
    try:
        clean = rejection_sample(_FakeEngine([_engine_tree(tiny[1], infra=False)]), None, env, EXAMPLES[:1])
        assert len(clean) == 1
        with pytest.raises(ToolUnavailableError, match="rejection sampling stopped"):
            rejection_sample(_FakeEngine([_engine_tree(tiny[1], infra=True)]), None, env, EXAMPLES[:1])
    finally:
        env.close()


@pytest.fixture
def broken_sandbox(monkeypatch, tmp_path):
    """The sandbox's interpreter is gone (as a venv under /tmp was inside bubblewrap); restored after the test."""
    previous = ps.configure(python=str(tmp_path / "gone" / "bin" / "python"))
    monkeypatch.setattr(ps, "_modes", {})
    monkeypatch.setattr(ps, "_announced", set())
    monkeypatch.setattr(ps, "_checked", set())
    yield
    ps.configure(**asdict(previous))


def test_sft_command_stops_before_any_work_with_one_message(broken_sandbox, tmp_path):
    out = tmp_path / "sft"
    result = CliRunner().invoke(
        app,
        ["sft", "--out", str(out), "--config", "carl-segment-arith-tools", "--examples", "4", "--epochs", "1",
         "--set", "model.name=tiny", "--set", "train.tensorboard=false"],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the python sandbox cannot run code here" in errors[0], result.output
    assert "Traceback" not in result.output and "SFT on" not in result.output
    assert not out.exists()


def test_demo_command_stops_before_any_work_with_one_message(broken_sandbox, tmp_path):
    out = tmp_path / "demo"
    result = CliRunner().invoke(
        app,
        ["demo", "--out", str(out), "--rl-steps", "1", "--sft-examples", "8", "--eval-limit", "4",
         "--set", "model.name=tiny", "--set", "rollout.max_new_tokens=16", "--set", "rollout.max_episode_tokens=48",
         "--set", "train.tensorboard=false"],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the python sandbox cannot run code here" in errors[0], result.output
    assert "Traceback" not in result.output and "[2/4]" not in result.output
    assert not (out / "report.md").exists()
