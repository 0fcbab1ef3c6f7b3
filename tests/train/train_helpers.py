"""Shared pieces of the trainer tests: a tiny random Llama fitted on two demonstrations per protocol.

A random tiny model never writes an answer, so every reward would be 0 and every advantage 0. Fitting it for a
few dozen steps on two scripted arith-tools episodes (one easy, answered directly; one hard, computed with the
tool) makes it sample a mix of correct and wrong episodes at temperature 1 — real, non-zero advantages through
the real engine, protocols, sandbox and tool suite.
"""

from __future__ import annotations

import torch

from agentcredit.config import load_config
from agentcredit.credit.methods import BUILT_IN
from agentcredit.environment import build_environment
from agentcredit.models.loading import load_base_model
from agentcredit.tasks import Example
from agentcredit.train.sft import demonstrations, sft

EXAMPLES = [
    Example(
        "q-hard",
        "What is 17*23?",
        ["391"],
        "arith-tools",
        {"tier": "hard", "expression": "17*23", "metric": "numeric"},
    ),
    Example(
        "q-easy",
        "What is 3+4?",
        ["7"],
        "arith-tools",
        {"tier": "easy", "expression": "3+4", "metric": "numeric"},
    ),
]

# CPU-sized settings every trainer test starts from
SMALL = [
    "model.name=tiny",
    "rollout.prompts_per_step=2",
    "rollout.n=3",
    "rollout.n0=1",
    "rollout.max_new_tokens=40",
    "rollout.max_episode_tokens=96",
    "rollout.temperature=1.0",
    "optim.minibatch_size=0",
    "optim.epochs=1",
    "train.tensorboard=false",
    "train.save_every=0",
    # the PPO / TIPS presets open with critic-only steps (issue 31); one step of a trainer test exercises the
    # whole update, and tests/train/test_critic_warmup.py covers the warm-up
    "train.critic_warmup=0",
]

# a built-in method's one-step test runs its arith-tools preset with these overrides (none for most)
OVERRIDES = {
    "carl-segment": ["optim.epochs=2"],
    "carl-critical": ["rollout.n=4"],
    # root_is_fork=true (portool.md 8.6, not the paper's default): the tiny model's n = 3 trees fork mostly at the
    # root, so with the paper's fork set (from t = 1) the pinned step's stored trees, all failing, would give every
    # token a zero advantage and exercise nothing; the paper's default is tested on hand-built trees
    "portool": ["rollout.n=3", "rollout.t_max=3", "algorithm.portool.root_is_fork=true"],
}

# method name -> (preset, overrides) for one training step on the tiny model: every built-in method (found in
# agentcredit/credit/methods/, so a new one needs no line here), then compositions and variants
METHODS = {
    **{name: (f"{name}-arith-tools", OVERRIDES.get(name, [])) for name in BUILT_IN},
    # compositions the maths allows (issue 6)
    "carl-segment+tips": ("carl-segment-arith-tools", ["algorithm.method=carl-segment+tips"]),
    "portool+gear": (
        "portool-arith-tools",
        [
            "algorithm.method=portool+gear",
            "rollout.n=3",
            "rollout.t_max=3",
            "algorithm.portool.root_is_fork=true",
        ],
    ),
    "carl-critical+gear": (
        "carl-critical-arith-tools",
        ["algorithm.method=carl-critical+gear", "rollout.n=4"],
    ),
    "grpo-on-critical-tree": ("carl-critical-arith-tools", ["algorithm.method=grpo", "rollout.n=4"]),
    "gigpo-on-critical-tree": ("carl-critical-arith-tools", ["algorithm.method=gigpo", "rollout.n=4"]),
}

# the model's own tool calling (protocol chat) with the suite's calculator, for any preset (issue 15)
CHAT = ["protocol.name=chat", "protocol.options={max_segments: 3}", "tools.suite_tools=[math_calculation]"]


def tiny_demonstrations(config, tokenizer):
    """The scripted demonstrations of :data:`EXAMPLES` in ``config``'s protocol, one tree per example."""
    env = build_environment(config)
    try:
        trees = demonstrations(env, tokenizer, EXAMPLES, config.protocol.name)
    finally:
        env.close()
    assert len(trees) == len(EXAMPLES)
    return trees


def fit_tiny(preset: str, overrides=(), epochs: int = 100):
    torch.manual_seed(0)
    config = load_config(preset, [*SMALL, *overrides])
    model, tokenizer = load_base_model("tiny", seed=0)
    trees = tiny_demonstrations(config, tokenizer)
    sft(model, trees, pad_id=tokenizer.pad_token_id, epochs=epochs, batch_trajectories=2, lr=3e-3)
    return model, tokenizer


def one_step(config, model, tokenizer):
    """One training step of ``config`` on the fitted model: the trainer, its result and the weights before it."""
    from agentcredit.train.trainer import Trainer

    trainer = Trainer(config, model=model, tokenizer=tokenizer, examples=list(EXAMPLES), log=False)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    try:
        result = trainer.train_step()
    finally:
        trainer.close()
    return trainer, result, before


def assert_a_real_step(trainer, result, before) -> None:
    """What every one-step test checks: finite metrics, non-zero advantages, trained tokens, changed weights, and
    a loss that only ever touches policy tokens (prompt and observations never)."""
    import math

    m = result.metrics
    assert all(math.isfinite(v) for v in m.values()), {k: v for k, v in m.items() if not math.isfinite(v)}
    assert m["adv/nonzero_frac"] > 0, "the fitted model should sample both correct and wrong episodes"
    # a gradient, not a non-zero loss value: at the first epoch the ratio is exactly 1 (old log-probs come from the
    # same packed forward) and a loss of advantages that sum to zero can be exactly 0 while its gradient is not
    assert m["tokens/trained"] > 0 and m["update/grad_norm"] > 0
    changed = [
        n for n, p in trainer.model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])
    ]
    assert changed, "no trainable parameter changed"
    batch = result.batch
    assert not (batch.loss_mask & ~batch.policy_mask).any()
    assert (batch.advantages[~batch.policy_mask] == 0).all()
