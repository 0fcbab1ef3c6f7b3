"""Progress on a stdout that is not a terminal (`make demo | tee log`, CI) arrives line by line (issue 11, item 5).

rich draws a live bar only on a terminal (elsewhere nothing until the bar stops) and Python block-buffers a
piped stdout, so a piped `agentcredit train` showed nothing for minutes, then everything at once. Now each step
prints a plain, flushed line.

The check is a handshake, not a timing: the child `agentcredit train` (tiny model, 2 steps) waits before its
second step until the parent has *read* the first step's line from the pipe. If that line were still sitting
in a buffer (or never written) the child would time out waiting, which it reports on stderr.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time

import pytest

from agentcredit import progress as progress_module

CHILD = textwrap.dedent(
    """
    import os, sys, time
    from agentcredit.train import trainer as T

    GO, WAIT = sys.argv[1], float(sys.argv[2])
    step = T.Trainer.train_step

    def gated(self):
        if self.step == 1:  # before step 2: wait until the parent has read step 1's line
            deadline = time.monotonic() + WAIT
            while not os.path.exists(GO) and time.monotonic() < deadline:
                time.sleep(0.05)
            print("GATE", "open" if os.path.exists(GO) else "timeout", file=sys.stderr, flush=True)
        return step(self)

    T.Trainer.train_step = gated
    from agentcredit.cli import app

    app(sys.argv[3:])
    """
)

SETTINGS = [
    "model.name=tiny",
    "train.steps=2",
    "rollout.prompts_per_step=1",
    "rollout.n=2",
    "rollout.max_new_tokens=16",
    "rollout.max_episode_tokens=48",
    "task.eval_limit=1",
    "train.tensorboard=false",
    "train.save_every=0",
]


@pytest.mark.slow
def test_piped_train_streams_one_line_per_step(tmp_path):
    go = tmp_path / "go"
    args = ["train", "--config", "grpo-arith-tools", "--run-dir", str(tmp_path / "run")]
    for s in SETTINGS:
        args += ["--set", s]
    stderr = open(tmp_path / "stderr.txt", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(go), "90", *args],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        cwd=tmp_path,
    )
    lines = []
    try:
        for line in proc.stdout:  # a pipe: the child's stdout is not a terminal
            lines.append(line.rstrip("\n"))
            if re.match(r"grpo 1/2 steps .*: reward", line):
                go.touch()
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
        stderr.seek(0)
        err = stderr.read()
        stderr.close()
    assert rc == 0, err[-3000:]
    steps = [
        ln
        for ln in lines
        if re.match(r"grpo \d/2 steps \(\d+%\), \S+ elapsed, ETA \S+: reward \S+ acc \S+ \d+s/step$", ln)
    ]
    assert len(steps) == 2, lines
    assert "GATE open" in err, "the step-1 line did not reach the pipe before step 2 started"
    final = [i for i, ln in enumerate(lines) if ln.startswith("final evaluation:")]
    assert final and final[0] > lines.index(steps[-1])


def test_line_buffering_is_set_on_a_pipe_only(monkeypatch):
    calls = []

    class Stream:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

        def reconfigure(self, **kwargs):
            calls.append(kwargs)

    monkeypatch.setattr(sys, "stdout", Stream(tty=True))
    progress_module.line_buffered_stdout()
    assert calls == []
    monkeypatch.setattr(sys, "stdout", Stream(tty=False))
    progress_module.line_buffered_stdout()
    assert calls == [{"line_buffering": True}]


@pytest.mark.parametrize("progress", [True, False])
def test_trainer_prints_flushed_step_lines_when_not_a_terminal(progress, monkeypatch):
    """In-process: with no terminal, train() prints one flushed line per step (and none when progress is off)."""
    from agentcredit.train import trainer as trainer_module

    printed = []
    monkeypatch.setattr(progress_module, "live_console", lambda: False)
    monkeypatch.setattr(progress_module, "line_buffered_stdout", lambda: None)
    monkeypatch.setattr(progress_module, "progress_line", printed.append)

    class Fake:
        cfg = type(
            "C",
            (),
            {
                "train": type("T", (), {"steps": 2, "dump_episodes_every": 0, "save_every": 0})(),
                "method": "grpo",
            },
        )()
        step, logger, run_dir = 0, None, None
        warmup_gate = None  # GRPO has no critic to warm up (Trainer.train checks the gate first, issue 48)

        def train_step(self):
            self.step += 1
            metrics = {"reward/mean": 0.5, "accuracy": 0.25, "time/step": 3.0}
            return trainer_module.StepResult(metrics, [], None)

    started = time.monotonic()
    trainer_module.Trainer.train(Fake(), progress=progress)
    assert time.monotonic() - started < 30
    info = "reward 0.500 acc 0.250 3s/step"
    if not progress:
        assert printed == []
    else:
        assert [ln.split(",")[0] for ln in printed] == ["grpo 1/2 steps (50%)", "grpo 2/2 steps (100%)"]
        assert all(ln.endswith(f": {info}") and " ETA " in ln for ln in printed), printed
