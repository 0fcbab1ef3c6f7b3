"""Rows are not trajectories: verl's mini-batches and loss weights against agentcredit's own trainer.

verl's actor cuts the batch into contiguous chunks of ``ppo_mini_batch_size x rollout.n`` rows
(``train_mini_batch`` / ``make_iterator``) and ``seq-mean-token-sum`` divides each chunk's sum by that row count.
agentcredit's trainer takes mini-batches of whole trajectories and weighs them with ``aggregation_weights``
(``sequence_ids`` = trajectory). The per-trajectory weight here is measured on verl's own loss
(``compute_policy_loss_vanilla``): at ratio 1 the gradient of the loss with respect to a token's log-prob is
``-A'_t / G``, so ``-grad / A_t`` is the weight verl gives that token's plain (unscaled) advantage.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import settings as settings_h
from hypothesis import strategies as st

pytest.importorskip("verl")

from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.tensordict_utils import make_iterator  # noqa: E402
from verl.workers.engine.utils import prepare_micro_batches  # noqa: E402

from agentcredit.credit import aggregation_weights  # noqa: E402
from agentcredit.integrations.verl import GENERIC_CONFIG, METHOD_CONFIGS  # noqa: E402
from agentcredit.integrations.verl import trainer as trainer_module  # noqa: E402
from agentcredit.integrations.verl.__main__ import config_dir  # noqa: E402
from agentcredit.integrations.verl.advantages import apply_to_dataproto  # noqa: E402
from agentcredit.integrations.verl.minibatch import plan_minibatches  # noqa: E402
from agentcredit.integrations.verl.trainer import AgentCreditTrainer, check_trainer_config  # noqa: E402

from .test_verl_advantages import Ep, _trained, build_batch, settings  # noqa: E402
from .test_verl_trainer import MemoryTQ, Meta, _stored_rows  # noqa: E402

pytestmark = pytest.mark.verl

# A: two tool calls with transient outputs -> 3 rows (views), 5 policy segments; B: one row, 1 segment.
TWO_CALLS = [
    ("policy", "invoke", 5, False),
    ("observation", "tool_output", 4, True),
    ("policy", "assimilate", 3, False),
    ("policy", "invoke", 2, False),
    ("observation", "tool_output", 3, True),
    ("policy", "assimilate", 2, False),
    ("policy", "commit", 4, False),
]
DIRECT = [("policy", "commit", 4, False)]


def _batch(eps):
    b = build_batch(eps, seed=7)
    plain = build_batch(eps, seed=7)  # same numbers, plain segment advantages (the native trainer's A)
    apply_to_dataproto(plain.proto, settings("carl-segment"))
    return b, plain.proto.batch["advantages"]


def _segment_ids(b) -> torch.Tensor:
    seg = torch.full(b.mask.shape, -1)
    for r in range(len(b.row_of)):
        for s, t, k in _trained(b, r):
            seg[r, s:t] = k
    return seg


def _verl_weights(b, plain_adv, order, rows_per_minibatch) -> tuple[torch.Tensor, int]:
    """Per-token weights verl's seq-mean-token-sum gives over one epoch, and its optimizer steps (dp = 1)."""
    adv, mask, old = b.proto.batch["advantages"], b.mask.bool(), b.proto.batch["old_log_probs"]
    cfg = OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": None,
            "clip_ratio_high": None,
            "clip_ratio_c": 3.0,
            "global_batch_info": {"global_batch_size": rows_per_minibatch, "dp_size": 1},
        }
    )
    grad = torch.zeros_like(old)
    steps = 0
    for start in range(0, len(order), rows_per_minibatch):
        rows = [r for r in order[start : start + rows_per_minibatch] if r is not None]  # None: padding row
        logp = old[rows].clone().requires_grad_(True)
        loss, _ = compute_policy_loss_vanilla(
            old[rows], logp, adv[rows], mask[rows], "seq-mean-token-sum", cfg
        )
        loss.backward()
        grad[rows] += logp.grad
        steps += 1
    return torch.where(mask, -grad / plain_adv, 0.0), steps


