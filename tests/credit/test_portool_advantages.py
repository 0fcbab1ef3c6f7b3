"""portool_advantages: Eq. 2 step rewards with adaptive G, A_trj, A_fork, Theorem 3.1 weights (spec Sec. 3)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.credit import grpo_advantages, portool_advantage_terms, portool_advantages

# Spec Sec. 3.9: 0 root; 1 A; 2 A1; 3 A2; 4 A2a; 5 B; 6 B1; 7 C; 8 C1; 9 C1a
PARENTS = [-1, 0, 1, 1, 3, 0, 5, 0, 7, 8]
LENGTHS = [0, 50, 40, 60, 30, 50, 40, 70, 50, 30]
FORMAT = [0.0, 0.25, 0.25, -0.025, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25]
OUTCOMES = {2: 1.0, 4: -1.0, 6: 0.0, 9: 1.0}  # tau1..tau4
# the spec's worked example (Sec. 3.9) counts the root as a fork; the paper's default (root_is_fork=False, its fork
# set starts at t = 1) is tested in test_root_is_not_a_fork_by_default
SPEC = {"root_is_fork": True}


def example():
    return portool_advantage_terms(PARENTS, LENGTHS, OUTCOMES, FORMAT, **SPEC)


def test_worked_example_step_rewards_and_fork_advantages():
    t = example()
    assert t.trajectory_lengths == {2: 90, 4: 140, 6: 90, 9: 150}
    assert t.forks == (0, 1) and t.n_forks == 2
    rounded = [round(x, 4) for x in t.step_rewards]
    assert rounded == [0.0, 1.2, 1.25, -0.975, -0.75, 0.25, 0.25, 1.1525, 1.2, 1.25]
    assert t.aggregation[0] == "max" and t.aggregation[1] == "max"
    assert all(t.aggregation[p] == "avg" for p in (3, 5, 7, 8))  # only children
    fork = {1: 0.6211, 5: -1.1536, 7: 0.5324, 2: 0.7071, 3: -0.7071, 6: 0.0, 8: 0.0, 4: 0.0, 9: 0.0}
    for node, value in fork.items():
        assert round(t.fork_advantages[node], 4) == value, node
    assert [round(t.trajectory_advantages[k], 4) for k in (2, 4, 6, 9)] == [0.7833, -1.3056, -0.2611, 0.7833]


def test_worked_example_advantages_to_four_decimals():
    adv = portool_advantages(PARENTS, LENGTHS, OUTCOMES, FORMAT, **SPEC)
    expected = {
        2: [0.1116, 2.3743],
        4: [0.3186, -2.9555, -1.3056],
        6: [-1.6454, -0.2611],
        9: [1.5439, 0.7833, 0.7833],
    }
    assert {k: [round(a, 4) for a in v] for k, v in adv.items()} == expected


def test_worked_example_exact_weights_and_invariant():
    t = example()
    assert t.w2[2] == pytest.approx([4 * 90 / (2 * 50 * 3 * 2), 4 * 90 / (1 * 40 * 2 * 2)], abs=1e-15)
    assert t.w2[4] == pytest.approx([4 * 140 / (2 * 50 * 3 * 2), 4 * 140 / (1 * 60 * 2 * 2), 0.0], abs=1e-15)
    # spec: (1/(4*90)) * 0.6 + (1/(4*140)) * 0.9333 = 1/300 = 1/(2*3*50)
    assert t.w2[2][0] / (4 * 90) + t.w2[4][0] / (4 * 140) == pytest.approx(1 / 300, abs=1e-15)
    # exact recomputation of A_trj and the first step of tau1 from the definitions
    r = [1.0, -1.0, 0.0, 1.0]
    mean = sum(r) / 4
    std = math.sqrt(sum((x - mean) ** 2 for x in r) / 3)
    a_trj = [(x - mean) / (std + 1e-6) for x in r]
    sib = [1.2, 0.25, 0.9025 + 0.25]
    m = sum(sib) / 3
    s = math.sqrt(sum((x - m) ** 2 for x in sib) / 2)
    a_fork_a = (1.2 - m) / (s + 1e-6)
    assert t.advantages[2][0] == pytest.approx((a_trj[0] + a_trj[1]) / 2 + 0.6 * a_fork_a, abs=1e-12)


def test_split_min_terms_add_up():
    t = example()
    for leaf, adv in t.advantages.items():
        total = [a + b for a, b in zip(t.trajectory_terms[leaf], t.fork_terms[leaf], strict=True)]
        assert adv == pytest.approx(total, abs=1e-15)


def _tie_tree(format_y):
    # root -> X -> {X1 (+1, T=2), X2 (-1, T=2)};  root -> Y -> {Y1 (+1, T=2), Y2 -> Y2a (+1, T=3)}
    parents = [-1, 0, 1, 1, 0, 4, 4, 6]
    lengths = [0, 10, 10, 10, 10, 10, 10, 10]
    fm = [0.0, 0.25, 0.25, 0.25, format_y, 0.25, 0.25, 0.25]
    outcomes = {2: 1.0, 3: -1.0, 5: 1.0, 7: 1.0}
    return parents, lengths, outcomes, fm


def test_tie_example_uses_avg():
    t = portool_advantage_terms(*_tie_tree(0.25), **SPEC)
    assert t.aggregation[0] == "avg"
    assert t.step_rewards[1] == pytest.approx(0.25, abs=1e-12)  # (1.2 - 0.7) / 2
    assert t.step_rewards[4] == pytest.approx(1.17625, abs=1e-12)  # (1.2 + 1.1525) / 2, Y preferred
    assert t.fork_advantages[4] > 0 > t.fork_advantages[1]


def test_tie_example_mix2_differs():
    # Y's R_fm = 0: PORTool sees maxima 1.2 vs 0.95 and uses max; mix2 sees equal outcome maxima and averages
    portool = portool_advantage_terms(*_tie_tree(0.0))
    mix2 = portool_advantage_terms(*_tie_tree(0.0), aggregator="mix2")
    assert portool.aggregation[0] == "max" and mix2.aggregation[0] == "avg"
    assert portool.step_rewards[4] == pytest.approx(0.95, abs=1e-12)
    assert mix2.step_rewards[4] == pytest.approx((0.95 + 0.9025) / 2 + 0.0, abs=1e-12)
    assert mix2.step_rewards[1] == pytest.approx((0.95 - 0.95) / 2 + 0.25, abs=1e-12)


def test_fixed_aggregators_and_w2_presets():
    t_max = portool_advantage_terms(*_tie_tree(0.25), aggregator="max")
    t_avg = portool_advantage_terms(*_tie_tree(0.25), aggregator="avg")
    assert t_max.step_rewards[1] == pytest.approx(1.2) and t_avg.step_rewards[1] == pytest.approx(0.25)
    traj_only = portool_advantage_terms(PARENTS, LENGTHS, OUTCOMES, FORMAT, w2_mode="zero", **SPEC)
    no_scale = portool_advantage_terms(PARENTS, LENGTHS, OUTCOMES, FORMAT, w2_mode="one", **SPEC)
    fork_only = portool_advantage_terms(PARENTS, LENGTHS, OUTCOMES, FORMAT, w1=0.0, **SPEC)
    full = example()
    for leaf in full.advantages:
        assert traj_only.advantages[leaf] == full.trajectory_terms[leaf]
        assert fork_only.advantages[leaf] == pytest.approx(full.fork_terms[leaf], abs=1e-15)
        expected = [
            trj + (1.0 if w > 0 else 0.0) * full.fork_advantages[v]
            for trj, w, v in zip(full.trajectory_terms[leaf], full.w2[leaf], full.paths[leaf], strict=True)
        ]
        assert no_scale.advantages[leaf] == pytest.approx(expected, abs=1e-15)


def test_gamma_zero_drops_outcome():
    t = portool_advantage_terms(PARENTS, LENGTHS, OUTCOMES, FORMAT, gamma=0.0)
    assert t.step_rewards[1:] == pytest.approx(FORMAT[1:])  # only R_fm remains, leaves included


def test_root_is_fork_switch():
    literal = portool_advantage_terms(PARENTS, LENGTHS, OUTCOMES, FORMAT, root_is_fork=False)
    assert literal.forks == (1,)
    assert literal.fork_advantages[1] == literal.fork_advantages[5] == 0.0
    assert literal.w2[2][1] == pytest.approx(4 * 90 / (1 * 40 * 2 * 1))


def test_root_is_not_a_fork_by_default():
    """The paper's fork set F(q) = {s_kt : |C(s_kt)| > 1, t in [T_k]} (portool.txt l. 536) holds steps only, so
    by default the query is no fork: first steps get no fork term and N_forks counts A alone (the spec's [R]
    8.6 counted the root; the paper wins). Fails on the old default (root_is_fork=True)."""
    default = portool_advantage_terms(PARENTS, LENGTHS, OUTCOMES, FORMAT)
    assert default.forks == (1,) and default.n_forks == 1
    assert [w[0] for w in default.w2.values()] == [0.0, 0.0, 0.0, 0.0]  # no first step has a fork term
    # tau1's first step: the trajectory term alone, (A_trj(tau1) + A_trj(tau2)) / 2 = (0.7833 - 1.3056) / 2
    assert round(default.advantages[2][0], 4) == -0.2611
    # its second step A1 under the fork A: w2 = 4 * 90 / (1 * 40 * 2 * 1) = 4.5 times A_fork(A1) = 0.7071
    assert default.advantages[2][1] == pytest.approx(
        default.trajectory_terms[2][1] + 4.5 * 0.70710678, abs=1e-5
    )
    from agentcredit.credit.methods.portool import PortoolNativeSettings as PortoolConfig

    assert PortoolConfig().root_is_fork is False


@st.composite
def portool_trees(draw, max_nodes=14):
    n = draw(st.integers(2, max_nodes))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    has_child = set(parents[1:])
    leaves = [i for i in range(1, n) if i not in has_child]
    outcomes = {leaf: draw(st.sampled_from([1.0, -1.0, 0.0])) for leaf in leaves}
    lengths = [0] + [draw(st.integers(1, 60)) for _ in range(1, n)]
    fm = [0.0] + [draw(st.sampled_from([-0.25, 0.0, 0.1, 0.25])) for _ in range(1, n)]
    return parents, lengths, outcomes, fm


@settings(max_examples=60, deadline=None)
@given(portool_trees(), st.booleans())
def test_weight_invariant_section_3_8(tree, root_is_fork):
    parents, lengths, outcomes, fm = tree
    t = portool_advantage_terms(parents, lengths, outcomes, fm, root_is_fork=root_is_fork)
    n = len(t.advantages)
    copies: dict[int, float] = {}
    for leaf, path in t.paths.items():
        for v, w2 in zip(path, t.w2[leaf], strict=True):
            copies[v] = copies.get(v, 0.0) + w2 / (n * t.trajectory_lengths[leaf])
    n_children = {p: parents[1:].count(p) for p in set(parents[1:])}
    for v, total in copies.items():
        p = parents[v]
        if p in t.forks:
            assert total == pytest.approx(1.0 / (t.n_forks * n_children[p] * lengths[v]), rel=1e-9, abs=0)
        else:
            assert total == 0.0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from([1.0, -1.0, 0.0]), min_size=1, max_size=8), st.integers(0, 3), st.data())
def test_no_forks_below_root_equals_grpo(outcomes, chain, data):
    # w1 = 1, the literal N_forks (root_is_fork=False) and chains below the root: the trajectory term only
    parents, leaves = [-1], []
    for _ in outcomes:
        prev = 0
        for _ in range(chain + 1):
            parents.append(prev)
            prev = len(parents) - 1
        leaves.append(prev)
    lengths = [0] + data.draw(
        st.lists(st.integers(1, 30), min_size=len(parents) - 1, max_size=len(parents) - 1)
    )
    fm = [0.0] + data.draw(
        st.lists(st.floats(-0.25, 0.25), min_size=len(parents) - 1, max_size=len(parents) - 1)
    )
    adv = portool_advantages(
        parents, lengths, dict(zip(leaves, outcomes, strict=True)), fm, root_is_fork=False
    )
    grpo = grpo_advantages(torch.tensor(outcomes, dtype=torch.float64), [0] * len(outcomes)).tolist()
    for leaf, g in zip(leaves, grpo, strict=True):
        assert adv[leaf] == pytest.approx([g] * (chain + 1), abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(portool_trees(), st.sampled_from([1.0, -1.0, 0.0]), st.sampled_from([-0.25, 0.1]))
def test_all_equal_rewards_give_zero(tree, outcome, fmt):
    # Spec Sec. 9.4 item 5. It holds exactly when all trajectories have the same length in steps (or R_out = 0):
    # otherwise gamma^(T_k - t) differs between siblings and the fork term is legitimately non-zero; the
    # trajectory term is zero in every case.
    parents, lengths, outcomes, _ = tree
    same = dict.fromkeys(outcomes, outcome)
    t = portool_advantage_terms(parents, lengths, same, [fmt] * len(parents))
    depth_equal = len({_depth(parents, leaf) for leaf in outcomes}) == 1
    for leaf, values in t.advantages.items():
        assert t.trajectory_terms[leaf] == [0.0] * len(values)
        if depth_equal or outcome == 0.0:
            assert values == pytest.approx([0.0] * len(values), abs=1e-12)


def _depth(parents, node):
    d = 0
    while node != 0:
        node, d = parents[node], d + 1
    return d


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"step_lengths": LENGTHS[:-1]}, "step_lengths has 9 entries"),
        ({"step_lengths": [0, 0] + LENGTHS[2:]}, r"step_lengths\[1\] = 0"),
        ({"step_lengths": [0, 1.5] + LENGTHS[2:]}, r"step_lengths\[1\] must be an int"),
        ({"format_rewards": FORMAT[:-1]}, "format_rewards has 9 entries"),
        ({"format_rewards": [0.0, float("nan")] + FORMAT[2:]}, r"format_rewards\[1\] must be finite"),
        ({"leaf_outcomes": {2: 1.0, 4: -1.0, 6: 0.0}}, r"no value for leaf/leaves \[9\]"),
        ({"leaf_outcomes": {2: 1.0, 4: -1.0, 6: 0.0, 9: float("nan")}}, r"leaf_outcomes\[9\] must be finite"),
        ({"aggregator": "median"}, "aggregator must be one of"),
        ({"w2_mode": "two"}, "w2_mode must be one of"),
        ({"gamma": 1.2}, "gamma must lie"),
    ],
)
def test_bad_input(change, match):
    args = {
        "parents": PARENTS,
        "step_lengths": LENGTHS,
        "leaf_outcomes": OUTCOMES,
        "format_rewards": FORMAT,
    }
    kwargs = {k: v for k, v in change.items() if k not in args}
    args.update({k: v for k, v in change.items() if k in args})
    with pytest.raises(ValueError, match=match):
        portool_advantages(**args, **kwargs)


def test_decay_favours_shorter_successes_and_longer_failures():
    """Eq. 2 as the paper writes it: gamma^(T_k - t) * R_out. With R_out = -1 the decay shrinks the penalty of a
    step the further its trajectory runs on, so under a fork where every trajectory fails, the step that answers
    gets a negative fork advantage and the step that searches on a positive one, though the outcomes are equal
    (GRPO gives both zero). The z-score turns the 0.0975 gap into +-0.7071. This is the likely cause of the
    kb-jsoncall-portool study's PORTool seed 0 searching up to the step cap and answering nothing (docs/results/
    kb-jsoncall-portool/README.md): at its start most training outcomes are -1. With R_out = +1 the order flips.

    0 query -> 1 search (40 tok) -> 2 response_gen (30 tok, leaf, T = 2)
                                 -> 3 search (40) -> 4 search (40) -> 5 search (40, cap reached, leaf, T = 4)
    """
    parents = [-1, 0, 1, 1, 3, 4]
    lengths = [0, 40, 30, 40, 40, 40]
    fmt = [0.0] + [0.25] * 5
    fail = portool_advantage_terms(parents, lengths, {2: -1.0, 5: -1.0}, fmt)
    assert fail.forks == (1,)  # the root has one child: no fork there
    assert fail.aggregation[1] == "max"
    assert fail.step_rewards[2] == pytest.approx(-1.0 + 0.25)  # gamma^0 * -1 + R_fm
    assert fail.step_rewards[3] == pytest.approx(-(0.95**2) + 0.25)  # -0.9025 + 0.25: two steps further on
    assert fail.trajectory_advantages == {2: 0.0, 5: 0.0}
    assert round(fail.fork_advantages[2], 4) == -0.7071 and round(fail.fork_advantages[3], 4) == 0.7071
    # w2 = n |tau| / (|m(v)| |s_v| |C(p)| N_forks): 2*70/(1*30*2*1) for the answer, 2*160/(1*40*2*1) for the search
    assert fail.w2[2] == pytest.approx([0.0, 140 / 60])
    assert [round(a, 4) for a in fail.advantages[2]] == [0.0, -1.6499]
    assert [round(a, 4) for a in fail.advantages[5]] == [0.0, 2.8284, 0.0, 0.0]

    win = portool_advantage_terms(parents, lengths, {2: 1.0, 5: 1.0}, fmt)
    assert round(win.fork_advantages[2], 4) == 0.7071 and round(win.fork_advantages[3], 4) == -0.7071
