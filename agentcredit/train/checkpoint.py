"""Atomic checkpoints.

A checkpoint is a directory ``step-000042/`` holding ``state.pt`` (model or adapter weights, value head, optimizer,
scheduler, RNG states, step, anything else the trainer puts in) and ``config.yaml``. It is written to a temporary
sibling directory, every file is fsync'ed, then the directory is renamed into place and the parent fsync'ed — so a
``kill -9`` at any moment leaves either the previous checkpoints or the complete new one, never a torn file.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

_STEP_DIR = re.compile(r"^step-(\d{6,})$")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    run_dir: str | Path, step: int, state: dict[str, Any], *, config_yaml: str = "", keep: int = 2
) -> Path:
    """Write ``state`` as checkpoint ``step`` under ``run_dir/checkpoints`` and keep the newest ``keep`` of them."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step-{step:06d}-", dir=root))
    try:
        torch.save(state, tmp / "state.pt")
        (tmp / "config.yaml").write_text(config_yaml)
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(tmp)
        if final.exists():  # re-saving the same step (e.g. end of run right after a periodic save)
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    # leftovers of writes that were killed mid-way
    for stale in root.glob(".step-*"):
        if stale != tmp:
            shutil.rmtree(stale, ignore_errors=True)
    return final


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [
        p for p in root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name) and (p / "state.pt").is_file()
    ]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load ``state.pt`` from a checkpoint directory (or a run directory: its latest checkpoint)."""
    path = Path(path)
    if (path / "checkpoints").is_dir():
        latest = latest_checkpoint(path)
        if latest is None:
            raise FileNotFoundError(f"{path}: run directory has no complete checkpoint")
        path = latest
    state_file = path / "state.pt"
    if not state_file.is_file():
        raise FileNotFoundError(f"{path}: not a checkpoint (no state.pt)")
    # weights_only=False: the state holds RNG states and plain Python objects written by this library
    return torch.load(state_file, map_location="cpu", weights_only=False)