def _per_trajectory(b, weights) -> list[float]:
    totals = [0.0] * len(b.eps)
    for r, (e, _) in enumerate(b.row_of):
        totals[e] += float(weights[r].sum())
    return totals


def _native(b, minibatches: list[list[int]]) -> tuple[list[float], int]:
    """agentcredit's trainer: mini-batches of whole trajectories, segment-mean weights per mini-batch."""
    seg = _segment_ids(b)
    totals = [0.0] * len(b.eps)
    for trajs in minibatches:
        rows = [r for r, (e, _) in enumerate(b.row_of) if e in trajs]
        traj = torch.tensor([b.row_of[r][0] for r in rows])
        w = aggregation_weights(b.mask[rows], "segment-mean", segment_ids=seg[rows], sequence_ids=traj)
        for i, r in enumerate(rows):
            totals[b.row_of[r][0]] += float(w[i].sum())
    return totals, len(minibatches)


def test_verls_row_layout_weighs_a_trajectory_by_its_rows():
    """What the adapter got before the mini-batch plan: verl's chunks of ppo_mini_batch_size x n rows.

    Two trajectories, one mini-batch of 1 trajectory each natively (5 segments -> weight 5, 1 segment -> 1,
    2 optimizer steps). verl's mini-batch is 1 x 1 = 1 row: A's 3 rows make 3 steps of their own (4 in all), and
    the adapter's batch factor rows/episodes = 4/2 doubles both trajectories (10 and 2).
    """
    b, plain = _batch([Ep("p0", TWO_CALLS, 1.0), Ep("p1", DIRECT, 0.0)])
    assert b.row_of == [(0, 0), (0, 1), (0, 2), (1, 0)]
    apply_to_dataproto(b.proto, settings("carl-segment", carl_segment={"segment_mean_loss": True}))
    weights, steps = _verl_weights(b, plain, [0, 1, 2, 3], rows_per_minibatch=1)
    native, native_steps = _native(b, [[0], [1]])
    assert native == pytest.approx([5.0, 1.0], abs=1e-9) and native_steps == 2
    assert _per_trajectory(b, weights) == pytest.approx([10.0, 2.0], abs=1e-6)
    assert steps == 4


def test_planned_minibatches_give_native_weights_and_steps():
    """With the plan: A's 3 rows form one mini-batch, B is padded to 3 rows, factor 3 / 1 = 3.

    Hand-worked: segment k of A gets A_k / |g_k| * 3 on each of its |g_k| tokens, divided by verl's G = 3 rows:
    a total weight of 1 per segment, 5 for A; 1 for B; 2 optimizer steps, as natively.
    """
    b, plain = _batch([Ep("p0", TWO_CALLS, 1.0), Ep("p1", DIRECT, 0.0)])
    plan = plan_minibatches([e for e, _ in b.row_of], episodes_per_minibatch=1)
    assert plan.order == [0, 1, 2, 3, None, None] and plan.rows_per_minibatch == 3
    apply_to_dataproto(
        b.proto,
        settings("carl-segment", carl_segment={"segment_mean_loss": True}),
        rows_per_episode=plan.rows_per_episode,
    )
    weights, steps = _verl_weights(b, plain, plan.order, plan.rows_per_minibatch)
    native, native_steps = _native(b, [[0], [1]])
    assert _per_trajectory(b, weights) == pytest.approx(native, abs=1e-6)
    assert _per_trajectory(b, weights) == pytest.approx([5.0, 1.0], abs=1e-6)
    assert steps == native_steps == 2


