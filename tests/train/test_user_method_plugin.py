"""A TIPS-like method that needs a signal no built-in method reads, added from this file alone (issue 53).

Everything the method is lives here: its signal (``turn_scores``: a score of the state before each policy segment),
the provider that computes it every batch, its settings and its shaping (potential-based, as TIPS: turn k earns
``alpha [Phi(S_k) - Phi(S_{k-1})]``, the last step ``- alpha Phi(S_M)``), composed with PPO as TIPS is. A user's
module registers them on import (:func:`register_plugin`), and the config names that module in ``imports:``, so the
run goes through the normal path: ``load_config`` imports it, the trainer makes its provider, the layout carries
its signal, and PPO's GAE reads the shaped rewards. No file of the package names it.
"""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import torch
from pydantic import Field
from train_helpers import EXAMPLES, SMALL, assert_a_real_step

import agentcredit.plugins as plugins
from agentcredit.config import ConfigError, load_config
from agentcredit.credit import EpisodeBatch, Method, Needs, Settings, register_method, register_signal
from agentcredit.credit.methods import METHODS, SIGNALS, unregister_method, unregister_signal
from agentcredit.credit.signals import (
    PROVIDERS,
    SignalProvider,
    register_provider,
    unregister_provider,
)

ROOT = Path(__file__).resolve().parents[2]
SIGNAL = "turn_scores"
#: what the provider computed and what the shaping read, per call (for the assertions)
SEEN: dict[str, list] = {"provided": [], "shaped": []}


# ---------------------------------------------------------------------------------------- the user's method
class AnswerSeen(SignalProvider):
    """Phi(S_k) = 1 when a gold answer appears in the state before policy segment k (a tool's output showed it),
    else 0: a rule instead of TIPS's teacher, so the test needs no second model."""

    provides = frozenset({SIGNAL})

    def fill(self, signals, batch, trees, examples, *, temperature, autocast) -> None:
        scores = []  # the run's context gives each policy segment's state: the provider imports no trainer code
        for traj, states in zip(batch.trajectories, self.run.segment_contexts(batch), strict=True):
            answers = examples[traj.tree].answers
            row_scores = []
            for ids in states:
                state = self.run.tokenizer.decode(ids)
                row_scores.append(float(any(a in state for a in answers)) * self.settings.scale)
            scores.append(row_scores)
        signals[SIGNAL] = scores  # a registered signal: Signals keeps it by name
        SEEN["provided"].append(scores)


class TurnScoreSettings(Settings):
    alpha: float = Field(0.2, ge=0.0, description="Shaping scale (ours, TIPS's default).")
    scale: float = Field(1.0, gt=0.0, description="Phi of a state that shows the answer.")


def turn_score_shape(batch: EpisodeBatch, settings: TurnScoreSettings) -> list[list[float]]:
    """Potential-based turn rewards on the steps: the shaping of turn k on the step that ends it, the outcome
    minus ``alpha Phi(S_M)`` on the last step, so an episode's rewards sum to its outcome minus alpha Phi(S_0)."""
    phis = batch.per_episode(SIGNAL, "turn-score")
    out = []
    for ep, phi, rewards in zip(batch.episodes, phis, batch.environment_rewards(), strict=True):
        assert len(phi) == len(ep.steps)
        rewards = list(rewards)
        for k in range(1, len(phi)):
            rewards[k - 1] += settings.alpha * (phi[k] - phi[k - 1])
        rewards[-1] -= settings.alpha * phi[-1]
        out.append(rewards)
    SEEN["shaped"].append(
        (settings.alpha, [list(p) for p in phis], out, [ep.reward for ep in batch.episodes])
    )
    return out


def register_plugin() -> Method:
    """What a user's module does on import: the signal, its provider, the method."""
    register_signal(
        SIGNAL, "per episode, Phi of the state before each policy segment (1: a gold answer seen)"
    )
    register_provider(AnswerSeen)
    return register_method(
        Method(
            name="turn-score",  # settings: algorithm.turn_score
            settings=TurnScoreSettings,
            needs=Needs(critic_base=True, signals=frozenset({SIGNAL}), why="group baselines cancel it"),
            source="a TIPS-like test method",
            shape=turn_score_shape,
            modifier="shaping",
            base="ppo",
        )
    )


def unregister_plugin() -> None:
    if "turn-score" in METHODS:
        unregister_method("turn-score")
    unregister_provider(AnswerSeen)
    if SIGNAL in SIGNALS:
        unregister_signal(SIGNAL)
    for name in [n for n in sys.modules if n.startswith("agentcredit_user_turn_score_plugin")]:
        del sys.modules[name]


@pytest.fixture
def plugin_file(tmp_path):
    """The user's module, as a file the config names: it registers the method when imported."""
    path = tmp_path / "turn_score_plugin.py"
    path.write_text("from test_user_method_plugin import register_plugin\n\nregister_plugin()\n")
    for seen in SEEN.values():
        seen.clear()
    yield path
    unregister_plugin()


