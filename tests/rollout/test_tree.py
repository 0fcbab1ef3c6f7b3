import pytest

from agentcredit.rollout import RolloutTree, Segment


def pol(ids, kind="step"):
    return Segment(ids, role="policy", kind=kind, logprobs=[-0.5] * len(ids), entropies=[1.0] * len(ids))


def obs(ids, transient=False):
    return Segment(ids, role="observation", kind="observation", transient=transient)


def grpo_group():
    tree = RolloutTree(Segment([1, 2], role="prompt"))
    for r in (1.0, 0.0, 1.0):
        leaf = tree.add_path([pol([10, 11]), obs([20]), pol([30])])
        tree.set_reward(leaf, r)
    return tree


def test_group_structure():
    tree = grpo_group()
    assert tree.children(0) == [1, 4, 7]
    assert tree.leaves() == [3, 6, 9]
    assert tree.depth(3) == 3 and tree.depth(0) == 0
    assert tree.path(6) == [0, 4, 5, 6]
    assert tree.paths() == [[0, 1, 2, 3], [0, 4, 5, 6], [0, 7, 8, 9]]
    assert tree.leaves_under(0) == [3, 6, 9] and tree.leaves_under(5) == [6]
    assert tree.rewards() == {3: 1.0, 6: 0.0, 9: 1.0}
    assert tree.parents == [-1, 0, 1, 2, 0, 4, 5, 0, 7, 8]


def test_flatten_masks_only_policy_tokens():
    tree = grpo_group()
    flat = tree.flatten(3)
    assert flat.token_ids == [1, 2, 10, 11, 20, 30]
    assert flat.policy_mask == [False, False, True, True, False, True]
    assert flat.segment_index == [0, 0, 1, 1, 2, 3]
    assert flat.logprobs == [0.0, 0.0, -0.5, -0.5, 0.0, -0.5]


def test_prune_keeps_paths_of_surviving_leaves():
    tree = RolloutTree(Segment([1], role="prompt"))
    a = tree.add(pol([2]), 0)
    b = tree.add(pol([3]), a)
    c = tree.add(pol([4]), a)
    d = tree.add(pol([5]), 0)
    for leaf in (b, c, d):
        tree.set_reward(leaf, 1.0)
    pruned, mapping = tree.prune([c])
    assert len(pruned) == 3
    assert mapping == {0: 0, a: 1, c: 2}
    assert pruned.flatten(2).token_ids == [1, 2, 4]
    assert pruned.rewards() == {2: 1.0}


def test_training_views_drop_replaced_observation():
    # prompt, invoke, raw output (transient), assimilate, commit  -> carl-segment replacement mode
    tree = RolloutTree(Segment([1], role="prompt"))
    leaf = tree.add_path(
        [pol([2], "invoke"), obs([3, 3], transient=True), pol([4], "assimilate"), pol([5], "commit")]
    )
    tree.set_reward(leaf, 1.0)
    with pytest.raises(ValueError, match="transient"):
        tree.flatten(leaf)
    v1, v2 = tree.training_views(leaf)
    assert v1.token_ids == [1, 2, 3, 3, 4] and v1.policy_mask == [False, True, False, False, True]
    assert v2.token_ids == [1, 2, 4, 5] and v2.policy_mask == [False, False, False, True]


def test_training_views_without_transient_is_flatten():
    tree = grpo_group()
    (view,) = tree.training_views(3)
    assert view == tree.flatten(3)


def test_roundtrip_dict():
    tree = grpo_group()
    again = RolloutTree.from_dict(tree.to_dict())
    assert again.parents == tree.parents and again.rewards() == tree.rewards()
    assert again.flatten(6) == tree.flatten(6)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: Segment([1, 2], logprobs=[0.0]), "logprobs"),
        (lambda: Segment([1], role="oops"), "role"),
        (lambda: Segment([1], role="observation", logprobs=[0.0]), "policy segments"),
    ],
)
def test_bad_segments(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_bad_tree_operations():
    tree = grpo_group()
    with pytest.raises(ValueError, match="not a node"):
        tree.add(pol([1]), 99)
    with pytest.raises(ValueError, match="has children"):
        tree.set_reward(1, 1.0)
    with pytest.raises(ValueError, match="finite"):
        tree.set_reward(3, float("nan"))
    t2 = RolloutTree(Segment([1], role="prompt"))
    t2.add(pol([2]), 0)
    with pytest.raises(ValueError, match="no reward"):
        t2.rewards()
