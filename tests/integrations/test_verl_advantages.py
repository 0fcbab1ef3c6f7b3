"""The advantage adapter on a synthetic verl batch equals agentcredit's credit functions on the same episodes.

The batch is built the way verl builds it: each row is a verl ``AgentLoopOutput`` (made from
:func:`episode_rows`, as the agent loop does), stored with verl's ``list_of_dict_to_tensordict`` (TransferQueue's
layout: nested per-row tensors, ``extra_fields`` as non-tensor data), read back by the trainer's
``fields_to_dataproto`` into a ``DataProto``. The expected advantages are computed from the hand-written
episode descriptions (not from the adapter's records) by calling the credit functions directly; carl-segment
and carl-critical are also checked against hand-worked numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("verl")

from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput  # noqa: E402
from verl.utils.tensordict_utils import list_of_dict_to_tensordict  # noqa: E402
from verl.utils.torch_functional import masked_whiten  # noqa: E402

from agentcredit.credit import (  # noqa: E402
    critical_action_advantages,
    gae_advantages,
    gear_advantages,
    gigpo_advantages,
    grpo_advantages,
    policy_loss,
    portool_advantages,
    segment_advantages,
    tips_batch_alpha,
    tips_token_rewards,
    tips_turn_rewards,
)
from agentcredit.credit.methods import BUILT_IN  # noqa: E402
from agentcredit.integrations.verl.advantages import apply_to_dataproto, teacher_call_metrics  # noqa: E402
from agentcredit.integrations.verl.episode import EpisodeResult, episode_rows  # noqa: E402
from agentcredit.integrations.verl.fields import RowRecord  # noqa: E402
from agentcredit.integrations.verl.settings import load_settings  # noqa: E402
from agentcredit.integrations.verl.trainer import fields_to_dataproto  # noqa: E402
from agentcredit.rollout.tree import RolloutTree, Segment  # noqa: E402

pytestmark = pytest.mark.verl

PROMPT_LEN = 6


@dataclass
class Ep:
    """A hand-described episode: segments as (role, kind, n_tokens, transient)."""

    uid: str
    segs: list[tuple[str, str, int, bool]]
    outcome: float
    potentials: list[float] | None = None
    fmt: list[float] | None = None  # per policy segment (portool)


def _views_by_hand(ep: Ep) -> list[tuple[list[int], list[tuple[int, int, int]]]]:
    """(response segment indices, trained (start, end, k)) per view, written from the replacement rule."""
    views, visible, trained, pending = [], [], [], None
    k = -1
    for i, (role, _, _, transient) in enumerate(ep.segs):
        visible.append(i)
        if role == "policy":
            k += 1
            trained.append((i, k))
            if pending is not None:
                views.append((list(visible), list(trained)))
                visible.remove(pending)
                trained, pending = [], None
        elif transient:
            pending = i
    if trained or not views:
        views.append((visible, trained))
    out = []
    for vis, tr in views:
        offsets, pos = {}, 0
        for i in vis:
            offsets[i] = (pos, pos + ep.segs[i][2])
            pos += ep.segs[i][2]
        out.append((vis, [(offsets[i][0], offsets[i][1], k) for i, k in tr]))
    return out


def _tree(ep: Ep, rng: torch.Generator) -> EpisodeResult:
    tree = RolloutTree(Segment(list(range(100, 100 + PROMPT_LEN)), role="prompt"))
    node = 0
    for role, kind, n, transient in ep.segs:
        ids = torch.randint(0, 50, (n,), generator=rng).tolist()
        if role == "policy":
            logprobs = (-torch.rand(n, generator=rng)).tolist()
            node = tree.add(Segment(ids, role="policy", kind=kind, logprobs=logprobs), node)
        else:
            node = tree.add(Segment(ids, role="observation", kind=kind, transient=transient), node)
    k = 0
    for i in tree.path(node):
        if tree.segment(i).is_policy:
            if ep.fmt is not None:
                tree.segment(i).info["format_reward"] = ep.fmt[k]
            k += 1
    return EpisodeResult(tree, node, "ans", PROMPT_LEN)


@dataclass
class Batch:
    proto: object
    eps: list[Ep]
    row_of: list[tuple[int, int]]  # row -> (episode index, view)
    values: torch.Tensor
    entropy: torch.Tensor
    rollout_lp: torch.Tensor
    teacher: torch.Tensor
    mask: torch.Tensor


def build_batch(
    eps: list[Ep], seed: int = 0, with_teacher: bool = False, values_at: dict | None = None
) -> Batch:
    rng = torch.Generator().manual_seed(seed)
    fields, row_of = [], []
    for e, ep in enumerate(eps):
        episode = _tree(ep, rng)
        n_views = len(_views_by_hand(ep))
        teacher = None
        if with_teacher:
            teacher = [
                (-2 * torch.rand(len(v.token_ids) - PROMPT_LEN, generator=rng)).tolist()
                for v in episode.tree.training_views(episode.leaf)
            ]
        rows = episode_rows(
            episode, ep.outcome, potentials=ep.potentials, teacher=teacher, episode_id=f"ep{e}"
        )
        assert len(rows) == n_views
        for v, row in enumerate(rows):
            out = AgentLoopOutput(
                prompt_ids=list(range(100, 100 + PROMPT_LEN)),
                response_ids=row.response_ids,
                response_mask=row.response_mask,
                response_logprobs=row.response_logprobs,
                reward_score=ep.outcome,
                num_turns=len(ep.segs) + 1,
                metrics=AgentLoopMetrics(),
                extra_fields={"agentcredit": row.record.model_dump(), "turn_scores": [], "tool_rewards": []},
            )
            d = out.as_dict()
            n = len(row.response_ids)
            # what the trainer has written to TransferQueue by the advantage step (response-aligned, nested)
            d["values"] = torch.rand(n, generator=rng)
            d["old_log_probs"] = -torch.rand(n, generator=rng)
            d["entropy"] = 3 * torch.rand(n, generator=rng)
            d["uid"] = ep.uid
            fields.append(d)
            row_of.append((e, v))
    for (row, pos), value in (values_at or {}).items():
        fields[row]["values"][pos] = value
    keep = ["uid", "responses", "response_mask", "old_log_probs", "entropy", "values", "rollout_log_probs"]
    keep.append("extra_fields")
    td = list_of_dict_to_tensordict([{k: f[k] for k in keep} for f in fields])
    proto = fields_to_dataproto(td)
    b = proto.batch
    teacher = torch.zeros_like(b["values"])
    if with_teacher:
        for r, rec in enumerate(proto.non_tensor_batch["agentcredit"]):
            tl = rec["teacher_logprobs"]
            teacher[r, : len(tl)] = torch.tensor(tl)
    return Batch(
        proto,
        eps,
        row_of,
        b["values"].clone(),
        b["entropy"].clone(),
        b["rollout_log_probs"].clone(),
        teacher,
        b["response_mask"].clone(),
    )


def settings(method: str, **extra):
    return load_settings({"method": method, **extra})


def search_ep(uid, outcome, n_turns=1, lengths=(5, 4, 7), potentials=None, fmt=None):
    segs = []
    for _ in range(n_turns):
        segs += [("policy", "search", lengths[0], False), ("observation", "information", lengths[1], False)]
    segs.append(("policy", "answer", lengths[2], False))
    return Ep(uid, segs, outcome, potentials=potentials, fmt=fmt)


def _trained(batch: Batch, r: int) -> list[tuple[int, int, int]]:
    e, v = batch.row_of[r]
    return _views_by_hand(batch.eps[e])[v][1]


# ------------------------------------------------------------------------------------------------ tests
def test_batch_layout_matches_the_hand_description():
    eps = [search_ep("p0", 1.0), search_ep("p0", 0.0, n_turns=2, lengths=(3, 6, 2))]
    b = build_batch(eps)
    for r in range(len(b.row_of)):
        expected = torch.zeros(b.mask.shape[1], dtype=torch.long)
        for s, t, _ in _trained(b, r):
            expected[s:t] = 1
        assert torch.equal(b.mask[r].long(), expected)


def test_grpo_equals_grpo_advantages():
    eps = [
        search_ep("p0", 1.0),
        search_ep("p0", 0.0, 2),
        search_ep("p0", 1.0, 0),
        search_ep("p1", 0.0),
        search_ep("p1", 1.0),
        search_ep("p2", 1.0),
    ]
    b = build_batch(eps)
    _, res = apply_to_dataproto(b.proto, settings("grpo"))
    per_ep = grpo_advantages(torch.tensor([e.outcome for e in eps]), [e.uid for e in eps])
    expected = per_ep[[e for e, _ in b.row_of]].unsqueeze(1) * b.mask
    torch.testing.assert_close(b.proto.batch["advantages"], expected.float())
    torch.testing.assert_close(b.proto.batch["returns"], expected.float())
    # hand check: p0 = (1, 0, 1) -> mean 2/3, unbiased std sqrt(1/3); a lone p2 episode gets 0
    assert float(per_ep[0]) == pytest.approx((1 - 2 / 3) / (math.sqrt(1 / 3) + 1e-6), rel=1e-6)
    assert float(per_ep[5]) == 0.0
    assert res.metrics["agentcredit/episodes"] == 6


def test_gigpo_equals_gigpo_advantages_on_the_same_anchors():
    # the native trainer's anchor: the context before a step. In a verl row that is the prompt (one per uid) and
    # the response tokens before the step, so every first step of a group shares one anchor and the later steps
    # here (random, different tokens per episode) are alone in theirs.
    eps = [search_ep("p0", 1.0), search_ep("p0", 0.0, 2), search_ep("p0", 1.0, 0), search_ep("p1", 1.0)]
    b = build_batch(eps)
    _, res = apply_to_dataproto(b.proto, settings("gigpo", gigpo={"gamma": 0.9, "step_weight": 0.5}))
    records = b.proto.non_tensor_batch["agentcredit"]
    policy = [[sp for sp in records[r]["spans"] if sp["role"] == "policy"] for r in range(len(eps))]
    anchors = [["first"] + [f"ep{r}-{k}" for k in range(1, len(spans))] for r, spans in enumerate(policy)]
    steps = gigpo_advantages(
        [e.outcome for e in eps], [e.uid for e in eps], anchors, gamma=0.9, step_weight=0.5
    )
    expected = torch.zeros_like(b.mask, dtype=torch.float32)
    for r, (spans, values) in enumerate(zip(policy, steps, strict=True)):
        for sp, value in zip(spans, values.tolist(), strict=True):
            expected[r, sp["start"] : sp["end"]] = value
    torch.testing.assert_close(b.proto.batch["advantages"], expected * b.mask)
    # p0's first steps differ from GRPO's advantage by the step part; the lone p1 episode gets 0
    assert float(steps[0][0]) != float(steps[0][1]) and float(steps[3][0]) == 0.0
    assert res.metrics["agentcredit/episodes"] == 4


def test_carl_critical_on_independent_episodes_trains_the_first_actions_only():
    """verl samples a prompt's episodes independently, so carl-critical's action tree is one chain per episode
    under the prompt, the same tree the native trainer builds from independent rollouts (one definition of the
    method for both trainers, issue 14; before it verl collapsed each episode into one action, a star tree).

    Hand-worked, p0 with outcomes 1, 0, 0: V(every node of an episode) = its R, V(prompt) = 1/3, so the first
    actions get 2/3, -1/3, -1/3 and are the only ones updated (the prompt is the only node with >= 2 children,
    Eq. 13); the answers' A = R - R = 0. p1 has one episode: no fork, nothing is updated.
    """
    eps = [search_ep("p0", 1.0), search_ep("p0", 0.0), search_ep("p0", 0.0), search_ep("p1", 1.0)]
    b = build_batch(eps)
    apply_to_dataproto(b.proto, settings("carl-critical"))
    _, adv, update = critical_action_advantages([-1, 0, 1, 0, 3, 0, 5], {2: 1.0, 4: 0.0, 6: 0.0})
    assert adv[1:] == pytest.approx([2 / 3, 0, -1 / 3, 0, -1 / 3, 0])
    assert update == [False, True, False, True, False, True, False]
    expected = torch.zeros_like(b.mask, dtype=torch.float32)
    for row, value in enumerate([2 / 3, -1 / 3, -1 / 3, 0.0]):
        expected[row, :5] = value  # the search action: response tokens 0..4; the answer (9..15) gets 0
    torch.testing.assert_close(b.proto.batch["advantages"], expected)


@pytest.mark.parametrize("whiten", [False, True])
def test_ppo_equals_masked_gae(whiten):
    eps = [search_ep("p0", 1.0), search_ep("p0", 0.0, 2, (3, 6, 2)), search_ep("p1", 1.0, 0)]
    b = build_batch(eps)
    apply_to_dataproto(b.proto, settings("ppo", ppo={"gamma": 1.0, "lam": 0.95, "whiten": whiten}))
    rewards = torch.zeros_like(b.values)
    for r, (e, _) in enumerate(b.row_of):
        rewards[r, _trained(b, r)[-1][1] - 1] = eps[e].outcome
    adv, ret = gae_advantages(rewards, b.values, b.mask, gamma=1.0, lam=0.95)
    if whiten:
        adv = masked_whiten(adv, b.mask.float()) * b.mask
    torch.testing.assert_close(b.proto.batch["advantages"], adv.float())
    torch.testing.assert_close(b.proto.batch["returns"], ret.float())


def test_tips_equals_turn_rewards_then_gae():
    eps = [
        search_ep("p0", 1.2, 2, (4, 5, 3), potentials=[-3.0, -1.5, -0.5]),
        search_ep("p0", 0.0, 1, (6, 3, 2), potentials=[-3.0, -3.4]),
        search_ep("p1", 0.2, 0, (2, 2, 5), potentials=[-2.0]),
    ]
    b = build_batch(eps)
    s = settings("tips", ppo={"whiten": False}, tips={"alpha_mode": "batch_target", "target_mean_abs": 0.11})
    _, res = apply_to_dataproto(b.proto, s)
    deltas = [1.5, 1.0, -0.4]
    alpha = tips_batch_alpha(deltas, target_mean_abs=0.11)
    assert alpha == pytest.approx(0.11 / (2.9 / 3)) and res.state == {"tips_alpha": pytest.approx(alpha)}
    rewards = torch.zeros_like(b.values)
    for r, (e, _) in enumerate(b.row_of):
        trained = _trained(b, r)
        turn = tips_turn_rewards(eps[e].potentials, eps[e].outcome, alpha=alpha)
        positions = [t - 1 for _, t, _ in trained]  # tool turns are every segment but the last, then the last
        rewards[r] = tips_token_rewards(turn, positions, b.mask[r], dtype=rewards.dtype)
    adv, ret = gae_advantages(rewards, b.values, b.mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(b.proto.batch["advantages"], adv.float())
    torch.testing.assert_close(b.proto.batch["returns"], ret.float())
    # hand check of the shaping: episode 0 rewards sum to outcome - alpha * Phi(S_0) = 1.2 + 3 alpha
    assert float(rewards[0].sum()) == pytest.approx(1.2 + 3.0 * alpha)


def _carl_eps():
    tool = [
        ("policy", "invoke", 5, False),
        ("observation", "tool_output", 4, True),
        ("policy", "assimilate", 3, False),
        ("policy", "commit", 6, False),
    ]
    direct = [("policy", "commit", 4, False)]
    return [Ep("p0", tool, 1.0), Ep("p0", direct, 0.0)]


def test_carl_segment_worked_example_across_views():
    """carl-segment.md §3.2 worked example: V = (0.40, 0.70, 0.50), R = 1 -> (+0.30, -0.20, +0.50).

    verl's critic model outputs the head's value before the sigmoid (V = sigmoid(head), §3.4), so the batch
    holds logit(V)."""
    eps = _carl_eps()
    # rows: 0 = ep0 view 0 (invoke + raw + assimilate), 1 = ep0 view 1 (invoke + assimilate + commit), 2 = ep1
    values_at = {(0, 0): 0.40, (0, 9): 0.70, (1, 8): 0.50, (2, 0): 0.60}
    values_at = {at: float(torch.logit(torch.tensor(v))) for at, v in values_at.items()}
    b = build_batch(eps, values_at=values_at)
    assert b.row_of == [(0, 0), (0, 1), (1, 0)]
    _, res = apply_to_dataproto(b.proto, settings("carl-segment"))
    adv, ret = b.proto.batch["advantages"], b.proto.batch["returns"]
    assert segment_advantages([0.4, 0.7, 0.5], 1.0) == pytest.approx([0.3, -0.2, 0.5])
    torch.testing.assert_close(adv[0, 0:5], torch.full((5,), 0.3))
    torch.testing.assert_close(adv[0, 9:12], torch.full((3,), -0.2))
    torch.testing.assert_close(adv[1, 8:14], torch.full((6,), 0.5))
    torch.testing.assert_close(adv[2, 0:4], torch.full((4,), -0.6))
    assert float(adv[0, 5:9].abs().sum() + adv[1, 0:8].abs().sum()) == 0.0  # raw output and replayed context
    # Monte-Carlo critic target R on every trained token; the critic's loss reads it at the 3 + 1 boundaries only,
    # each weighing rows/episodes (3/2) over its episode's boundaries
    torch.testing.assert_close(ret, (b.mask * torch.tensor([[1.0], [1.0], [0.0]])).float())
    weights = {tuple(at): float(res.value_weights[tuple(at)]) for at in res.value_weights.nonzero().tolist()}
    assert weights == pytest.approx({(0, 0): 0.5, (0, 9): 0.5, (1, 8): 0.5, (2, 0): 1.5})
    # V at the boundaries (0.4, 0.7, 0.5; 0.6) against R (1, 1, 1; 0): mean 0.55, EV = 1 - 0.225 / 0.1875 = -0.2
    assert res.metrics["agentcredit/boundary_value_mean"] == pytest.approx(0.55)
    assert res.metrics["agentcredit/boundary_explained_variance"] == pytest.approx(-0.2)
    assert res.metrics["agentcredit/segments_per_episode"] == 2.0


def test_carl_segment_mean_loss_scaling_equals_segment_mean_in_verl_loss():
    """With segment_mean_loss, verl's own PPO loss (seq-mean-token-sum) equals agentcredit's segment-mean loss."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    # append mode (no transient output): one row per episode, so rows / episodes = 1
    tool = [
        ("policy", "invoke", 5, False),
        ("observation", "tool_output", 4, False),
        ("policy", "assimilate", 3, False),
        ("policy", "commit", 6, False),
    ]
    eps = [Ep("p0", tool, 1.0), Ep("p0", [("policy", "commit", 4, False)], 0.0)]
    b = build_batch(eps, seed=3)
    plain = build_batch(eps, seed=3)
    apply_to_dataproto(b.proto, settings("carl-segment", carl_segment={"segment_mean_loss": True}))
    apply_to_dataproto(plain.proto, settings("carl-segment"))
    seg_ids = torch.full(b.mask.shape, -1)
    for r in range(len(b.row_of)):
        for s, t, k in _trained(b, r):
            seg_ids[r, s:t] = k
    old = b.proto.batch["old_log_probs"]
    new = old + 0.3 * torch.randn(old.shape, generator=torch.Generator().manual_seed(1))
    cfg = OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": None,
            "clip_ratio_high": None,
            "clip_ratio_c": 3.0,
            "global_batch_info": {},
        }
    )
    verl_loss, _ = compute_policy_loss_vanilla(
        old, new, b.proto.batch["advantages"], b.mask.bool(), "seq-mean-token-sum", cfg
    )
    ours = policy_loss(
        new,
        old,
        plain.proto.batch["advantages"],
        b.mask,
        clip_eps=0.2,
        agg="segment-mean",
        segment_ids=seg_ids,
        dual_clip=3.0,
    )
    assert float(verl_loss) == pytest.approx(float(ours), rel=1e-5)


