import torch

from agentcredit.config import load_config
from agentcredit.rollout.tree import RolloutTree, Segment
from agentcredit.train.advantages import episode_batch
from agentcredit.train.batch import actions_per_question, build_batch, segment_spans
from agentcredit.train.signals import Signals


def pol(ids, kind="step"):
    return Segment(ids, role="policy", kind=kind, logprobs=[-0.5] * len(ids), entropies=[1.0] * len(ids))


def test_replacement_episode_becomes_two_rows_with_each_policy_token_once():
    tree = RolloutTree(Segment([1, 2], role="prompt"))
    leaf = tree.add_path(
        [
            pol([10, 11], "invoke"),
            Segment([20, 21], role="observation", transient=True),
            pol([30], "assimilate"),
            pol([40], "commit"),
        ]
    )
    tree.set_reward(leaf, 1.0)
    batch = build_batch([tree], pad_id=0)
    (traj,) = batch.trajectories
    assert traj.rows == [0, 1] and traj.reward == 1.0 and traj.policy_nodes == [1, 3, 4]
    assert batch.input_ids[0].tolist() == [1, 2, 10, 11, 20, 21, 30]
    assert batch.input_ids[1, :6].tolist() == [1, 2, 10, 11, 30, 40]  # the raw output is gone
    assert batch.policy_mask.sum() == 4  # 10, 11, 30 in the first view; 40 in the second
    assert batch.row_traj.tolist() == [0, 0]
    assert segment_spans(batch, traj) == [(0, 2, 3), (0, 6, 6), (1, 5, 5)]
    # the estimators' layout: the trajectory's policy tokens in temporal order across its rows
    layout = episode_batch(load_config("ppo-arith-tools").algorithm, batch, [tree], Signals())
    ((rows, cols),) = layout.token_index()
    assert [int(batch.input_ids[r, c]) for r, c in zip(rows, cols, strict=True)] == [10, 11, 30, 40]
    values = torch.arange(batch.input_ids.numel(), dtype=torch.float32).view(batch.input_ids.shape)
    gathered, mask = layout.gather(values, layout.token_index())
    back = layout.scatter(gathered, layout.token_index())
    assert torch.equal(back[batch.policy_mask], values[batch.policy_mask]) and mask.all()
    assert torch.equal(layout.trained_mask(), batch.policy_mask)


def test_select_trims_padding_and_keeps_rows():
    tree = RolloutTree(Segment([1], role="prompt"))
    for n in (1, 5):
        tree.set_reward(tree.add(pol(list(range(2, 2 + n))), 0), 0.0)
    batch = build_batch([tree])
    assert batch.input_ids.shape == (2, 6)
    sub = batch.select([0])
    assert sub.input_ids.shape == (1, 2) and sub.input_ids[0].tolist() == [1, 2]


def test_actions_per_question_counts_a_shared_action_once():
    # question 0: action a1, then two continuations a2 and b2 after the same observation (3 distinct actions,
    # though each of the 2 trajectories holds 2); question 1: one action. Worked by hand: (3 + 1) / 2 = 2.0.
    first = RolloutTree(Segment([1, 2], role="prompt"))
    a1 = first.add(pol([10, 11]), 0)
    state = first.add(Segment([20], role="observation"), a1)
    first.set_reward(first.add(pol([12]), state), 1.0)
    b2 = first.add(pol([13, 14]), state)
    first.set_reward(b2, 0.0)
    second = RolloutTree(Segment([1], role="prompt"))
    second.set_reward(second.add(pol([15]), 0), 0.0)
    batch = build_batch([first, second])
    assert actions_per_question(batch, batch.policy_mask) == 2.0
    # only b2 in the update set: 1 action for question 0, none for question 1
    only_b2 = batch.policy_mask & (batch.segment_ids == b2)
    assert actions_per_question(batch, only_b2) == 0.5
