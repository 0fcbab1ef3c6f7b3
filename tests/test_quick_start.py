"""The README's Quick start, run as a user runs it (issue 54): each command of its block in one shell folder, in
order, on the tiny random model, failing on the first one that exits non-zero.

`make setup && source .venv/bin/activate` is what this test's environment already did: it is checked and replaced
by putting this interpreter's `agentcredit` first on PATH. Every other command runs as written, with the tiny
model and CPU-sized settings appended as options (a later --set wins), so the suite stays fast; the RL runs keep
the README's 20 steps, which `agentcredit view .../step-000020.jsonl` reads.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUP = "make setup && source .venv/bin/activate"
ROLLOUT = [
    "rollout.prompts_per_step=1",
    "rollout.n=2",
    "rollout.max_new_tokens=16",
    "rollout.max_episode_tokens=64",
    "task.eval_limit=2",
]
# appended to each subcommand: the tiny model (sft picks it; the others read runs/sft, already tiny) and sizes
TINY = {
    "sft": ["--examples", "2", "--epochs", "1", "--set", "model.name=tiny"],
    "eval": [arg for s in ROLLOUT for arg in ("--set", s)],
    "train": [
        arg
        for s in [*ROLLOUT, "optim.epochs=1", "train.tensorboard=false", "train.save_every=0"]
        for arg in ("--set", s)
    ],
}


def quick_start() -> list[str]:
    """The Quick start block's commands: continuation lines joined, comments dropped."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Quick start\n\n```bash\n(.*?)```", text, flags=re.DOTALL).group(1)
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in block.replace("\\\n", " ").splitlines()]
    return [line for line in lines if line]


@pytest.mark.slow
def test_the_readme_quick_start_runs_as_written(tmp_path):
    commands = quick_start()
    assert commands[0] == SETUP, "the Quick start no longer opens with the setup line this test replaces"
    assert all(c.startswith("agentcredit ") for c in commands[1:]), commands
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "OMP_NUM_THREADS": "1",
    }
    for command in commands[1:]:
        sub = command.split()[1]
        full = command + "".join(f" {shlex.quote(a)}" for a in TINY.get(sub, []))
        done = subprocess.run(["bash", "-c", full], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 0, (
            f"`{full}` exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    assert (tmp_path / "runs" / "carl" / "episodes" / "step-000020.html").is_file()
