"""GEAR's signal statistics and its one-line error for a task without a reference trajectory, by hand (the
teacher prompt and the teacher's scoring are ``tests/train/test_gear_teacher_prompt.py`` and
``tests/train/test_gear_reference.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from agentcredit.credit.methods.gear.teacher import reference_trajectories, signal_stats
from agentcredit.credit.signals import NoReference


def test_rkl_mean_over_the_policy_tokens():
    batch = SimpleNamespace(
        policy_mask=torch.tensor([[True, False, True]]), old_logp=torch.tensor([[-1.0, -5.0, -2.0]])
    )
    # student - teacher on the two policy tokens: -1 - (-1.5) = 0.5 and -2 - (-1) = -1.0; the mean is -0.25
    stats = signal_stats(batch, {"teacher_logp": torch.tensor([[-1.5, 0.0, -1.0]])})
    assert stats == {"gear/rkl_mean": pytest.approx(-0.25)}
    assert signal_stats(batch, {"teacher_logp": None}) == {}
    no_policy = SimpleNamespace(policy_mask=torch.zeros(1, 3, dtype=torch.bool), old_logp=batch.old_logp)
    assert signal_stats(no_policy, {"teacher_logp": torch.zeros(1, 3)}) == {}


def test_no_reference_is_one_line_naming_the_variant():
    def missing():
        raise NoReference("no scripted demonstrations for protocol 'x'")

    with pytest.raises(ValueError, match=r"protocol 'x'\. Set algorithm\.gear\.reference=answer") as info:
        reference_trajectories(missing)
    assert "\n" not in str(info.value)

    def found():
        return str

    assert reference_trajectories(found) is str
