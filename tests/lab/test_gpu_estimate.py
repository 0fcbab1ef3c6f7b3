"""The one-GPU estimate of a study's budget where no step was timed on a GPU: each part by hand, and the report's
labelling (an estimate beside the measured CPU hours; none when the steps were timed on a GPU)."""

from __future__ import annotations

import json

import pytest

from agentcredit.lab import gpu_estimate as g
from agentcredit.lab.gpu_estimate import (
    ArmPlan,
    EpisodeShape,
    episode_bounds,
    episode_means,
    estimate_hours,
    evaluation_seconds,
    forward_flops_per_token,
    gpu_estimate_range,
    rollout_rounds,
    shape_from_json,
    step_seconds,
    study_gpu_estimate,
)
from agentcredit.lab.study import load_study
from agentcredit.lab.study_report import preflight_sections
from agentcredit.lab.study_spec import StudyLayout

# SmolLM2-135M's config.json (the embedded model), the fields the shape reads
SMOLLM2 = {
    "num_hidden_layers": 30,
    "hidden_size": 576,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "head_dim": 64,
}


def test_the_assumptions_are_the_named_bands():
    # pinned: a change of an assumption is a change of every published estimate
    assert g.FORWARD_SECONDS == (0.010, 0.050)
    assert g.UTILISATION == (0.01, 0.10)
    assert g.PEAK_FLOPS == 989e12
    assert g.SCORING_PASSES == (1, 3)
    assert g.TOOL_SECONDS == (0.092, 0.149)
    assert "not measured" in g.ASSUMPTIONS["source"]


def test_smollm2_forward_flops_per_token_by_hand():
    # per layer: q, o 576 x 576 = 331,776 each; k, v 576 x (3 x 64) = 110,592 each; MLP 3 x 576 x 1,536 =
    # 2,654,208: 3,538,944 parameters, x 30 layers = 106,168,320; LM head 576 x 49,152 = 28,311,552;
    # 134,479,872 parameters x 2 FLOPs
    assert forward_flops_per_token(shape_from_json(SMOLLM2)) == 268_959_744


def test_episode_bounds_by_hand():
    low, high = episode_bounds(80, 40, 8, 2, max_episode_tokens=320, max_turns=15, tool_calls=0.5)
    assert low == EpisodeShape(tokens=128, forwards=42, tool_calls=0.5)
    # the policy at its cap grows 320 / 40 = 8x: observations 64 tokens, 4 tool calls; 320 + 15 forwards
    assert high == EpisodeShape(tokens=464, forwards=335, tool_calls=4.0)


def test_step_seconds_by_hand():
    ep = EpisodeShape(tokens=100, forwards=50, tool_calls=1)
    kw = dict(
        flops_per_token=2e8, update_passes=2, scoring_passes=1, forward_seconds=0.02, flops_per_second=1e13
    )
    # one batch: 50 x 0.02 + 1 x 0.1 = 1.1 s; 16 x 100 tokens x 2e8 x (3 x 2 + 1) = 2.24e12 FLOPs / 1e13 = 0.224 s
    assert step_seconds(ep, episodes=16, max_batch=64, tool_seconds=0.1, **kw) == pytest.approx(1.324)
    # two batches one after another: 2 x 1.1 + 0.224
    assert step_seconds(ep, episodes=16, max_batch=8, tool_seconds=0.1, **kw) == pytest.approx(2.424)
    with pytest.raises(ValueError, match="positive FLOP rate"):
        step_seconds(ep, episodes=16, max_batch=8, **{**kw, "flops_per_second": 0})


def test_rollout_rounds_by_hand():
    assert rollout_rounds("independent", 4) == 1
    assert rollout_rounds("portool", 8, 1) == 1  # its rounds are one step each, along one episode's depth
    assert rollout_rounds("entropy_guided", 7, 1) == 8  # the n0 episodes, then 7 forks one by one
    assert rollout_rounds("entropy_guided", 7, 3) == 4  # 1 + ceil(7 / 3)


