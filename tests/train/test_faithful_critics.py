"""PPO and TIPS: a critic that learns (issue 31).

* The presets follow TIPS §4 "Baselines" (tips.txt l.142): a separate critic model at 10x the policy's learning
  rate; and, not the paper's (Table 10: ``trainer.critic_warmup 0``), critic-only steps first.
* The policy's update does not depend on the value loss's scale: with a separate critic the value loss never
  reaches the policy's weights, and the two gradients are clipped each on its own.
* A run logs the first step whose critic explained variance is > 0; a step where it is undefined logs none.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from train_helpers import EXAMPLES, SMALL

from agentcredit.config import ConfigError, load_config
from agentcredit.models.loading import load_base_model
from agentcredit.rollout.tree import RolloutTree
from agentcredit.train.metrics import signal_metrics
from agentcredit.train.signals import Signals
from agentcredit.train.trainer import Trainer
from tests.rollout.rollout_helpers import one_thread

PIN = Path(__file__).parent / "data" / "pinned_steps.json"


@pytest.fixture(scope="module")
def ppo_trees() -> list[RolloutTree]:
    """The PPO step's stored trees of the pinned-step test (sampled by the fitted tiny model): both rewards."""
    return [RolloutTree.from_dict(t) for t in json.loads(PIN.read_text())["ppo"]["trees"]]


def _examples(trees):
    by_id = {e.id: e for e in EXAMPLES}
    return [by_id[t.prompt_id] for t in trees]


def _policy_after_one_step(trees, overrides) -> dict[str, torch.Tensor]:
    """One update from a value head with non-zero weights: a zero-initialised head passes no gradient back
    (dL/dh = dL/dV * W = 0), and would hide whether the value loss reaches the policy's weights. On one thread:
    the callers compare two updates bit for bit, and two threads' reduction order can differ between two runs."""
    config = load_config("ppo-arith-tools", [*SMALL, *overrides])
    model, tokenizer = load_base_model("tiny", seed=0)
    with one_thread():
        trainer = Trainer(config, model=model, tokenizer=tokenizer, examples=list(EXAMPLES), log=False)
        try:
            with torch.no_grad():
                w = trainer.value_head.proj.weight
                w.copy_(torch.randn(w.shape, generator=torch.Generator().manual_seed(0)) * 0.05)
            trainer.learn(trees, _examples(trees))
            return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        finally:
            trainer.close()


@pytest.mark.parametrize("preset", ["ppo-arith-tools", "tips-kb-multihop"])
def test_presets_use_the_papers_separate_critic_and_warm_it_first(preset):
    cfg = load_config(preset)
    assert cfg.algorithm.critic_model == "separate"  # TIPS §4 "Baselines": a value model of its own
    # "Policy and value learning rates are 1e-6 and 1e-5" (tips.txt l.142): the critic's is 10x the policy's,
    # both CPU-scaled by the same factor
    assert cfg.optim.head_lr == pytest.approx(10 * cfg.optim.lr)
    assert cfg.optim.grad_clip == 1.0  # Table 10: actor.grad_clip 1.0
    assert cfg.train.critic_warmup > 0  # not the paper's 0 (Table 10): labelled in the preset


def test_separate_critic_needs_a_critic():
    with pytest.raises(ConfigError, match="critic_model"):
        load_config("grpo-arith-tools", ["algorithm.critic_model=separate"])


def test_policy_update_does_not_depend_on_the_value_loss_scale(ppo_trees):
    """The value loss x1000 leaves the policy's parameters after the update exactly as they were (issue 31).

    Before the fix the PPO preset's value head shared the policy's backbone and one gradient clip covered both:
    the value loss moved the backbone and set the policy's step size (tips update/grad_norm 188.5 on the pinned
    step, of which the policy's own was 1.2)."""
    base = _policy_after_one_step(ppo_trees, ["algorithm.value_coef=0.5"])
    scaled = _policy_after_one_step(ppo_trees, ["algorithm.value_coef=500"])
    start, _ = load_base_model("tiny", seed=0)
    moved = [n for n, p in start.named_parameters() if not torch.equal(p, base[n])]
    assert moved, "the policy did not train"
    assert all(torch.equal(base[n], scaled[n]) for n in base)


def test_a_shared_critic_still_lets_the_value_loss_move_the_policy(ppo_trees):
    """The variant the independence above is about: a head on the policy's backbone (carl-segment's design)."""
    shared = ["algorithm.critic_model=shared"]
    base = _policy_after_one_step(ppo_trees, [*shared, "algorithm.value_coef=0.5"])
    scaled = _policy_after_one_step(ppo_trees, [*shared, "algorithm.value_coef=500"])
    assert any(not torch.equal(base[n], scaled[n]) for n in base)


def test_gradients_are_clipped_separately(ppo_trees):
    """Policy and critic norms are measured (and clipped) each on its own: a tiny clip still lets both move."""
    config = load_config("ppo-arith-tools", [*SMALL, "optim.grad_clip=1e-3", "algorithm.value_coef=1000"])
    model, tokenizer = load_base_model("tiny", seed=0)
    trainer = Trainer(config, model=model, tokenizer=tokenizer, examples=list(EXAMPLES), log=False)
    try:
        m = trainer.learn(ppo_trees, _examples(ppo_trees)).metrics
    finally:
        trainer.close()
    assert m["update/critic_grad_norm"] > 100 * m["update/grad_norm"] > 0  # value x1000: its own norm


