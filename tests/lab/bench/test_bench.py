"""Benchmark plumbing: budgets, phase token counting, GRPO reference, FLOP accounting (hand-worked)."""

from __future__ import annotations

import time

import pytest
import torch

from agentcredit.lab.bench.flops import matmul_flops, phase_flops, phase_fractions
from agentcredit.lab.bench.train import (
    PhaseTokens,
    budget_overrides,
    non_embedding_parameters,
    reference_times,
)


def test_budget_overrides_give_the_same_leaves_per_prompt():
    assert budget_overrides("independent", prompts=2, episodes=4) == [
        "rollout.prompts_per_step=2",
        "rollout.n=4",
    ]
    # entropy-guided: n0 full episodes + n forks = n0 + n leaves
    assert budget_overrides("entropy_guided", prompts=2, episodes=4)[1:] == ["rollout.n0=1", "rollout.n=3"]
    assert budget_overrides("step_forks", prompts=3, episodes=4) == [
        "rollout.prompts_per_step=3",
        "rollout.n=4",
    ]
    with pytest.raises(ValueError, match="episodes"):
        budget_overrides("independent", prompts=1, episodes=1)
    with pytest.raises(ValueError, match="strategy"):
        budget_overrides("beam", prompts=1, episodes=2)


class _Holder:
    """A stand-in trainer: three phase methods that run the model."""

    def __init__(self, model):
        self.model = model

    def rollout(self):
        self.model(input_ids=torch.zeros(3, 4, dtype=torch.long))

    def compute_signals(self):
        self.model(input_ids=torch.zeros(2, 5, dtype=torch.long))

    def update(self):
        self.model(input_ids=torch.zeros(1, 7, dtype=torch.long))


def test_phase_tokens_attribute_forward_tokens_to_phases(tiny):
    model, _ = tiny
    counter = PhaseTokens()
    counter.hook(model)
    holder = _Holder(model)
    counter.wrap(holder)
    with torch.no_grad():
        holder.rollout()
        holder.compute_signals()
        holder.update()
        model(input_ids=torch.zeros(1, 9, dtype=torch.long))  # outside any phase: not counted
    counter.close()
    assert counter.tokens == {"rollout": 12, "signals": 10, "update": 7}
    with torch.no_grad():
        holder.rollout()
    assert counter.tokens["rollout"] == 12  # hooks removed


def test_phase_tokens_time_each_phase_in_cpu_seconds_and_keep_the_rollout_stats():
    """Issue 55: the TRL comparison reads each phase's process CPU seconds and the engine's generation CPU."""

    class Trainer:
        def rollout(self):
            end = time.process_time() + 0.05
            while time.process_time() < end:
                pass
            return [], {"rollout/generation_cpu_seconds": 0.04}

        def compute_signals(self):
            return None

        def update(self):
            return None

    counter = PhaseTokens()
    trainer = Trainer()
    counter.wrap(trainer)
    assert trainer.rollout() == ([], {"rollout/generation_cpu_seconds": 0.04})
    trainer.update()
    assert counter.cpu["rollout"] >= 0.05 and counter.cpu["signals"] == 0.0
    assert counter.rollout_stats == {"rollout/generation_cpu_seconds": 0.04}
    counter.reset()
    assert counter.cpu == {"rollout": 0.0, "signals": 0.0, "update": 0.0} and counter.rollout_stats == {}


def test_non_embedding_parameters_of_the_tiny_llama(tiny):
    model, tokenizer = tiny
    total = sum(p.numel() for p in model.parameters())
    assert non_embedding_parameters(model) == total - len(tokenizer) * model.config.hidden_size


def test_reference_is_the_mean_of_both_grpo_measurements():
    first = {"seconds_per_step": 10.0, "rollout_seconds": 6.0, "signals_seconds": 1.0, "update_seconds": 3.0}
    last = {"seconds_per_step": 14.0, "rollout_seconds": 8.0, "signals_seconds": 1.0, "update_seconds": 5.0}
    assert reference_times(first, last) == {
        "seconds_per_step": 12.0,
        "rollout_seconds": 7.0,
        "signals_seconds": 1.0,
        "update_seconds": 4.0,
    }
    assert reference_times(first, None) == first


def test_phase_flops_and_fractions_by_hand():
    # N = 1e8: rollout 100 tokens -> 2e10, update 50 tokens -> 6 * 1e8 * 50 = 3e10
    assert phase_flops({"rollout": 100, "update": 50}, 10**8) == {"rollout": 2e10, "update": 3e10}
    bench = {
        "non_embedding_parameters": 10**8,
        "methods": {
            "grpo": {
                "tokens_per_step": {"rollout": 100, "signals": 200, "update": 50},
                "rollout_seconds": 2.0,
                "signals_seconds": 1.0,
                "update_seconds": 3.0,
            }
        },
    }
    out = phase_fractions(bench, peak_flops=1e11)["grpo"]
    assert (
        out["rollout"]["flops_per_second"] == pytest.approx(1e10)
        and out["rollout"]["fraction_of_peak"] == 0.1
    )
    assert out["signals"]["fraction_of_peak"] == pytest.approx(0.4)  # 4e10 FLOPs in 1 s
    assert out["update"]["fraction_of_peak"] == pytest.approx(0.1)  # 3e10 FLOPs in 3 s
    with pytest.raises(ValueError, match="unknown phase"):
        phase_flops({"decode": 1}, 1)
    with pytest.raises(ValueError, match="positive"):
        phase_fractions(bench, 0)


def test_matmul_flops_measures_something():
    out = matmul_flops(torch.float32, n=64, trials=2, min_seconds=0.01)
    assert out["best"] >= out["median"] > 0 and out["n"] == 64
    with pytest.raises(ValueError):
        matmul_flops(n=0)


def test_bench_train_table_names_the_rollout_backend():
    """Issue 33: `bench train` says which rollout backend ran."""
    from agentcredit.lab.bench.train import format_bench_table

    entry = {
        "seconds_per_step": 2.0,
        "ratio_to_grpo": 1.0,
        "episodes_per_step": 8,
        "generated_tokens_per_step": 100,
        "update_tokens_forwarded": 10,
        "update_tokens_in_rows": 20,
        "settings": {"epochs": 1, "rollout_backend": "hf"},
        **{f"{p}_seconds": 1.0 for p in ("rollout", "signals", "update")},
        **{f"{p}_ratio_to_grpo": 1.0 for p in ("rollout", "signals", "update")},
    }
    result = {
        "methods": {"grpo": entry},
        "non_embedding_parameters": 1000,
        "model": "tiny",
        "task": "arith-tools",
        "prompts": 2,
        "episodes_per_prompt": 4,
        "steps": 1,
        "torch_threads": 1,
        "load_average_start": [1.0],
        "load_average_end": [1.0],
    }
    assert "rollout backend hf;" in format_bench_table(result)