def test_sequential_rounds_multiply_the_rollout_path_only():
    ep = EpisodeShape(tokens=100, forwards=50, tool_calls=0)
    kw = dict(
        episodes=8, max_batch=64, flops_per_token=2e8, update_passes=1, scoring_passes=1, forward_seconds=0.02
    )
    # 8 rounds x 50 x 0.02 = 8 s; 8 x 100 x 2e8 x 4 = 6.4e11 FLOPs / 1e13 = 0.064 s (the tokens do not grow)
    assert step_seconds(ep, flops_per_second=1e13, rounds=8, **kw) == pytest.approx(8.064)


def test_evaluation_seconds_by_hand():
    ep = EpisodeShape(tokens=100, forwards=50, tool_calls=1)
    kw = dict(flops_per_token=2e8, forward_seconds=0.02, flops_per_second=1e13, tool_seconds=0.1)
    # ceil(130 / 64) = 3 batches x 1.1 s; 130 x 100 x 2e8 = 2.6e12 FLOPs / 1e13 = 0.26 s
    assert evaluation_seconds(ep, questions=130, max_batch=64, **kw) == pytest.approx(3.56)
    assert evaluation_seconds(ep, questions=0, max_batch=64, **kw) == 0.0


def test_episode_means_by_hand():
    records = [
        {
            "tool_calls": 1,
            "segments": [
                {"role": "prompt", "tokens": 80},
                {"role": "policy", "tokens": 30},
                {"role": "observation", "tokens": 10},
                {"role": "policy", "tokens": 10},
            ],
        },
        {"tool_calls": 0, "segments": [{"role": "prompt", "tokens": 90}, {"role": "policy", "tokens": 20}]},
    ]
    assert episode_means(records) == {
        "prompt": 85.0,
        "policy": 30.0,  # (30 + 10 + 20) / 2
        "observation": 5.0,
        "prefills": 1.5,
        "tool_calls": 0.5,
    }


def test_estimate_hours_both_ends_by_hand():
    arm = ArmPlan(
        episodes=16, max_batch=64, max_episode_tokens=40, max_turns=1, update_passes=1, critic_only=0
    )
    means = {"prompt": 80, "policy": 40, "observation": 0, "prefills": 1, "tool_calls": 0}
    e = estimate_hours(
        {"a": arm},
        flops_per_token=1e8,
        means=means,
        questions=64,
        seeds=2,
        steps=10,
        eval_every=5,
        seeds_to_decide=4,
    )
    assert e["kind"] == "estimate" and e["inputs"]["evaluations_per_run"] == 2
    # low: 41 forwards x 10 ms = 0.41 s; 16 x 120 tokens x 1e8 x (3 + 1 scoring) = 7.68e11 FLOPs at 10% of
    # 989e12 = 9.89e13 FLOP/s: 0.0077654 s. Evaluation: 0.41 + 64 x 120 x 1e8 / 9.89e13 = the same.
    step = 0.41 + 7.68e11 / 9.89e13
    assert e["low"]["step_seconds"]["a"] == pytest.approx(step)
    assert e["low"]["eval_seconds"] == pytest.approx(step)
    # 2 seeds x (10 steps + 2 evaluations) x 0.4177654 s = 10.02637 s
    assert e["low"]["planned_seconds"]["total"] == pytest.approx(24 * step)
    assert e["low"]["planned_gpu_hours"] == pytest.approx(24 * step / 3600)
    assert e["low"]["gpu_hours_to_decide"] == pytest.approx(2 * 24 * step / 3600)
    # high (the caps equal the mean here): 41 x 50 ms = 2.05 s; 1.92e11 FLOPs per pass at 1% of the peak
    # (9.89e12 FLOP/s) x (3 + 3 scoring) passes = 0.1164813 s; evaluation 2.05 + 7.68e11 / 9.89e12 = 2.1276542
    high_step, high_eval = 2.05 + 1.152e12 / 9.89e12, 2.05 + 7.68e11 / 9.89e12
    assert e["high"]["step_seconds"]["a"] == pytest.approx(high_step)
    assert e["high"]["eval_seconds"] == pytest.approx(high_eval)
    assert e["high"]["planned_seconds"]["total"] == pytest.approx(2 * (10 * high_step + 2 * high_eval))


