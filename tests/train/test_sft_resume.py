"""SFT checkpoints every step and resumes with the same data order and weights (issue 32).

The PORTool regime study's start SFT takes longer than a session; before, a killed run lost every step.
"""

from __future__ import annotations

import copy

import pytest
import torch
from train_helpers import SMALL, tiny_demonstrations

from agentcredit.config import load_config
from agentcredit.models.loading import load_base_model
from agentcredit.train.sft import SFT_CHECKPOINT, SFTCheckpointMismatch, sft
from tests.rollout.rollout_helpers import one_thread


class _Stop(Exception):
    pass


@pytest.fixture(scope="module")
def setup():
    config = load_config("grpo-arith-tools", SMALL)
    model, tokenizer = load_base_model("tiny", seed=0)
    trees = tiny_demonstrations(config, tokenizer)
    return model, tokenizer, trees


def _train(model, trees, pad_id, **kwargs):
    """On one thread: the resume test compares two runs bit for bit (two threads' reduction order can differ)."""
    losses = []
    kwargs.setdefault("on_step", lambda _s, loss: losses.append(loss))
    with one_thread():
        result = sft(model, trees, pad_id=pad_id, epochs=3, batch_trajectories=1, lr=3e-3, seed=7, **kwargs)
    return result, losses


def test_a_resumed_sft_equals_an_uninterrupted_one(setup, tmp_path):
    base, tokenizer, trees = setup
    pad = tokenizer.pad_token_id
    whole = copy.deepcopy(base)
    reference, _ = _train(whole, trees, pad)
    assert len(reference.losses) >= 4

    stopped = copy.deepcopy(base)
    seen = []

    def stop_after_two(step, loss):
        seen.append(loss)
        if step == 2:
            raise _Stop

    with pytest.raises(_Stop):
        _train(stopped, trees, pad, checkpoint_dir=tmp_path, on_step=stop_after_two)
    assert (tmp_path / SFT_CHECKPOINT).is_file() and not list(tmp_path.glob("*.tmp"))

    resumed = copy.deepcopy(base)  # a fresh process: the base weights, the checkpoint on disk
    lines = []
    result, after = _train(resumed, trees, pad, checkpoint_dir=tmp_path, log=lines.append)
    steps = len(reference.losses)
    assert lines == [f"SFT: resuming from step 2 of {steps} ({tmp_path / SFT_CHECKPOINT})"]
    assert len(after) == steps - 2  # only the steps left ran
    assert result.losses == reference.losses  # exactly: the same data order, weights and optimizer state
    assert seen == reference.losses[:2]
    for (name, a), (_, b) in zip(whole.named_parameters(), resumed.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_a_checkpoint_of_other_settings_is_refused(setup, tmp_path):
    base, tokenizer, trees = setup
    pad = tokenizer.pad_token_id

    def stop(step, _loss):
        raise _Stop

    with pytest.raises(_Stop):
        _train(copy.deepcopy(base), trees, pad, checkpoint_dir=tmp_path, on_step=stop)
    with pytest.raises(SFTCheckpointMismatch, match="lr: 0.003 there, 0.001 now"):
        sft(copy.deepcopy(base), trees, pad_id=pad, epochs=3, batch_trajectories=1, lr=1e-3, seed=7,
            checkpoint_dir=tmp_path)  # fmt: skip
    with pytest.raises(SFTCheckpointMismatch, match="tokens"):  # other demonstrations
        _train(copy.deepcopy(base), trees[:-1] + trees[:1], pad, checkpoint_dir=tmp_path)


def test_no_checkpoint_is_written_without_a_directory(setup, tmp_path, monkeypatch):
    base, tokenizer, trees = setup
    monkeypatch.chdir(tmp_path)
    saved = []
    monkeypatch.setattr(torch, "save", lambda *a, **k: saved.append(a))
    _train(copy.deepcopy(base), trees, tokenizer.pad_token_id)
    assert saved == [] and list(tmp_path.iterdir()) == []


def test_run_sft_resumes_beside_the_model_and_removes_its_checkpoint(tmp_path, monkeypatch):
    from agentcredit import run
    from agentcredit.train import sft as sft_module

    config = load_config("grpo-arith-tools", SMALL)
    out = tmp_path / "start" / "sft-model"
    real = sft_module.sft

    def interrupted(*args, **kwargs):
        def stop(step, _loss):
            raise _Stop

        return real(*args, **{**kwargs, "on_step": stop})

    monkeypatch.setattr(sft_module, "sft", interrupted)
    with pytest.raises(_Stop):
        run.run_sft(config, out, examples=4, epochs=2, batch_trajectories=1, log=lambda _line: None)
    partial = run.sft_checkpoint_dir(out)
    assert partial == tmp_path / "start" / "sft-model.partial"
    # the checkpoint sits beside the model's directory: nothing there looks like a finished model
    assert (partial / SFT_CHECKPOINT).is_file() and not (out / "sft_summary.json").exists()

    monkeypatch.setattr(sft_module, "sft", real)
    lines = []
    run.run_sft(config, out, examples=4, epochs=2, batch_trajectories=1, log=lines.append)
    assert any(line.startswith("SFT: resuming from step 1 of ") for line in lines), lines
    assert (out / "sft_summary.json").is_file() and not partial.exists()
