"""Checkpoints: resume is exact, writes are atomic, a kill during a write leaves the previous checkpoint usable."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from train_helpers import EXAMPLES, SMALL

from agentcredit.config import load_config
from agentcredit.train.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from agentcredit.train.trainer import Trainer


@pytest.mark.parametrize("preset", ["grpo-arith-tools", "carl-segment-arith-tools"])
@pytest.mark.slow
def test_resume_continues_exactly(preset, fitted_codefence, tmp_path):
    model, tokenizer = fitted_codefence
    config = load_config(preset, [*SMALL, "optim.epochs=1"])

    def trainer(run_dir):
        return Trainer(
            config,
            model=copy.deepcopy(model),
            tokenizer=tokenizer,
            examples=list(EXAMPLES),
            run_dir=run_dir,
            log=False,
        )

    straight = trainer(tmp_path / "straight")
    try:
        losses = [straight.train_step().metrics["loss/total"] for _ in range(2)]
    finally:
        straight.close()

    first = trainer(tmp_path / "resumed")
    try:
        first.train_step()
        first.save()
    finally:
        first.close()
    resumed = trainer(tmp_path / "resumed")
    try:
        resumed.resume(tmp_path / "resumed")
        assert resumed.step == 1
        second = resumed.train_step().metrics["loss/total"]
    finally:
        resumed.close()
    assert losses[1] != 0.0
    assert abs(second - losses[1]) < 1e-6, (second, losses[1])


def test_checkpoints_are_complete_and_pruned(tmp_path):
    for step in (1, 2, 3):
        save_checkpoint(
            tmp_path, step, {"step": step, "w": torch.ones(3) * step}, config_yaml="a: 1\n", keep=2
        )
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names == ["step-000002", "step-000003"]
    assert load_checkpoint(tmp_path)["step"] == 3  # a run directory resolves to its latest checkpoint
    assert not list((tmp_path / "checkpoints").glob(".step-*"))
    empty = tmp_path / "empty-run"
    (empty / "checkpoints").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        load_checkpoint(empty)


def test_kill_during_a_write_keeps_the_previous_checkpoint(tmp_path):
    save_checkpoint(tmp_path, 1, {"step": 1, "w": torch.zeros(4)})
    # a child process writes a large checkpoint for step 2 and is killed with SIGKILL in the middle
    code = textwrap.dedent(
        f"""
        import sys, torch
        from agentcredit.train.checkpoint import save_checkpoint
        print("writing", flush=True)
        save_checkpoint({str(tmp_path)!r}, 2, {{"step": 2, "w": torch.randn(64, 1024, 1024)}})  # ~256 MB
        """
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "writing"
    deadline = time.time() + 60
    while not list((tmp_path / "checkpoints").glob(".step-000002-*/state.pt")) and time.time() < deadline:
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and latest.name == "step-000001"
    assert load_checkpoint(tmp_path)["step"] == 1
    # the next save cleans up the torn temporary directory
    save_checkpoint(tmp_path, 3, {"step": 3})
    assert not list((tmp_path / "checkpoints").glob(".step-*"))
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000001", "step-000003"]


class _Killed(BaseException):
    """Stands for a kill -9 at one point of a write (a BaseException, as KeyboardInterrupt is)."""


def test_crash_while_resaving_a_step_keeps_a_complete_checkpoint(tmp_path, monkeypatch):
    # Re-saving a saved step used to delete the old directory before renaming the new one in: a crash in that
    # gap left step 2 with no checkpoint at all (issue 34).
    save_checkpoint(tmp_path, 1, {"step": 1, "w": torch.zeros(2)})
    save_checkpoint(tmp_path, 2, {"step": 2, "w": torch.ones(2)})
    final = tmp_path / "checkpoints" / "step-000002"
    real_rename = os.rename

    def rename(src, dst):
        if os.fspath(dst) == os.fspath(final):  # the new directory's rename into place: crash just before it
            raise _Killed
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(_Killed):
        save_checkpoint(tmp_path, 2, {"step": 2, "w": torch.full((2,), 7.0)})
    monkeypatch.setattr(os, "rename", real_rename)
    assert [int(p.name.split("step-")[1][:6]) for p in list_checkpoints(tmp_path)] == [1, 2]
    state = load_checkpoint(tmp_path)
    assert state["step"] == 2 and torch.equal(state["w"], torch.ones(2))  # the old, complete step 2
    # the next save puts it back under its own name and the re-save then goes through
    save_checkpoint(tmp_path, 2, {"step": 2, "w": torch.full((2,), 7.0)}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000001", "step-000002"]
    assert torch.equal(load_checkpoint(tmp_path)["w"], torch.full((2,), 7.0))
    assert not list((tmp_path / "checkpoints").glob(".step-*"))