def test_trajectory_weight_does_not_depend_on_its_rows():
    """The same trajectories in both orders of row counts: each keeps the native weight 1/M per segment."""
    eps = [Ep("p0", DIRECT, 1.0), Ep("p0", TWO_CALLS, 0.0), Ep("p1", TWO_CALLS, 1.0), Ep("p1", DIRECT, 0.0)]
    b, plain = _batch(eps)
    plan = plan_minibatches([e for e, _ in b.row_of], episodes_per_minibatch=2)
    # episodes (0: 1 row, 1: 3 rows) and (2: 3 rows, 3: 1 row): 4 rows each, no padding
    assert plan.order == [0, 1, 2, 3, 4, 5, 6, 7] and plan.rows_per_episode == 2.0
    apply_to_dataproto(
        b.proto,
        settings("carl-segment", carl_segment={"segment_mean_loss": True}),
        rows_per_episode=plan.rows_per_episode,
    )
    weights, steps = _verl_weights(b, plain, plan.order, plan.rows_per_minibatch)
    native, native_steps = _native(b, [[0, 1], [2, 3]])
    assert _per_trajectory(b, weights) == pytest.approx(native, abs=1e-6)
    assert native == pytest.approx([0.5, 2.5, 2.5, 0.5]) and steps == native_steps


def test_plan_lays_out_whole_episodes_per_rank_for_verls_iterator():
    """dp = 2: each rank's contiguous slice, cut by verl's make_iterator, gives the planned mini-batches."""
    episode_of_row = ["a", "b", "a", "a", "c", "d"]  # a: rows 0, 2, 3
    plan = plan_minibatches(episode_of_row, episodes_per_minibatch=2, dp_size=2)
    # mini-batch 0 = a + b = rows 0, 2, 3, 1; mini-batch 1 = c + d = rows 4, 5 + 2 padding rows; width 4
    assert plan.rows_per_minibatch == 4 and plan.n_minibatches == 2
    assert plan.order == [0, 2, 4, 5, 3, 1, None, None]
    slots = torch.tensor([-1 if s is None else s for s in plan.order])
    per_rank = [slots[r * 4 : (r + 1) * 4] for r in range(2)]  # verl dispatches contiguous slices by rank
    from tensordict import TensorDict

    chunks = [
        [mb["row"].tolist() for mb in make_iterator(TensorDict({"row": s}, batch_size=[4]), 2, epochs=1)]
        for s in per_rank
    ]
    minibatches = [sorted(r for rank in chunks for r in rank[j] if r >= 0) for j in range(2)]
    assert minibatches == [[0, 1, 2, 3], [4, 5]]


def test_plan_pads_a_short_last_minibatch():
    """issue 36: a failed session leaves the batch an episode short; the plan raised, ending a carl-segment run
    where GRPO just pads. Now the last mini-batch is short, padded to the same row count."""
    plan = plan_minibatches(["a", "b", "c"], episodes_per_minibatch=2)
    assert plan.order == [0, 1, 2, None] and plan.n_minibatches == 2 and plan.rows_per_minibatch == 2
    assert plan.episodes == 3 and plan.missing_episodes == 1
    assert plan.rows_per_episode == 1.0  # nominal: rows / episodes of a full mini-batch
    with pytest.raises(ValueError, match="no rows"):
        plan_minibatches([], episodes_per_minibatch=2)


