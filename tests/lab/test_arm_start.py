"""Which model each arm of a study starts from, beside a warmed-up start (agentcredit.lab.study_spec.StudyLayout.
arm_start).

Regression: arith-tool-can-hurt's preflight stopped timing its PPO arm with "value_head.pt does not fit a 'token'
value head": PPO was handed the warmed start, whose head is carl-segment's boundary head. An arm whose critic is of
another kind starts from the SFT model (the same policy weights when the warm-up has no joint steps) with its own
fresh head.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentcredit.lab.common import StudyError
from agentcredit.lab.study_spec import StudyLayout, load_study

STUDY = Path(__file__).resolve().parents[2] / "studies" / "arith-tool-can-hurt.yaml"


def _layout(tmp_path: Path, **warmup: int) -> StudyLayout:
    spec = load_study(STUDY)
    if warmup:
        spec = spec.model_copy(
            update={
                "start": spec.start.model_copy(update={"warmup": spec.start.warmup.model_copy(update=warmup)})
            }
        )
    return StudyLayout(spec, tmp_path)


def test_each_arm_starts_from_the_model_its_critic_fits(tmp_path):
    layout = _layout(tmp_path)
    starts = {arm.name: layout.arm_start(arm).name for arm in layout.spec.arms}
    # carl-segment's boundary head is the one the warm-up trained; GRPO has none; PPO's token head starts fresh
    assert starts == {"grpo": "sft-model", "ppo": "sft-model", "carl-segment": "model"}


def test_a_critic_of_another_kind_has_no_start_after_joint_steps(tmp_path):
    layout = _layout(tmp_path, steps=2)
    ppo = next(a for a in layout.spec.arms if a.name == "ppo")
    with pytest.raises(StudyError, match=r"arms\[ppo\].*'token' critic.*2 joint steps"):
        layout.arm_start(ppo)
    grpo = next(a for a in layout.spec.arms if a.name == "grpo")
    assert layout.arm_start(grpo).name == "model"  # the policy changed: every arm reads the warmed weights