def test_gear_equals_gear_advantages_on_grpo():
    eps = [
        search_ep("p0", 1.0),
        search_ep("p0", 0.0, 2, (3, 6, 2)),
        search_ep("p0", 1.0, 0),
        search_ep("p1", 0.0),
    ]
    b = build_batch(eps, with_teacher=True)
    g = {"lambda_kl": 0.1, "lambda_h": 1.5, "alpha": 0.2, "beta": 0.9, "student_logprobs": "rollout"}
    apply_to_dataproto(b.proto, settings("gear", gear=g))
    base = grpo_advantages(torch.tensor([e.outcome for e in eps]), [e.uid for e in eps])
    expected = torch.zeros_like(b.values)
    for r, (e, _) in enumerate(b.row_of):
        expected[r] = gear_advantages(
            float(base[e]),
            b.rollout_lp[r],
            b.teacher[r],
            b.entropy[r],
            b.mask[r],
            lambda_kl=0.1,
            lambda_h=1.5,
            alpha=0.2,
            beta=0.9,
            normalisation="auto",  # the settings' default since issue 31 (gear.md A3)
        )
    torch.testing.assert_close(b.proto.batch["advantages"], expected.float())
    # the zero-advantage episode (p1 alone) stays zero whatever the teacher says
    assert float(b.proto.batch["advantages"][3].abs().sum()) == 0.0