def test_short_last_minibatch_keeps_the_nominal_per_episode_weight():
    """A (3 rows, 5 segments), B (1 row, 1 segment), C (3 rows, 5 segments), 2 episodes per mini-batch: groups
    [A, B] (4 rows) and [C] (3 rows + 1 padding row), factor 4 / 2 = 2. Hand-worked with verl's loss: every
    segment's total weight is 1/2, as in a full mini-batch of 2 (A 2.5, B 0.5, and C 2.5, not the 5 a mean over
    the short mini-batch's one episode would give); 2 optimizer steps."""
    b, plain = _batch([Ep("p0", TWO_CALLS, 1.0), Ep("p0", DIRECT, 0.0), Ep("p1", TWO_CALLS, 1.0)])
    plan = plan_minibatches([e for e, _ in b.row_of], episodes_per_minibatch=2)
    assert plan.order == [0, 1, 2, 3, 4, 5, 6, None] and plan.missing_episodes == 1
    apply_to_dataproto(
        b.proto,
        settings("carl-segment", carl_segment={"segment_mean_loss": True}),
        rows_per_episode=plan.rows_per_episode,
    )
    weights, steps = _verl_weights(b, plain, plan.order, plan.rows_per_minibatch)
    assert _per_trajectory(b, weights) == pytest.approx([2.5, 0.5, 2.5], abs=1e-6)
    assert steps == 2


def test_rows_per_minibatch_is_a_multiple_of_n_and_dp():
    plan = plan_minibatches(["a", "a", "b"], episodes_per_minibatch=2, dp_size=2, row_multiple=5)
    assert plan.rows_per_minibatch == 10 and plan.order == [0, 1, 2] + [None] * 7


def _compose(name: str, *overrides: str):
    with initialize_config_dir(str(config_dir()), version_base=None):
        return compose(name, overrides=list(overrides))


def test_carl_segment_config_rejects_per_row_loss_modes():
    check_trainer_config(
        _compose("carl_segment")
    )  # the shipped config: segment_mean_loss, seq-mean-token-sum
    with pytest.raises(ValueError, match="loss_agg_mode=seq-mean-token-sum"):
        check_trainer_config(_compose("carl_segment", "actor_rollout_ref.actor.loss_agg_mode=token-mean"))
    off = "agentcredit.carl_segment.segment_mean_loss=false"
    with pytest.raises(ValueError, match="loss_agg_mode=token-mean"):
        check_trainer_config(_compose("carl_segment", off))
    with pytest.raises(ValueError, match="loss_agg_mode=token-mean"):
        check_trainer_config(
            _compose("carl_segment", off, "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean")
        )
    check_trainer_config(_compose("carl_segment", off, "actor_rollout_ref.actor.loss_agg_mode=token-mean"))
    with pytest.raises(ValueError, match="shuffle=False"):
        check_trainer_config(_compose("carl_segment", "actor_rollout_ref.actor.shuffle=true"))
    with pytest.raises(ValueError, match="turn distillation off"):  # its loss would replace agentcredit's
        check_trainer_config(_compose("carl_segment", "distillation.enabled=true"))


class _PlanMeta(Meta):
    extra_info: dict

    def reorder(self, indices):
        self.keys[:] = [self.keys[i] for i in indices]
        self.tags[:] = [self.tags[i] for i in indices]


