"""Atomic checkpoints.

A checkpoint is a directory ``step-000042/`` holding ``state.pt`` (model or adapter weights, value head, optimizer,
scheduler, RNG states, step, anything else the trainer puts in) and ``config.yaml``. It is written to a temporary
sibling directory, every file is fsync'ed, then the directory is renamed into place and the parent fsync'ed — so a
``kill -9`` at any moment leaves either the previous checkpoints or the complete new one, never a torn file.

Re-saving a step that is already saved (the end-of-run save right after a periodic one) cannot rename over the
old directory (a directory rename onto a non-empty one fails), so the old one is first renamed aside to
``.step-000042.replaced`` and deleted only after the new one is in place. A crash between the two renames leaves
the aside copy, which is complete: :func:`list_checkpoints` counts it as step 42 and the next save puts it back
under its name, so there is never a moment without a complete checkpoint.
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
_REPLACED_DIR = re.compile(r"^\.(step-\d{6,})\.replaced$")  # a complete checkpoint moved aside by a re-save


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
    _restore_replaced(root)
    final = root / f"step-{step:06d}"
    aside = root / f".{final.name}.replaced"
    tmp = Path(tempfile.mkdtemp(prefix=f".step-{step:06d}-", dir=root))
    try:
        torch.save(state, tmp / "state.pt")
        (tmp / "config.yaml").write_text(config_yaml)
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(tmp)
        if final.exists():  # re-saving the same step (e.g. end of run right after a periodic save)
            os.rename(
                final, aside
            )  # still complete and still found (list_checkpoints) until the new one is in
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(aside, ignore_errors=True)
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    # leftovers of writes that were killed mid-way
    for stale in root.glob(".step-*"):
        if stale != tmp and not _REPLACED_DIR.match(stale.name):
            shutil.rmtree(stale, ignore_errors=True)
    return final


def _restore_replaced(root: Path) -> None:
    """Put back a checkpoint a crashed re-save moved aside, or drop it if the new one made it in."""
    for aside in root.glob(".step-*.replaced"):
        match = _REPLACED_DIR.match(aside.name)
        if match is None:
            continue
        final = root / match.group(1)
        if (final / "state.pt").is_file():
            shutil.rmtree(aside, ignore_errors=True)
        else:
            if final.exists():
                shutil.rmtree(final)
            os.rename(aside, final)
            _fsync_dir(root)


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found: dict[str, Path] = {}
    for p in root.iterdir():
        if not (p.is_dir() and (p / "state.pt").is_file()):
            continue
        if _STEP_DIR.match(p.name):
            found[p.name] = p
        elif (replaced := _REPLACED_DIR.match(p.name)) is not None:
            found.setdefault(replaced.group(1), p)  # only where a re-save crashed before its rename
    return [found[name] for name in sorted(found, key=lambda name: int(name.removeprefix("step-")))]


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