def test_critic_warmup_trains_the_separate_critic_and_logs_when_ev_turns_positive(ppo_trees):
    """Step 1 (critic-only) fits the separate critic, not the policy; step 2's EV on the same episodes is > 0, and
    from then on every step logs critic/ev_first_positive_step = 2, also after a resume."""
    config = load_config(
        "ppo-arith-tools",
        [*SMALL, "train.critic_warmup=1", "optim.head_lr=3e-3", "algorithm.value_clip=null"],
    )
    model, tokenizer = load_base_model("tiny", seed=0)
    trainer = Trainer(config, model=model, tokenizer=tokenizer, examples=list(EXAMPLES), log=False)
    try:
        policy = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        critic = {n: p.detach().clone() for n, p in trainer.critic_model.named_parameters()}
        first = trainer.learn(ppo_trees, _examples(ppo_trees)).metrics
        assert first["update/critic_only"] == 1.0
        assert all(torch.equal(p, policy[n]) for n, p in trainer.model.named_parameters())
        assert any(not torch.equal(p, critic[n]) for n, p in trainer.critic_model.named_parameters())
        assert first["critic/explained_variance"] == pytest.approx(0.0, abs=1e-6)  # V = 0 at init
        assert "critic/ev_first_positive_step" not in first
        second = trainer.learn(copy.deepcopy(ppo_trees), _examples(ppo_trees)).metrics
        assert second["critic/explained_variance"] > 0
        assert second["critic/ev_first_positive_step"] == 2.0
        state = trainer.state_dict()
    finally:
        trainer.close()
    model, tokenizer = load_base_model("tiny", seed=0)
    resumed = Trainer(config, model=model, tokenizer=tokenizer, examples=list(EXAMPLES), log=False)
    try:
        resumed.load_state_dict(state)
        assert resumed.ev_positive_step == 2
        assert all(
            torch.equal(p, trainer.critic_model.state_dict()[n])
            for n, p in resumed.critic_model.state_dict().items()
        )
    finally:
        resumed.close()


def _batch(returns: list[float], values: list[float]) -> SimpleNamespace:
    n = len(returns)
    return SimpleNamespace(
        policy_mask=torch.ones(1, n, dtype=torch.bool),
        old_entropy=None,
        ref_logp=None,
        old_logp=torch.zeros(1, n),
        behaviour_logp=torch.zeros(1, n),
        value_mask=torch.ones(1, n, dtype=torch.bool),
        returns=torch.tensor([returns]),
        old_values=torch.tensor([values]),
    )


def test_explained_variance_is_not_logged_where_it_is_undefined():
    """Every return equal (e.g. every episode got the same reward): Var(G) = 0, EV undefined -> absent, not 0.0."""
    out = signal_metrics(_batch([1.0, 1.0, 1.0], [0.2, 0.5, 0.9]), Signals(values=None, entropy=None))
    assert "critic/explained_variance" not in out
    assert out["critic/value_mean"] == pytest.approx(1.6 / 3)


def test_explained_variance_by_hand():
    # G = [0, 1, 1, 0], V = [0.5, 0.5, 1, 0]: Var(G) = 0.25; G - V = [-0.5, 0.5, 0, 0], Var = 0.125 -> EV = 0.5
    out = signal_metrics(
        _batch([0.0, 1.0, 1.0, 0.0], [0.5, 0.5, 1.0, 0.0]), Signals(values=None, entropy=None)
    )
    assert math.isclose(out["critic/explained_variance"], 0.5, rel_tol=1e-6)


def test_compare_shows_when_the_critic_first_explains_anything(tmp_path):
    """``agentcredit compare``: the first step with EV > 0, read from the per-step log ("never" if none; "–" for
    a run without a critic). An undefined EV (absent) or an old log's 0.0 does not count."""
    from agentcredit.eval.report import ev_first_positive_step, load_run, metrics_table

    steps = [
        {"step": 1, "critic/value_mean": 0.0},  # EV undefined: not logged
        {"step": 2, "critic/value_mean": 0.1, "critic/explained_variance": 0.0},
        {"step": 3, "critic/value_mean": 0.2, "critic/explained_variance": 0.31},
    ]
    assert ev_first_positive_step(steps) == 3 and ev_first_positive_step(steps[:2]) is None
    runs = {}
    for name, records in (("ppo", steps), ("stuck", steps[:2]), ("grpo", [{"step": 1, "accuracy": 0.5}])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        runs[name] = load_run(tmp_path / name)
    header, rows = metrics_table(list(runs.values()))
    col = header.index("critic EV > 0 from step")
    assert [row[col] for row in rows] == ["3", "never", "–"]


def test_rollout_logp_gap_by_hand():
    """The rollout-vs-trainer log-prob gap (issue 33): rollout log-probs [-0.1, 0, 0.3, 9] against the trainer's
    [0, 0, 0, 0] on the policy tokens [T, T, T, F]: |delta| = [0.1, 0, 0.3] -> mean 0.4 / 3, max 0.3 (the masked
    observation token's 9 does not count)."""
    batch = _batch([0.0, 1.0, 1.0, 0.0], [0.5, 0.5, 1.0, 0.0])
    batch.policy_mask = torch.tensor([[True, True, True, False]])
    batch.behaviour_logp = torch.tensor([[-0.1, 0.0, 0.3, 9.0]])
    out = signal_metrics(batch, Signals(values=None, entropy=None))
    assert out["rollout/logp_gap"] == pytest.approx(0.4 / 3)
    assert out["rollout/logp_gap_max"] == pytest.approx(0.3)