def test_the_range_reads_both_ends():
    e = {
        "low": {"planned_gpu_hours": 0.1356, "gpu_hours_to_decide": None},
        "high": {"planned_gpu_hours": 4.347},
    }
    assert gpu_estimate_range(e) == "0.14–4.3"
    assert gpu_estimate_range(e, "gpu_hours_to_decide") == "–"


# ------------------------------------------------------------------------------------------------ the report
def _study(tmp_path):
    layout = StudyLayout(load_study("studies/arith-tool-can-hurt.yaml"), tmp_path)
    episode = {
        "tool_calls": 1,
        "segments": [
            {"role": "prompt", "tokens": 80},
            {"role": "policy", "tokens": 40},
            {"role": "observation", "tokens": 8},
        ],
    }
    (tmp_path / "start").mkdir()
    for h in layout.spec.heldout:
        (tmp_path / "start" / f"eval_{h.name}_episodes.jsonl").write_text(json.dumps(episode) + "\n")
    for name in ("sft-model", "model"):
        (tmp_path / "start" / name).mkdir()
        (tmp_path / "start" / name / "config.json").write_text(json.dumps(SMOLLM2))
    return layout


def _record(unit: str) -> dict:
    timing = {"seconds": 70.0, "prompts": 4, "n": 4}
    if unit == "GPU":
        timing = {**timing, "seconds": 5.0, "device": "cuda:0", "device_name": "NVIDIA H100"}
    key = unit.lower()
    return {
        "timing": {a: dict(timing) for a in ("grpo", "ppo", "carl-segment")},
        "budget": {
            "eval_seconds": 250.0,
            "planned_seconds": {"grpo": 3600.0, "ppo": 3600.0, "carl-segment": 3600.0, "total": 10800.0},
            **({"unit": "GPU"} if unit == "GPU" else {}),
            f"planned_{key}_hours": 3.0,
            "seeds": 3,
            "seeds_to_decide": 6,
            f"{key}_hours_to_decide": 6.0,
            "undecidable_claims": [],
        },
    }


def _budget_text(sections) -> tuple[str, list]:
    i = next(k for k, s in enumerate(sections) if s[0].startswith("Budget"))
    return sections[i][2], sections[i + 1][2]


def test_a_cpu_budget_shows_the_gpu_estimate_labelled_beside_it(tmp_path):
    layout = _study(tmp_path)
    record = _record("CPU")
    estimate = study_gpu_estimate(layout, record)
    assert estimate["inputs"]["questions_per_evaluation"] == 2  # one episode per held-out set here
    assert estimate["inputs"]["arms"]["ppo"]["update_passes"] == 2  # PPO's separate critic is a second model
    text, (header, rows) = _budget_text(preflight_sections(layout, record, {}))
    assert "**3.0 CPU hours**" in text
    assert f"**GPU hours (estimate, not measured): {gpu_estimate_range(estimate)}**" in text
    assert f"({gpu_estimate_range(estimate, 'gpu_hours_to_decide')} to decide)" in text
    assert "Assumptions (ours, not measurements)" in text and "replaces this estimate" in text
    assert "the record predates the stored estimate" in text  # computed here: this record holds none
    assert "planned (GPU h, estimate, not measured)" in header
    assert rows[-1][3] == gpu_estimate_range(estimate)
    # a record that stores its estimate is shown as stored
    record["budget"]["gpu_estimate"] = estimate
    text, _ = _budget_text(preflight_sections(layout, record, {}))
    assert "predates" not in text and gpu_estimate_range(estimate) in text


def test_steps_timed_on_a_gpu_show_measured_gpu_hours_and_no_estimate(tmp_path):
    layout = _study(tmp_path)
    record = _record("GPU")
    assert study_gpu_estimate(layout, record) is None
    text, (header, _) = _budget_text(preflight_sections(layout, record, {}))
    assert "**3.0 GPU hours**" in text and "one GPU: NVIDIA H100" in text
    assert "estimate" not in text and "planned (GPU h)" in header
    assert not any("estimate" in h for h in header)


def test_a_missing_start_file_is_named_instead_of_an_estimate(tmp_path):
    layout = _study(tmp_path)
    (tmp_path / "start" / "model" / "config.json").unlink()
    record = _record("CPU")
    text, _ = _budget_text(preflight_sections(layout, record, {}))
    assert "not estimated" in text and "config.json" in text