def test_trainer_lays_out_multi_row_batches_and_updates_with_the_plans_rows(monkeypatch):
    """The trainer's _balance_batch applies the plan (padding from verl's helper) and _update_actor hands verl
    the plan's row count as its mini-batch (ppo_mini_batch_size x n rows)."""
    cfg = _compose(
        "carl_segment",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1",
        "critic.ppo_mini_batch_size=1",
        "actor_rollout_ref.rollout.n=1",
        # one row per micro-batch everywhere (the recipe's 2 and 8 round each mini-batch up: the next test)
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "critic.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
    )
    b = build_batch([Ep("p0", TWO_CALLS, 1.0), Ep("p1", DIRECT, 0.0)], seed=7)
    rows = _stored_rows(b)
    monkeypatch.setattr(trainer_module, "tq", MemoryTQ(rows))

    def upsample(batch, multiple, eos):
        pad = (-len(batch)) % multiple
        batch.keys.extend(f"pad{i}" for i in range(pad))
        batch.tags.extend({"is_padding": True} for _ in range(pad))
        return batch

    monkeypatch.setattr(trainer_module, "upsample_batch_to_divisible_size", upsample)
    trainer = AgentCreditTrainer(cfg)
    trainer.tokenizer = SimpleNamespace(eos_token_id=0)  # set by PPOTrainer.init, not called here
    sent = []
    trainer.actor_rollout_wg = SimpleNamespace(
        _dispatch_info={"actor": [0]},
        update_actor=lambda batch: sent.append(dict(batch.extra_info)) or {"metrics": {"mfu": [0.0]}},
    )
    keys = list(rows)[::-1]  # B's row first: the plan keeps the first-appearance order of episodes
    batch = _PlanMeta(keys, tags=[{"seq_len": 1} for _ in keys])
    batch.extra_info = {}
    metrics: dict = {}
    batch = trainer._balance_batch(batch, metrics)
    assert batch.keys == ["u3_0_0", "pad0", "pad1", "u2_0_0", "u1_0_0", "u0_0_0"]
    assert metrics["agentcredit/minibatch_rows"] == 3.0 and metrics["agentcredit/padding_rows"] == 2.0
    trainer._update_actor(batch, {})
    assert sent[0]["mini_batch_size"] == sent[0]["global_batch_size"] == 3
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 1  # restored after the update
    # with the recipe's micro-batches of 2 rows (critic, actor) the 3-row groups become 4
    for key in (
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "critic.ppo_micro_batch_size_per_gpu",
    ):
        OmegaConf.update(cfg, key, 2)
    keys = list(rows)[::-1]
    batch = trainer._balance_batch(_PlanMeta(keys, tags=[{"seq_len": 1} for _ in keys]), metrics)
    assert metrics["agentcredit/minibatch_rows"] == 4.0 and len(batch.keys) == 8


