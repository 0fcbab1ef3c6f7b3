"""Every long phase shows progress with an ETA (issue 35): the plain-line form used on a pipe, by hand-worked
numbers, and the phases that use it (SFT, rollouts/evaluation) printing it."""

from __future__ import annotations

import math

import pytest

from agentcredit import progress as progress_module
from agentcredit.progress import Progress, eta_seconds, format_duration


def test_eta_is_the_mean_rate_times_what_is_left():
    assert eta_seconds(4, 10, 20.0) == pytest.approx(30.0)  # 5 s per unit, 6 left
    assert eta_seconds(10, 10, 20.0) == 0.0
    assert math.isnan(eta_seconds(0, 10, 3.0))  # no rate yet


@pytest.mark.parametrize(
    "seconds, text", [(0.4, "0s"), (42, "42s"), (185, "3m05s"), (3720, "1h02m"), (math.nan, "?")]
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


@pytest.fixture
def plain(monkeypatch):
    """A non-terminal stdout: the lines Progress prints, captured."""
    printed: list[str] = []
    monkeypatch.setattr(progress_module, "live_console", lambda: False)
    monkeypatch.setattr(progress_module, "line_buffered_stdout", lambda: None)
    monkeypatch.setattr(progress_module, "progress_line", printed.append)
    return printed


def test_plain_lines_are_throttled_and_the_last_is_always_printed(plain):
    now = [100.0]
    with Progress("sft", total=5, unit="steps", every=10.0, clock=lambda: now[0]) as bar:
        for _ in range(5):
            now[0] += 4.0  # 4 s per step: lines at steps 1, 4 (12 s after step 1's) and 5 (the last)
            bar.advance(info="loss 0.5")
    assert plain == [
        "sft 1/5 steps (20%), 4s elapsed, ETA 16s: loss 0.5",
        "sft 4/5 steps (80%), 16s elapsed, ETA 4s: loss 0.5",
        "sft 5/5 steps (100%), 20s elapsed, ETA 0s: loss 0.5",
    ]


def test_a_resumed_phase_estimates_from_this_process_only(plain):
    now = [0.0]
    with Progress("grpo", total=10, unit="steps", every=0, initial=6, clock=lambda: now[0]) as bar:
        now[0] = 30.0
        bar.advance()
    # 1 step in 30 s, 3 left: 90 s (counting the 6 checkpointed steps as done in 30 s would say 15 s)
    assert plain == ["grpo 7/10 steps (70%), 30s elapsed, ETA 1m30s"]


def test_disabled_progress_prints_nothing(plain):
    with Progress("eval", total=3, enabled=False) as bar:
        bar.advance(3)
    assert plain == [] and bar.done == 3


def test_sft_and_evaluation_report_progress(plain):
    """The phases that used to print nothing for minutes: SFT steps and episode rollouts (evaluation, warm-up)."""
    from train_helpers import EXAMPLES

    from agentcredit.config import load_config
    from agentcredit.environment import build_environment
    from agentcredit.models.loading import load_base_model
    from agentcredit.rollout.run import run_episodes
    from agentcredit.train.sft import demonstrations, sft

    config = load_config("grpo-arith-tools", ["model.name=tiny"])
    model, tokenizer = load_base_model("tiny", seed=0)
    env = build_environment(config)
    try:
        examples = list(EXAMPLES)[:3]
        trees = demonstrations(env, tokenizer, examples, config.protocol.name)
        sft(model, trees, pad_id=tokenizer.pad_token_id or 0, batch_trajectories=2, progress=True)
        run_episodes(
            model, tokenizer, env, examples, max_new_tokens=8, max_episode_tokens=64, progress="eval test"
        )
    finally:
        env.close()
    sft_lines = [ln for ln in plain if ln.startswith("sft ")]
    eval_lines = [ln for ln in plain if ln.startswith("eval test ")]
    steps = -(-len(trees) // 2)
    assert sft_lines[-1].startswith(f"sft {steps}/{steps} steps (100%)") and " ETA " in sft_lines[-1]
    assert sft_lines[-1].split(": ")[-1].startswith("loss ")
    n = len(examples)
    assert eval_lines[-1].startswith(f"eval test {n}/{n} questions (100%)"), plain