def test_portool_equals_portool_advantages_on_the_chain_tree():
    eps = [
        search_ep("p0", 1.0, 1, (5, 4, 7), fmt=[0.25, 0.25]),
        search_ep("p0", -1.0, 2, (3, 2, 6), fmt=[0.1, -0.025, 0.25]),
        search_ep("p0", 0.0, 0, (5, 4, 4), fmt=[0.25]),
    ]
    b = build_batch(eps)
    apply_to_dataproto(b.proto, settings("portool", portool={"gamma": 0.95}))
    parents, lengths, fmt, leaves = [-1], [0], [0.0], []
    for ep in eps:
        parent = 0
        pol = [s for s in ep.segs if s[0] == "policy"]
        for (_, _, n, _), f in zip(pol, ep.fmt, strict=True):
            parents.append(parent)
            lengths.append(n)
            fmt.append(f)
            parent = len(parents) - 1
        leaves.append(parent)
    per_leaf = portool_advantages(
        parents, lengths, {leaf: ep.outcome for leaf, ep in zip(leaves, eps, strict=True)}, fmt, gamma=0.95
    )
    expected = torch.zeros_like(b.values)
    for r, (e, _) in enumerate(b.row_of):
        for s, t, k in _trained(b, r):
            expected[r, s:t] = per_leaf[leaves[e]][k]
    torch.testing.assert_close(b.proto.batch["advantages"], expected.float())


