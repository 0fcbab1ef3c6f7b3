"""A training run's rollouts (:mod:`agentcredit.rollout.driver`): the strategy built once from ``config.rollout``,
the model the engine generates with, and the engine of each step."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from agentcredit.config import RolloutConfig
from agentcredit.models.device import Precision
from agentcredit.protocols import get_protocol
from agentcredit.rollout.driver import RolloutDriver
from agentcredit.rollout.strategies import EntropyGuided

FP32 = Precision(weights=torch.float32, autocast=False, rollout=torch.float32)
BF16_ROLLOUTS = Precision(weights=torch.float32, autocast=False, rollout=torch.bfloat16)


def _driver(tiny, precision=FP32, **rollout):
    model, tokenizer = tiny
    return RolloutDriver(RolloutConfig(**rollout), model, tokenizer, precision=precision, seed=7)


def test_the_strategy_is_the_one_the_rollout_section_names(tiny):
    driver = _driver(tiny, strategy="entropy_guided", n0=2, n=3, t_max=5)
    assert isinstance(driver.strategy, EntropyGuided) and driver.strategy.t_max == 5


def test_the_engine_generates_with_the_policy_itself_when_the_dtypes_agree(tiny):
    driver = _driver(tiny)
    assert driver.model(0) is tiny[0] and driver.model(3) is tiny[0]


def test_a_rollout_dtype_copy_is_made_once_per_step(tiny):
    driver = _driver(tiny, precision=BF16_ROLLOUTS)
    first = driver.model(0)
    assert first is not tiny[0] and next(first.parameters()).dtype == torch.bfloat16
    assert driver.model(0) is first  # the same step: no new copy
    assert driver.model(1) is not first  # after an update: the policy's new weights


def test_each_step_samples_with_its_own_seed_unless_told(tiny):
    driver = _driver(tiny, temperature=0.7, max_new_tokens=11, max_turns=3)
    env = SimpleNamespace(protocol=get_protocol("codefence"), tools=None)
    engine = driver.engine(env, 4)
    assert engine.config.seed == 7 * 1_000_003 + 4
    assert engine.config.sampling.temperature == 0.7 and engine.config.max_segment_tokens == 11
    assert engine.config.max_turns == 3
    told = driver.engine(env, 4, temperature=0.0, seed=5)
    assert told.config.seed == 5 and told.config.sampling.temperature == 0.0
