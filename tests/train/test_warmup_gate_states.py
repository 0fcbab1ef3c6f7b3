"""carl-segment's gate judges the critic RL reads (issue 48): V on the held-out episodes' boundary states rendered
with the PPO prompt (``optional``), not in the warm-up's forced-tool / no-tool prompts the pairs were trained in."""

from __future__ import annotations

import copy

from train_helpers import EXAMPLES, SMALL

import agentcredit.train.warmup as warmup_module
from agentcredit.config import load_config
from agentcredit.environment import build_environment
from agentcredit.models.heads import BoundaryValueHead
from agentcredit.train.warmup import WarmupSettings, warmup


def _prompt(config, tokenizer, question):
    env = build_environment(config)
    try:
        return env.protocol.prompt(env.protocol.new_episode(question), tokenizer)
    finally:
        env.close()


def test_the_gate_is_computed_on_the_states_rl_reads(fitted_codefence, monkeypatch):
    model, tokenizer = fitted_codefence
    model = copy.deepcopy(model)
    config = load_config("carl-segment-arith-tools", SMALL)
    assert config.protocol.options["prompt"] == "optional"  # the prompt PPO rolls out with
    calls = []
    real_gate = warmup_module._gate

    def spy(model, head, batch, trees, owners, *rest):
        out = real_gate(model, head, batch, trees, owners, *rest)
        calls.append(([t.segment(0).text for t in trees], [o.question for o in owners], out))
        return out

    monkeypatch.setattr(warmup_module, "_gate", spy)
    settings = WarmupSettings(tier_samples=1, rollouts_per_mode=1, head_epochs=2, holdout_fraction=0.5)
    report = warmup(
        model,
        BoundaryValueHead(model.config.hidden_size),
        tokenizer,
        config,
        list(EXAMPLES),
        settings,
        log=lambda _: None,
    )
    decisive = [c for c in calls if c[2] is report.gate]
    assert len(decisive) == 1, "the gate's statistics come from one evaluation"
    prompts, questions, _ = decisive[0]
    assert prompts and all(
        p == _prompt(config, tokenizer, q) for p, q in zip(prompts, questions, strict=True)
    )
    assert report.extra["gate_states"] == "rl"
    # the warm-up's own prompts (forced-tool / no-tool) are kept beside it, as a secondary record
    others = [c for c in calls if c[2] is not report.gate]
    assert others and all(
        p != _prompt(config, tokenizer, q) for c in others for p, q in zip(c[0], c[1], strict=True)
    )
    assert report.extra["gate_on_warmup_prompts"] is others[0][2]