def test_estimator_through_verls_compute_advantage():
    """`algorithm.adv_estimator=agentcredit_grpo` through verl's own dispatcher equals grpo_advantages."""
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.ray_trainer import compute_advantage

    import agentcredit.integrations.verl.estimators  # noqa: F401  (registers the names)

    eps = [search_ep("p0", 1.0), search_ep("p0", 0.0), search_ep("p1", 1.0)]
    b = build_batch(eps)
    scores = torch.zeros_like(b.values)
    for r in range(len(b.row_of)):
        scores[r, _trained(b, r)[-1][1] - 1] = eps[b.row_of[r][0]].outcome
    b.proto.batch["token_level_rewards"] = scores
    for name, scale in (("agentcredit_grpo", True), ("agentcredit_drgrpo", False)):
        out = compute_advantage(b.proto, adv_estimator=name, config=AlgoConfig())
        per_ep = grpo_advantages(torch.tensor([1.0, 0.0, 1.0]), ["p0", "p0", "p1"], scale=scale)
        torch.testing.assert_close(out.batch["advantages"], (per_ep.unsqueeze(1) * b.mask).float())


def test_bad_batches_fail_with_the_row_named():
    eps = [search_ep("p0", 1.0), search_ep("p0", 0.0)]
    b = build_batch(eps)
    with pytest.raises(ValueError, match="method ppo needs `values`"):
        proto = build_batch(eps).proto
        proto.batch.pop("values")
        apply_to_dataproto(proto, settings("ppo"))
    generated = b.proto.batch["response_mask"].clone()
    b.proto.batch["response_mask"][1, 0] = 0
    with pytest.raises(ValueError, match=r"row 1: response_mask\[0\] = 0"):
        apply_to_dataproto(b.proto, settings("grpo"))
    apply_to_dataproto(
        b.proto, settings("grpo"), generated_mask=generated
    )  # a rejected token: checked as generated
    assert b.proto.batch["advantages"][1, 0] == 0 and b.proto.batch["advantages"][1, 1] != 0
    with pytest.raises(ValueError, match="may only remove tokens"):
        apply_to_dataproto(b.proto, settings("grpo"), generated_mask=b.proto.batch["response_mask"] * 0)
    proto = build_batch(eps).proto
    proto.non_tensor_batch["agentcredit"][0] = None
    with pytest.raises(ValueError, match=r"extra_fields\['agentcredit'\]\[0\] is None"):
        apply_to_dataproto(proto, settings("grpo"))
    proto = build_batch(eps).proto
    proto.non_tensor_batch["agentcredit"][1] = {**proto.non_tensor_batch["agentcredit"][1], "bogus": 1}
    with pytest.raises(ValueError, match=r"(?s)\[1\] is malformed.*bogus"):
        apply_to_dataproto(proto, settings("grpo"))
    with pytest.raises(ValueError, match="tips needs the teacher potentials"):
        apply_to_dataproto(build_batch(eps).proto, settings("tips"))
    # one view of a two-view episode missing from the batch
    proto = build_batch(_carl_eps()).proto
    sub = proto.select_idxs([0, 2])
    with pytest.raises(ValueError, match="has 1 of its 2 rows"):
        apply_to_dataproto(sub, settings("carl-segment"))


