"""A method registered from outside the package (here, this test file) trains one step on the native trainer
(issue 37): its settings, needs and estimate are one object, and nothing else is touched. The verl side (the verl
venv) is in tests/integrations/test_verl_advantages.py (through the adapter) and test_verl_configs.py (run from
the generic Hydra config, with no verl file of its own)."""

from __future__ import annotations

import copy

import pytest
import torch
from pydantic import Field
from train_helpers import EXAMPLES, SMALL, assert_a_real_step

from agentcredit.config import ConfigError, dump_config, load_config
from agentcredit.credit import EpisodeBatch, Estimate, Method, Needs, Settings, register_method
from agentcredit.credit.methods import unregister_method

CALLS: list[float] = []


class LeaveOneOutSettings(Settings):
    scale: float = Field(1.0, gt=0.0, description="Multiplies the advantage (RLOO, Ahmadian et al. 2024: 1).")


def leave_one_out(batch: EpisodeBatch, settings: LeaveOneOutSettings) -> Estimate:
    """RLOO: A_i = R_i - mean_{j != i} R_j within the group, on every step of the episode."""
    groups: dict[object, list[float]] = {}
    for ep in batch.episodes:
        groups.setdefault(ep.group, []).append(ep.reward)
    per_step = []
    for ep in batch.episodes:
        rewards = groups[ep.group]
        others = (sum(rewards) - ep.reward) / max(len(rewards) - 1, 1)
        per_step.append([settings.scale * (ep.reward - others)] * len(ep.steps))
    CALLS.append(settings.scale)
    return Estimate(batch.paint_steps(per_step, batch.zeros()), batch.trained_mask())


@pytest.fixture
def rloo():
    method = register_method(
        Method(
            name="rloo",  # its settings section is algorithm.rloo (the name in snake_case)
            settings=LeaveOneOutSettings,
            needs=Needs(),
            source="RLOO, Ahmadian et al. 2024",
            estimate=leave_one_out,
        )
    )
    CALLS.clear()
    yield method
    unregister_method("rloo")


def test_a_method_registered_outside_the_package_trains_one_native_step(rloo, fitted_codefence):
    from agentcredit.train.trainer import Trainer

    config = load_config("grpo-arith-tools", [*SMALL, "algorithm.method=rloo", "algorithm.rloo.scale=2.0"])
    assert config.method == "rloo" and config.algorithm.credit_method.name == "rloo"
    model, tokenizer = fitted_codefence
    trainer = Trainer(
        config, model=copy.deepcopy(model), tokenizer=tokenizer, examples=list(EXAMPLES), log=False
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    try:
        result = trainer.train_step()
    finally:
        trainer.close()
    assert CALLS == [2.0]  # its estimate ran, with its settings from the config
    assert_a_real_step(trainer, result, before)
    adv = result.batch.advantages[result.batch.loss_mask]
    assert torch.isfinite(adv).all()


def test_an_unregistered_method_is_one_config_error(rloo):
    unregister_method("rloo")
    with pytest.raises(
        ConfigError, match="algorithm.method: 'rloo' names no registered method: use one of .*grpo"
    ) as err:
        load_config("grpo-arith-tools", ["algorithm.method=rloo"])
    assert "\n" not in str(err.value)
    register_method(rloo)  # the fixture forgets it again


def test_its_settings_are_a_config_section_of_its_own_class(rloo):
    config = load_config("grpo-arith-tools", ["algorithm.method=rloo", "algorithm.rloo.scale=0.5"])
    settings = config.algorithm.credit_method.settings_from(config.algorithm)
    assert isinstance(settings["rloo"], LeaveOneOutSettings) and settings["rloo"].scale == 0.5
    assert "rloo:\n    scale: 0.5" in dump_config(config)
    default = load_config("grpo-arith-tools", ["algorithm.method=rloo"]).algorithm
    assert (
        default.credit_method.settings_from(default)["rloo"].scale == 1.0
    )  # no section: its class's defaults
    with pytest.raises(ConfigError, match=r"algorithm\.rloo\.scale: Input should be greater than 0") as err:
        load_config("grpo-arith-tools", ["algorithm.method=rloo", "algorithm.rloo.scale=-1"])
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="unknown key 'algorithm.rlooo'; allowed keys here: .*rloo"):
        load_config("grpo-arith-tools", ["algorithm.rlooo.scale=1"])


def test_registering_a_taken_name_is_refused(rloo):
    with pytest.raises(ValueError, match="already registered"):
        register_method(rloo)
