"""Tree validation shared by carl-critical and portool (agentcredit/credit/_tree.py): clear ValueErrors."""

import pytest
import torch

from agentcredit.credit import critical_action_advantages, portool_advantages


def critical(parents, rewards):
    return critical_action_advantages(parents, rewards)


def portool(parents, rewards):
    n = len(parents) if isinstance(parents, list | tuple) else 3
    return portool_advantages(parents, [0] + [5] * (n - 1), rewards, [0.0] * n)


ESTIMATORS = [pytest.param(critical, id="carl-critical"), pytest.param(portool, id="portool")]


@pytest.mark.parametrize("estimate", ESTIMATORS)
@pytest.mark.parametrize(
    ("parents", "rewards", "match"),
    [
        ([-1, 0, -1], {1: 1.0, 2: 0.0}, r"more than one root: nodes \[0, 2\]"),
        ([0, -1, 1], {2: 1.0}, r"parents\[0\] must be -1"),
        ([-1, 0, 3, 2], {1: 1.0}, "cycle not connected to the root: 2 -> 3 -> 2"),
        ([-1, 0, 3, 4, 3], {1: 1.0}, "cycle not connected to the root: 3 -> 4 -> 3 "),
        ([-1, 0, 2], {1: 1.0}, r"parents\[2\] = 2: a node cannot be its own parent"),
        ([-1, 0, 5], {1: 1.0, 2: 0.0}, r"parents\[2\] = 5 is not a node id"),
        ([-1, 0, -3], {1: 1.0, 2: 0.0}, r"parents\[2\] = -3 is not a node id"),
        ([-1], {}, "at least one action node"),
        ([-1, 0, 0.5], {1: 1.0}, r"parents\[2\] must be an int"),
        ("abc", {}, "sequence of ints"),
        ([-1, 0, 0], {1: 1.0}, r"no value for leaf/leaves \[2\]"),
        ([-1, 0, 1], {1: 1.0, 2: 0.0}, r"\[1\]: node 1 is not a leaf"),
        ([-1, 0, 0], {0: 1.0, 1: 1.0, 2: 0.0}, r"\[0\]: node 0 is not a leaf"),
        ([-1, 0, 0], {1: 1.0, 2: 0.0, 7: 1.0}, r"7 is not a node id"),
        ([-1, 0, 0], {1: 1.0, 2: float("nan")}, r"\[2\] must be finite"),
        ([-1, 0, 0], {1: float("inf"), 2: 0.0}, r"\[1\] must be finite"),
        ([-1, 0, 0], {1: 1.0, "2": 0.0}, "must be an int"),
        ([-1, 0, 0], [1.0, 0.0], "must be a mapping"),
    ],
)
def test_bad_trees(estimate, parents, rewards, match):
    with pytest.raises(ValueError, match=match):
        estimate(parents, rewards)


def test_error_names_the_argument():
    with pytest.raises(ValueError, match="leaf_rewards"):
        critical([-1, 0, 0], {1: 1.0})
    with pytest.raises(ValueError, match="leaf_outcomes"):
        portool([-1, 0, 0], {1: 1.0})


def test_tensor_and_numpy_like_parents():
    values, adv, _ = critical_action_advantages(
        torch.tensor([-1, 0, 0]), {torch.tensor(1).item(): 1.0, 2: 0.0}
    )
    assert adv == [0.0, 0.5, -0.5] and values[0] == 0.5
    with pytest.raises(ValueError, match="1-D integer"):
        critical_action_advantages(torch.tensor([-1.0, 0.0]), {1: 1.0})


def test_a_decision_tree_built_directly_is_checked_when_its_structure_is_read():
    """issue 37: one tree type for the credit layer. The layout's DecisionTree is the tree the estimators walk: built
    directly (as the layout builders do) it runs parse_tree's checks on the first read of its structure."""
    from agentcredit.credit import DecisionTree
    from agentcredit.credit._tree import parse_tree

    tree = DecisionTree((-1, 0, 1, 1, 0), {1: 2})
    assert tree.children == ((1, 4), (2, 3), (), (), ())
    assert tree.depth == (0, 1, 2, 2, 1) and tree.order == (0, 1, 4, 2, 3) and tree.leaves == (2, 3, 4)
    assert tree.path(3) == [1, 3] and tree.leaves_under()[1] == [2, 3]
    bad = DecisionTree((-1, 0, 3, 2))  # building never raises; reading the structure does
    with pytest.raises(ValueError, match="cycle not connected to the root: 2 -> 3 -> 2"):
        _ = bad.children
    assert isinstance(parse_tree(torch.tensor([-1, 0, 0]), "p"), DecisionTree)