def _native_trees(b: Batch) -> tuple[list[RolloutTree], list[tuple[int, int]]]:
    """The verl batch's episodes as the native trainer holds them: one tree per prompt, each episode a branch
    of exactly the same tokens. Returns the trees and, per verl row, (tree index, leaf)."""
    records = b.proto.non_tensor_batch["agentcredit"]
    uids = list(b.proto.non_tensor_batch["uid"])
    trees: dict[str, RolloutTree] = {}
    where = []
    for row, (record, uid) in enumerate(zip(records, uids, strict=True)):
        tree = trees.setdefault(uid, RolloutTree(Segment(list(range(100, 100 + PROMPT_LEN)), role="prompt")))
        node = 0
        for span in record["spans"]:
            ids = b.proto.batch["responses"][row, span["start"] : span["end"]].tolist()
            if span["role"] == "policy":
                seg = Segment(ids, role="policy", kind=span["kind"], logprobs=[-1.0] * len(ids))
                if record["format_rewards"]:
                    seg.info["format_reward"] = record["format_rewards"][span["segment"]]
                if record.get("env_rewards"):
                    seg.info["env_reward"] = record["env_rewards"][span["segment"]]
            else:
                seg = Segment(ids, role="observation", kind=span["kind"])
            node = tree.add(seg, node)
        tree.set_reward(node, record["outcome"])
        where.append((list(trees).index(uid), node))
    return list(trees.values()), where


