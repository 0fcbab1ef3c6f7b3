"""GiGPO (episode group + step groups by anchor state): a worked example by hand and invariants."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.credit import gigpo_advantages, grpo_advantages


def test_worked_example_by_hand():
    # One question, three episodes. Episodes 0 and 1 both start from the prompt s0 and take a first action that
    # leads to the same state a (same tokens, same search result); episode 2 answers at once.
    #   ep 0: steps from [s0, a], R = 1 -> returns [0.95, 1]
    #   ep 1: steps from [s0, a], R = 0 -> returns [0, 0]
    #   ep 2: steps from [s0],    R = 1 -> returns [1]
    # Episode level: R = (1, 0, 1), mean 2/3, unbiased std sqrt(1/3) -> A^E = (1/3, -2/3, 1/3) / sqrt(1/3)
    #   = (0.57735, -1.15470, 0.57735).
    # Step group (q, s0): returns (0.95, 0, 1), mean 0.65, deviations (0.30, -0.65, 0.35),
    #   var (0.09 + 0.4225 + 0.1225) / 2 = 0.3175, std 0.563471 -> A^S = (0.53241, -1.15356, 0.62115).
    # Step group (q, a): returns (1, 0), mean 0.5, std sqrt(0.5) -> A^S = (0.70711, -0.70711).
    out = gigpo_advantages([1.0, 0.0, 1.0], ["q", "q", "q"], [["s0", "a"], ["s0", "a"], ["s0"]], eps=0.0)
    ae = [1 / 3 / math.sqrt(1 / 3), -2 / 3 / math.sqrt(1 / 3), 1 / 3 / math.sqrt(1 / 3)]
    s0_std = math.sqrt(0.3175)
    a_std = math.sqrt(0.5)
    assert out[0].tolist() == pytest.approx([ae[0] + 0.30 / s0_std, ae[0] + 0.5 / a_std])
    assert out[1].tolist() == pytest.approx([ae[1] - 0.65 / s0_std, ae[1] - 0.5 / a_std])
    assert out[2].tolist() == pytest.approx([ae[2] + 0.35 / s0_std])
    assert out[0].tolist() == pytest.approx([1.10976, 1.28446], abs=1e-5)
    assert out[1].tolist() == pytest.approx([-2.30826, -1.86181], abs=1e-5)
    # step_weight 0.5 halves only the step part; mean_norm (scale=False) divides by nothing
    half = gigpo_advantages(
        [1.0, 0.0, 1.0], ["q"] * 3, [["s0", "a"], ["s0", "a"], ["s0"]], eps=0.0, step_weight=0.5
    )
    assert half[1].tolist() == pytest.approx([ae[1] - 0.5 * 0.65 / s0_std, ae[1] - 0.5 * 0.5 / a_std])
    plain = gigpo_advantages([1.0, 0.0, 1.0], ["q"] * 3, [["s0", "a"], ["s0", "a"], ["s0"]], scale=False)
    assert plain[0].tolist() == pytest.approx([1 / 3 + 0.30, 1 / 3 + 0.5])


def test_a_state_seen_once_adds_nothing_and_groups_do_not_mix():
    # different anchors after the first step: only the shared prompt forms a step group
    out = gigpo_advantages([1.0, 0.0], ["q", "q"], [["s0", "x"], ["s0", "y"]], gamma=1.0)
    episode = grpo_advantages(torch.tensor([1.0, 0.0], dtype=torch.float64), ["q", "q"])
    assert out[0].tolist() == pytest.approx([2 * float(episode[0]), float(episode[0])])
    # the same anchor name in two questions is two different states
    split = gigpo_advantages([1.0, 0.0], ["q1", "q2"], [["s0"], ["s0"]])
    assert [t.tolist() for t in split] == [[0.0], [0.0]]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rewards": [1.0], "group_ids": ["q"], "anchors": [[]]}, "at least one step"),
        ({"rewards": [1.0], "group_ids": ["q", "q"], "anchors": [["s"]]}, "one label per episode"),
        ({"rewards": [1.0], "group_ids": ["q"], "anchors": [["s"], ["s"]]}, "anchors has 2 episodes"),
        ({"rewards": [float("nan")], "group_ids": ["q"], "anchors": [["s"]]}, "rewards"),
        ({"rewards": [1.0], "group_ids": ["q"], "anchors": [["s"]], "gamma": 1.5}, "gamma"),
    ],
)
def test_bad_input_names_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gigpo_advantages(**kwargs)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0.0, 1.0]), st.integers(1, 4), st.integers(0, 2)), min_size=1, max_size=8
    ),
    st.floats(0.0, 2.0),
)
def test_without_the_step_part_it_is_grpo_on_every_step(episodes, weight):
    rewards = [r for r, _, _ in episodes]
    groups = [g for _, _, g in episodes]
    anchors = [[f"e{i}-t{t}" for t in range(length)] for i, (_, length, _) in enumerate(episodes)]
    grpo = grpo_advantages(torch.tensor(rewards, dtype=torch.float64), groups)
    # every anchor unique: no step group has two members, so the step part is 0 whatever its weight
    out = gigpo_advantages(rewards, groups, anchors, step_weight=weight)
    for i, steps in enumerate(out):
        assert steps.tolist() == pytest.approx([float(grpo[i])] * len(anchors[i]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1.0]), min_size=2, max_size=8), st.floats(0.0, 2.0))
def test_one_step_episodes_from_one_state_double_the_grpo_advantage(rewards, weight):
    # T = 1 everywhere and one shared anchor: the step group is the episode group with the same returns
    out = gigpo_advantages(rewards, ["q"] * len(rewards), [["s0"]] * len(rewards), step_weight=weight)
    grpo = grpo_advantages(torch.tensor(rewards, dtype=torch.float64), ["q"] * len(rewards))
    assert [float(t[0]) for t in out] == pytest.approx([(1 + weight) * float(a) for a in grpo])
