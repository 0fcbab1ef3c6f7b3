"""GEAR's W varies by turn: a turn's first token opens no segment (issue 48).

Before issue 48 a spike on the first token of an episode (the ``<`` of ``<think>``: a prompt-shift spike whose entropy
is so high that no later token exceeds lambda_H times it) opened one segment that ran across every observation to the
episode's end (spec gear.md A5, A6): W was one constant per episode and GEAR a rescaled GRPO. That token's spike is of
"limited semantic relevance" (seed lines 201, 355); that the first token of each turn opens no segment is ours,
measured on kb-multihop training questions (:data:`agentcredit.credit.methods.gear.maths.TURN_HEAD_TOKENS`,
docs/results/gear-segments). Segments still run across observations, as the paper's scan over the policy tokens does
(``break_at_observation`` is ours and off: it separated the deviating turn less in the same measurement).

The scripted trajectory below (teacher log-probs 0, so rKL = the student's log-prob column) has three turns with an
observation of two tokens between them; turn 1 is the deviating one (a wrong search):

    turn 0   '<' rKL 1.0 H 5.0 | 'search' 0 H 1.0 | 'x' 0 H 0.5   | '>' 0 H 0.2
    turn 1   '<' 0 H 1.0       | 'wrong' 2.0 H 1.0 | 'q' 0.1 H 0.5 | '>' 0 H 0.2
    turn 2   '<' 0.2 H 2.0     | 'ans' 0 H 0.4     | '>' 0 H 0.1

min-max over the 11 policy tokens (min 0, max 2): r = [.5, 0, 0, 0 | 0, 1, .05, 0 | .1, 0, 0]; 2 of 11 tokens
exceed 0.1 (the 0.1 of turn 2 does not: strict '>'), so "auto" keeps min-max.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.credit import Episode, EpisodeBatch, Step, gear_details, gear_reweight_stats
from agentcredit.credit.methods.gear import GearSettings
from agentcredit.credit.methods.gear.maths import TURN_HEAD_TOKENS

OBS = None  # an observation token (masked)
TOKENS = [
    (1.0, 5.0), (0.0, 1.0), (0.0, 0.5), (0.0, 0.2), OBS, OBS,
    (0.0, 1.0), (2.0, 1.0), (0.1, 0.5), (0.0, 0.2), OBS, OBS,
    (0.2, 2.0), (0.0, 0.4), (0.0, 0.1),
]  # fmt: skip
MASK = torch.tensor([t is not OBS for t in TOKENS])
TURNS = [[0, 1, 2, 3], [6, 7, 8, 9], [12, 13, 14]]
TURN2 = (1.1 + 0.9 + 0.9) / 3  # A = -1: the segment's last token (w^KL 1), then two at r 0


def scripted(advantage=-1.0, **kwargs):
    rkl = torch.tensor([0.0 if t is OBS else t[0] for t in TOKENS], dtype=torch.float64)
    h = torch.tensor([0.0 if t is OBS else t[1] for t in TOKENS], dtype=torch.float64)
    return gear_details(advantage, rkl, torch.zeros_like(rkl), h, MASK, normalisation="auto", **kwargs)


def turn_means(weights):
    return [float(weights[cols].mean()) for cols in TURNS]


def test_the_defaults_are_the_measured_ones():
    assert TURN_HEAD_TOKENS == 1  # measured (docs/results/gear-segments)
    settings_ = GearSettings()
    assert settings_.turn_head_tokens == TURN_HEAD_TOKENS and settings_.break_at_observation is False


def test_before_issue_48_w_is_one_constant():
    # the paper's scan: the '<' spike (r .5, H 5) opens a segment no later token ends (7.5 is never exceeded),
    # across both observations: w^KL = .5 everywhere, W = .9 + .2 * .5 = 1.0 at A = -1
    d = scripted(turn_head_tokens=0)
    assert d.segments == [(0, 14)] and d.frac_in_segments == 1.0
    assert d.weights[MASK].tolist() == pytest.approx([1.0] * 11)


def test_w_on_the_deviating_turn_differs_from_the_other_turns():
    # defaults: the '<' of turn 0 is its head (keeps its own r .5, opens nothing); 'wrong' (r 1, H 1) opens a
    # segment across the observation, ended by turn 2's '<' (H 2 > 1.5): [7, 12], w^KL = 1. A = -1, W = .9 + .2 w^KL:
    #   turn 0: [1.0, .9, .9, .9] -> .925;   turn 1: [.9, 1.1, 1.1, 1.1] -> 1.05;   turn 2: [1.1, .9, .9] -> .9667
    d = scripted()
    assert d.normalisation == "minmax" and d.trigger_rate == pytest.approx(2 / 11)
    assert d.segments == [(7, 12)] and d.frac_in_segments == pytest.approx(4 / 11)
    assert d.turn.tolist() == [0, 0, 0, 0, -1, -1, 1, 1, 1, 1, -1, -1, 2, 2, 2]
    assert d.weights[MASK].tolist() == pytest.approx([1.0, 0.9, 0.9, 0.9, 0.9, 1.1, 1.1, 1.1, 1.1, 0.9, 0.9])
    assert turn_means(d.weights) == pytest.approx([0.925, 1.05, TURN2])
    # A = +1 mirrors it (W = 1.1 - .2 w^KL): the deviating turn gets the least positive credit
    up = scripted(advantage=1.0)
    assert turn_means(up.weights) == pytest.approx([1.075, 0.95, 2 - TURN2])


def test_ending_segments_at_the_observation_is_an_option():
    # break_at_observation (ours): the segment opened at 'wrong' stops at turn 1's last token; turn 2's '<' keeps r .1
    d = scripted(break_at_observation=True)
    assert d.segments == [(7, 9)]
    assert turn_means(d.weights) == pytest.approx([0.925, 1.05, (0.92 + 0.9 + 0.9) / 3])
    # with the paper's scan of the first tokens, the '<' spike's segment covers turn 0 alone
    d = scripted(break_at_observation=True, turn_head_tokens=0)
    assert d.segments == [(0, 3), (7, 9)]
    assert turn_means(d.weights) == pytest.approx([1.0, 1.05, (0.92 + 0.9 + 0.9) / 3])


def _layout(advantage):
    """The scripted trajectory as the trainers lay it out: three steps on one row, an observation between them."""
    rkl = torch.tensor([[0.0 if t is OBS else t[0] for t in TOKENS]])
    h = torch.tensor([[0.0 if t is OBS else t[1] for t in TOKENS]])
    steps = tuple(Step(0, cols[0], cols[-1] + 1) for cols in TURNS)
    batch = EpisodeBatch(
        (1, 15),
        [Episode("q", 0.0, steps)],
        signals={"student_logp": rkl, "teacher_logp": torch.zeros(1, 15), "entropy": h},
    )
    return batch, torch.where(MASK, advantage, 0.0).unsqueeze(0)


def test_the_layout_reads_turns_off_the_steps_and_logs_w_per_turn():
    # the layout's gathered tokens hold no observation: the turns come from the steps (each step but the last is
    # followed by a tool output); the weights are those of gear_details on the full row
    batch, adv = _layout(-1.0)
    out, stats = gear_reweight_stats(batch, adv, normalisation="auto", turn_head_tokens=1)
    torch.testing.assert_close(out[0], scripted().advantages.float())
    assert stats == pytest.approx(
        {
            "gear/trigger_rate": 2 / 11,
            "gear/frac_in_segments": 4 / 11,
            "gear/clamp_max_share": 0.0,
            "gear/w_turn0/neg": 0.925,
            "gear/w_turn1/neg": 1.05,
            "gear/w_turn2/neg": TURN2,
            "gear/w_turn_spread": 1.05 - 0.925,
            "gear/w_std": float(torch.tensor(scripted().weights[MASK].tolist()).std(correction=0)),
        },
        abs=1e-6,
    )
    # the paper's scan of the first tokens leaves one segment and no spread at all (issue 48's pinned step)
    _, flat = gear_reweight_stats(batch, adv, normalisation="auto", turn_head_tokens=0)
    assert flat["gear/frac_in_segments"] == 1.0 and flat["gear/w_turn_spread"] == pytest.approx(0.0, abs=1e-7)


def test_an_episode_without_tool_turn_ends_is_one_turn():
    # verl's layout names the steps that end tool turns; none here: the three steps are one turn
    batch, adv = _layout(-1.0)
    ep = batch.episodes[0]
    batch.episodes[0] = Episode(ep.group, ep.reward, ep.steps, turn_ends=())
    _, stats = gear_reweight_stats(batch, adv, normalisation="auto", turn_head_tokens=1)
    assert "gear/w_turn1/neg" not in stats and "gear/w_turn_spread" not in stats


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(st.floats(-5, 5, allow_nan=False), st.floats(0, 3, allow_nan=False)),
            min_size=1,
            max_size=8,
        ),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from([-1.5, 1.0]),
    st.integers(0, 2),
)
def test_segments_stay_in_their_turn_and_w_keeps_the_papers_form(turns, advantage, head):
    """With break_at_observation no segment crosses an observation; either way no turn's first ``head`` tokens open
    one, W keeps Eq. 5's form and range, and the layout (steps) gives the weights of the row (mask gaps)."""
    # any episode laid out as steps with an observation token between them
    cols, row_rkl, row_h = [], [], []
    for k, turn in enumerate(turns):
        if k:
            row_rkl.append(0.0), row_h.append(0.0)  # the observation
        cols.append(list(range(len(row_rkl), len(row_rkl) + len(turn))))
        row_rkl += [x for x, _ in turn]
        row_h += [y for _, y in turn]
    width = len(row_rkl)
    mask = torch.zeros(width, dtype=torch.bool)
    for c in cols:
        mask[c] = True
    rkl = torch.tensor(row_rkl, dtype=torch.float64)
    h = torch.tensor(row_h, dtype=torch.float64)
    d = gear_details(
        advantage, rkl, torch.zeros_like(rkl), h, mask, turn_head_tokens=head, break_at_observation=True
    )
    firsts = {c[0] + i for c in cols for i in range(head) if i < len(c)}
    for s, e in d.segments:  # never across an observation, never opened on a turn's head
        assert d.turn[s] == d.turn[e] and bool(mask[s : e + 1].all()) and s not in firsts
    # Eq. 5 with beta = 1 - 0.5 alpha (seed line 129): W in [0.9, 1.1] and W = 1 + 0.2 sign(A) (0.5 - w^KL)
    w = d.weights[mask]
    assert bool((w >= 0.9 - 1e-12).all() and (w <= 1.1 + 1e-12).all())
    sign = 1.0 if advantage > 0 else -1.0
    torch.testing.assert_close(w, 1 + 0.2 * sign * (0.5 - d.w_kl[mask]), rtol=0, atol=1e-12)
    # the same through the layout (steps, no observation in the gathered tokens): identical weights
    steps = tuple(Step(0, c[0], c[-1] + 1) for c in cols)
    batch = EpisodeBatch(
        (1, width),
        [Episode("q", 0.0, steps)],
        signals={
            "student_logp": rkl.unsqueeze(0),
            "teacher_logp": torch.zeros(1, width),
            "entropy": h.unsqueeze(0),
        },
    )
    adv = torch.where(mask, advantage, 0.0).unsqueeze(0).double()
    out, _ = gear_reweight_stats(batch, adv, turn_head_tokens=head, break_at_observation=True)
    torch.testing.assert_close(out[0], d.advantages, rtol=0, atol=1e-12)