@pytest.mark.parametrize(
    ("method", "env"),
    [
        *((name, False) for name in BUILT_IN),  # every built-in method, found in agentcredit/credit/methods/
        ("grpo", True),
        ("ppo", True),
        ("carl-segment", True),
        ("portool", True),
    ],
)
def test_both_trainers_give_the_same_advantages_from_one_definition(method, env):
    """issue 14, extended to all eight methods in issue 37: a method is one object both trainers call on the
    neutral layout. The same episodes, laid out by the native trainer (trees, rows with the prompt) and by the verl
    adapter (response rows), with the same signals (critic values, teacher potentials and log-probs, entropies,
    placed on the same tokens), get the same advantage on every policy token, from each trainer's own config of
    the method (the native preset's settings, given to verl's block)."""
    from agentcredit.config import load_config
    from agentcredit.credit import METHODS, tips_step_alpha
    from agentcredit.train.advantages import compute_advantages as native_advantages
    from agentcredit.train.batch import build_batch as native_batch
    from agentcredit.train.signals import Signals

    fmt2, fmt3 = [0.25, -0.1], [0.25, 0.1, 0.0]
    phi2, phi3 = [-3.0, -1.5], [-3.0, -2.2, -0.4]
    eps = [
        search_ep("p0", 1.0, fmt=fmt2, potentials=phi2),
        search_ep("p0", 0.0, 2, (3, 6, 2), fmt=fmt3, potentials=phi3),
        search_ep("p0", 1.0, 2, (4, 2, 3), fmt=fmt3, potentials=[-2.5, -2.0, -1.0]),
        search_ep("p1", 0.0, fmt=fmt2, potentials=[-1.0, -1.2]),
        search_ep("p1", 1.0, fmt=fmt2, potentials=[-2.0, -0.5]),
    ]
    cfg = load_config(f"{method}-arith-tools").algorithm
    b = build_batch(eps, with_teacher=True)
    if env:  # issue 15: a per-episode environment's step rewards, in the record and in the return
        records, paid = b.proto.non_tensor_batch["agentcredit"], {}
        for i, rec in enumerate(records):
            steps = paid.setdefault(
                rec["episode_id"], [0.1 * (k + 1) * (len(paid) % 3) for k in range(len(rec["segment_kinds"]))]
            )
            records[i] = {**rec, "env_rewards": steps, "outcome": rec["outcome"] + sum(steps)}
    # verl's block gets the native preset's settings of every part of the method (the fields they share)
    shared = {}
    for part in cfg.credit_method.parts:
        fields = set(METHODS[part.name].settings.model_fields) - {"combine", "reference"}
        shared[part.section] = getattr(cfg, part.section).model_dump(include=fields)
    shared.setdefault("ppo", {})["whiten"] = cfg.whiten_advantages
    shared["gear"] = {**shared.get("gear", {}), "student_logprobs": "old"}
    apply_to_dataproto(b.proto, settings(method, **shared))
    trees, where = _native_trees(b)
    batch = native_batch(trees)
    row_of_leaf = {(t.tree, t.leaf): t.rows[0] for t in batch.trajectories}

    def native(tensor):  # verl's per-response-token tensor on the native rows' policy tokens
        out = torch.zeros(batch.input_ids.shape)
        for row, key in enumerate(where):
            n_row = row_of_leaf[key]
            out[n_row][batch.policy_mask[n_row]] = tensor[row][b.mask[row].bool()].float()
        return out

    episode_of = {key: e for e, key in enumerate(where)}  # one row per episode here
    potentials = [eps[episode_of[(t.tree, t.leaf)]].potentials for t in batch.trajectories]
    values = native(b.values)
    if (
        cfg.critic == "boundary"
    ):  # verl's critic outputs the head; the native head's value is V = sigmoid(head)
        values = torch.sigmoid(values)
    alpha = tips_step_alpha(
        potentials,
        mode=cfg.tips.alpha_mode,
        alpha=cfg.tips.alpha,
        target_mean_abs=cfg.tips.target_mean_abs,
        previous=None,
    )
    signals = Signals(
        values=values,
        entropy=native(b.entropy),
        teacher_logp=native(b.teacher),
        potentials=potentials,
        alpha=alpha,
    )
    batch.old_logp = native(b.proto.batch["old_log_probs"])
    result = native_advantages(cfg, batch, trees, signals)
    for row, key in enumerate(where):
        n_row = row_of_leaf[key]
        got = b.proto.batch["advantages"][row][b.mask[row].bool()]
        expected = (result.advantages * result.loss_mask)[n_row][batch.policy_mask[n_row]]
        torch.testing.assert_close(got, expected.to(got.dtype), atol=1e-6, rtol=1e-6)
    assert bool((b.proto.batch["advantages"] != 0).any())