@settings_h(max_examples=200, deadline=None)
@given(
    episode_of_row=st.lists(st.integers(0, 9), min_size=1, max_size=40),
    per_minibatch=st.integers(1, 5),
    dp_size=st.integers(1, 4),
    row_multiple=st.integers(1, 5),
    micro=st.integers(1, 4),
)
def test_plan_invariants(episode_of_row, per_minibatch, dp_size, row_multiple, micro):
    """Any episode count (short last mini-batch included): every row once, every mini-batch whole episodes (at
    most ``per_minibatch``, only the last one fewer), one row count that is a multiple of dp and n."""
    plan = plan_minibatches(
        episode_of_row, per_minibatch, dp_size=dp_size, row_multiple=row_multiple, micro_batch_per_rank=micro
    )
    rows = [r for r in plan.order if r is not None]
    assert sorted(rows) == list(range(len(episode_of_row)))
    width = plan.rows_per_minibatch
    assert width % dp_size == 0 and width % row_multiple == 0 and (width // dp_size) % micro == 0
    assert len(plan.order) == plan.n_minibatches * width
    share = width // dp_size
    n_episodes = len(set(episode_of_row))
    assert plan.episodes == n_episodes and 0 <= plan.missing_episodes < per_minibatch
    seen: set[int] = set()
    for j in range(plan.n_minibatches):  # rank r holds its share of every mini-batch, in order
        slots = [
            plan.order[(r * plan.n_minibatches + j) * share + i] for r in range(dp_size) for i in range(share)
        ]
        episodes = {episode_of_row[s] for s in slots if s is not None}
        assert not episodes & seen  # an episode's rows are all in one mini-batch
        seen |= episodes
        full = j < plan.n_minibatches - 1
        assert len(episodes) == per_minibatch if full else 1 <= len(episodes) <= per_minibatch
    assert plan.rows_per_episode == width / per_minibatch  # nominal, whatever the last mini-batch holds


RECIPES = sorted({*METHOD_CONFIGS.values(), GENERIC_CONFIG})


@pytest.mark.parametrize("config_name", RECIPES)
def test_the_plan_fits_verls_micro_batches_for_every_recipe_and_dp_1_to_8(config_name):
    """issue 51: the plan rounded a mini-batch's rows to lcm(dp, n) only. carl-segment's recipe cuts each rank's
    rows into micro-batches of 2 without dynamic batch sizes: 120 rows on 8 GPUs -> 15 per rank, and verl's
    ``prepare_micro_batches`` asserted at the first critic update. Every shipped recipe, dp 1-8, multi-row
    episodes (1-3 views) and a short last mini-batch, through verl's own function, for every micro-batch size the
    updates (a rank's mini-batch share) and the log-prob / value passes (a rank's whole slice) use."""
    with initialize_config_dir(str(config_dir()), version_base=None):
        cfg = compose(config_name)
    OmegaConf.resolve(cfg)
    use_critic = bool(cfg.critic.enable)
    micro = trainer_module.micro_batch_multiple(cfg, use_critic)
    n = int(cfg.actor_rollout_ref.rollout.n)
    per_minibatch = int(cfg.actor_rollout_ref.actor.ppo_mini_batch_size) * n
    sizes = {  # every per-GPU micro-batch size a section sets (None: unset, verl's default is dynamic or 1)
        cfg_key: value
        for section in (
            "actor_rollout_ref.actor",
            "actor_rollout_ref.rollout",
            "actor_rollout_ref.ref",
            "critic",
        )
        for cfg_key, value in (OmegaConf.select(cfg, section) or {}).items()
        if "micro_batch_size_per_gpu" in cfg_key and value is not None and (section != "critic" or use_critic)
    }
    assert sizes and all(micro % v == 0 for v in sizes.values())
    rng = random.Random(config_name)
    episodes = 2 * per_minibatch - 3  # a short last mini-batch (failed sessions)
    episode_of_row = [e for e in range(episodes) for _ in range(rng.randint(1, 3))]
    for dp in range(1, 9):
        plan = plan_minibatches(
            episode_of_row, per_minibatch, dp_size=dp, row_multiple=n, micro_batch_per_rank=micro
        )
        share = plan.rows_per_minibatch // dp
        for size in set(sizes.values()):
            for rows in (share, share * plan.n_minibatches):  # a mini-batch, the whole slice
                data = TensorDict({"x": torch.zeros(rows, 1)}, batch_size=[rows])
                tu.assign_non_tensor(data, use_dynamic_bsz=False, micro_batch_size_per_gpu=size)
                micro_batches, _ = prepare_micro_batches(data)  # verl's assertion
                assert sum(len(m) for m in micro_batches) == rows


def test_every_micro_batch_size_a_section_sets_counts_by_its_suffix():
    """Every ``*micro_batch_size_per_gpu`` key of a section counts, whatever its prefix: a key that is only in
    verl's CriticConfig (set with ``+critic.ppo_infer_micro_batch_size_per_gpu``) as much as the YAML's; another
    key's interpolation that does not resolve is never read; dynamic batch sizes and a disabled critic count none."""
    cfg = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "actor": {
                    "use_dynamic_bsz": False,
                    "ppo_micro_batch_size_per_gpu": 2,
                    "other": "${missing.key}",
                },
                "rollout": {"log_prob_use_dynamic_bsz": False, "log_prob_micro_batch_size_per_gpu": None},
                "ref": {"log_prob_use_dynamic_bsz": True, "log_prob_micro_batch_size_per_gpu": 7},
            },
            "critic": {
                "use_dynamic_bsz": False,
                "ppo_micro_batch_size_per_gpu": 2,
                "forward_micro_batch_size_per_gpu": "${.ppo_micro_batch_size_per_gpu}",
                "ppo_infer_micro_batch_size_per_gpu": 3,
            },
        }
    )
    # lcm(2, 2, 2, 3) = 6; the ref's 7 is dynamic, the rollout's is unset
    assert trainer_module.micro_batch_multiple(cfg, use_critic=True) == 6
    assert trainer_module.micro_batch_multiple(cfg, use_critic=False) == 2