# ---------------------------------------------------------------------------------------------- the tests
def test_the_config_imports_the_users_module_and_a_native_step_trains_with_its_signal(
    plugin_file, fitted_codefence
):
    from agentcredit.train.trainer import Trainer

    assert "turn-score" not in METHODS and SIGNAL not in PROVIDERS  # nothing is known before the config
    config = load_config(
        "ppo-arith-tools",
        [*SMALL, f"imports=[{plugin_file}]", "algorithm.method=turn-score", "algorithm.turn_score.alpha=0.5"],
    )
    method = config.algorithm.credit_method
    assert [p.name for p in method.parts] == ["ppo", "turn-score"]  # composed with its base, as TIPS
    assert config.imports == [str(plugin_file)]
    model, tokenizer = fitted_codefence
    trainer = Trainer(
        config, model=copy.deepcopy(model), tokenizer=tokenizer, examples=list(EXAMPLES), log=False
    )
    assert [type(p) for p in trainer.providers] == [AnswerSeen]
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    try:
        result = trainer.train_step()
    finally:
        trainer.close()
    assert_a_real_step(trainer, result, before)
    # the provider's scores reached the shaping through the layout, with the config's alpha
    [provided] = SEEN["provided"]
    [(alpha, read, shaped, outcomes)] = SEEN["shaped"]
    assert alpha == 0.5 and read == provided
    assert all(set(p) <= {0.0, 1.0} for p in provided)
    for phi, rewards, outcome in zip(read, shaped, outcomes, strict=True):  # the telescoping sum
        assert math.fsum(rewards) == pytest.approx(outcome - alpha * phi[0], abs=1e-12)
    assert torch.isfinite(result.batch.advantages[result.batch.loss_mask]).all()


def test_a_method_needing_an_unregistered_signal_is_refused_with_the_way_to_register_it():
    with pytest.raises(ValueError, match=r"unknown signal\(s\) \['turn_scores'\].*register_signal"):
        Needs(signals=frozenset({SIGNAL}))
    with pytest.raises(ValueError, match="not a registered signal"):
        register_provider(AnswerSeen)
    with pytest.raises(ValueError, match="the trainer computes 'values' itself"):
        register_provider(type("Values", (AnswerSeen,), {"provides": frozenset({"values"})}))


def test_a_signal_without_a_provider_is_an_error_naming_it(fitted_codefence):
    from agentcredit.train.trainer import Trainer

    register_plugin()
    unregister_provider(AnswerSeen)
    try:
        config = load_config("ppo-arith-tools", [*SMALL, "algorithm.method=turn-score"])
        model, tokenizer = fitted_codefence
        with pytest.raises(ValueError, match=r"turn-score needs the signal\(s\) \['turn_scores'\]"):
            Trainer(
                config, model=copy.deepcopy(model), tokenizer=tokenizer, examples=list(EXAMPLES), log=False
            )
    finally:
        unregister_plugin()


def test_a_bad_imports_entry_is_one_line_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"imports\[1\]: cannot import 'no_such_module_xyz'") as err:
        load_config("grpo-arith-tools", ["imports=[json, no_such_module_xyz]"])
    assert "\n" not in str(err.value)
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('the plugin is broken')\n")
    with pytest.raises(ConfigError, match=r"imports\[0\]: .*RuntimeError: the plugin is broken"):
        load_config("grpo-arith-tools", [f"imports=[{broken}]"])
    with pytest.raises(ConfigError, match=r"imports: a list of module names"):
        load_config("grpo-arith-tools", ["imports=json"])


def test_the_cli_exits_2_with_one_line_for_a_module_it_cannot_import(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("base: grpo-arith-tools\nimports: [no_such_module_xyz]\n")
    out = subprocess.run(
        [sys.executable, "-m", "agentcredit.cli", "train", "--config", str(config)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "imports[0]: cannot import 'no_such_module_xyz'" in lines[0], out.stderr


def test_an_entry_point_of_the_plugins_group_registers_before_the_config_is_read(tmp_path, monkeypatch):
    (tmp_path / "turn_score_entry_point.py").write_text(
        "from test_user_method_plugin import register_plugin\n\nregister_plugin()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    installed = [EntryPoint("turn-score", "turn_score_entry_point", plugins.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(
        plugins, "entry_points", lambda group: installed if group == plugins.ENTRY_POINT_GROUP else []
    )
    monkeypatch.setattr(plugins, "_loaded_entry_points", None)
    try:
        config = load_config("ppo-arith-tools", ["algorithm.method=turn-score"])
        assert config.algorithm.credit_method.parts[-1].name == "turn-score"
        assert plugins.load_entry_points() == ["turn-score"]  # once per process
    finally:
        unregister_plugin()
        sys.modules.pop("turn_score_entry_point", None)


def test_verls_block_imports_the_users_module_too(plugin_file):
    """verl reads its ``agentcredit`` block in every process (driver, trainer, agent-loop workers), so a method
    from ``agentcredit.imports`` is known wherever the block is read."""
    from agentcredit.integrations.verl.settings import load_settings

    settings = load_settings(
        {"method": "turn-score", "imports": [str(plugin_file)], "turn_score": {"alpha": 0.3}}
    )
    assert settings.needs.signals == frozenset({"values", SIGNAL})
    assert settings.settings_for(SIGNAL).alpha == 0.3
    with pytest.raises(ValueError, match=r"agentcredit\.imports\[0\]: cannot import 'no_such_module_xyz'"):
        load_settings({"method": "grpo", "imports": ["no_such_module_xyz"]})