def test_an_episode_whose_tool_could_not_run_is_left_out_of_the_group():
    """issue 36: an episode the agent loop marked (``infra_failures``; its response_mask all 0) is left out of the
    credit like a failed session: p0's group is (1, 0) without it, it gets zeros, and the metric counts it."""
    eps = [search_ep("p0", 1.0), search_ep("p0", 0.0), search_ep("p0", 1.0)]
    b = build_batch(eps)
    failed = [r for r, (e, _) in enumerate(b.row_of) if e == 2]
    for r in failed:
        b.proto.non_tensor_batch["agentcredit"][r] = {
            **b.proto.non_tensor_batch["agentcredit"][r],
            "infra_failures": ["search: ERROR: search failed: timed out"],
        }
        b.proto.batch["response_mask"][r] = 0
    _, res = apply_to_dataproto(b.proto, settings("grpo"))
    per_ep = grpo_advantages(torch.tensor([1.0, 0.0]), ["p0", "p0"])
    mask = b.proto.batch["response_mask"]
    expected = (
        torch.stack([per_ep[e] if e < 2 else torch.tensor(0.0) for e, _ in b.row_of]).unsqueeze(1) * mask
    )
    torch.testing.assert_close(b.proto.batch["advantages"], expected.float())
    assert float(per_ep[0]) == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-6), rel=1e-6)  # (1 - mean) / std
    assert res.metrics["agentcredit/infra_failed_episodes"] == 1.0
    assert res.metrics["agentcredit/episodes"] == 2.0


def test_verl_gear_defaults_to_the_reference_trajectory_as_the_native_trainer():
    """issue 36 (after issue 31): verl's agent loop builds tau* with the native trainer's function, so verl's GEAR
    settings are the native section's: reference trajectory by default (GEAR §3.3, seed line 72), answer a variant."""
    from agentcredit.credit.methods.gear import GearSettings as NativeGearSettings
    from agentcredit.credit.methods.gear import GearVerlSettings as GearSettings

    assert GearSettings().reference == "trajectory" == NativeGearSettings().reference
    assert GearSettings(reference="answer").reference == "answer"


def test_an_unknown_method_is_an_error_not_another_methods_parameters():
    """issue 37: the adapter's name-by-name parameter map fell through to GiGPO's parameters for any estimator it
    did not name; the method is now looked up in the registry, and an unknown name is an error listing the known."""
    from agentcredit.integrations.verl.advantages import compute_advantages

    b = build_batch([search_ep("p0", 1.0), search_ep("p0", 0.0)])
    bogus = settings("grpo").model_copy(update={"method": "carl"})  # past the block's own validation
    records = [r for r in b.proto.non_tensor_batch["agentcredit"]]
    from agentcredit.integrations.verl.fields import parse_records

    with pytest.raises(ValueError, match="unknown credit method 'carl'; known methods: .*grpo, .*ppo"):
        compute_advantages(
            bogus,
            response_mask=b.proto.batch["response_mask"],
            records=parse_records(records, len(records)),
            uids=list(b.proto.non_tensor_batch["uid"]),
        )
    with pytest.raises(ValueError, match="agentcredit.method: Value error, unknown credit method 'carl'"):
        settings("carl")


def test_a_method_registered_outside_the_package_runs_on_the_verl_adapter():
    """The same kind of user method as tests/train/test_user_method.py (native trainer): registered here, it is
    known to verl's block, its settings are the block's section of its own class, and its estimate gives the
    adapter's advantages."""
    from pydantic import Field

    from agentcredit.credit import Estimate, Method, Needs, Settings, register_method
    from agentcredit.credit.methods import unregister_method

    class Halved(Settings):
        factor: float = Field(0.5, description="the multiplier of GRPO's advantage (a test method).")

    def halved_grpo(batch, s):
        from agentcredit.credit.methods import grpo

        est = grpo.estimate(batch, grpo.GrpoSettings())
        return Estimate(est.advantages * s.factor, est.loss_mask)

    register_method(
        Method("halved", Halved, Needs(), "a test", estimate=halved_grpo)  # settings: agentcredit.halved
    )
    try:
        eps = [search_ep("p0", 1.0), search_ep("p0", 0.0, 2), search_ep("p1", 0.0), search_ep("p1", 1.0)]
        b = build_batch(eps)
        apply_to_dataproto(b.proto, settings("halved", halved={"factor": 0.25}))
        reference = build_batch(eps)
        apply_to_dataproto(reference.proto, settings("grpo"))
        torch.testing.assert_close(b.proto.batch["advantages"], 0.25 * reference.proto.batch["advantages"])
        assert bool((b.proto.batch["advantages"] != 0).any())
    finally:
        unregister_method("halved")


def test_teacher_call_metrics_sum_the_episodes_records():
    """Hand-worked: two episodes counted 5 and 3 teacher calls, of which 1 and 2 were resent whole (a prefix-cache hit
    that reached the scored tokens): 8 requests, resent share 3 / 8. A row without counts (a second view, or a
    method without a teacher) adds nothing; a batch without any gives no metric."""

    def record(calls: dict[str, int]) -> RowRecord:
        return RowRecord(episode_id="e", spans=[], outcome=0.0, segment_kinds=[], teacher_calls=calls)

    rows = [record({"requests": 5, "resent": 1}), record({}), record({"requests": 3, "resent": 2})]
    assert teacher_call_metrics(rows) == {
        "agentcredit/teacher_requests": 8.0,
        "agentcredit/teacher_resent_frac": pytest.approx(0.375),
    }
    assert teacher_call_metrics([record({})]) == {}
