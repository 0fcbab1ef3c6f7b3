"""What the study modules share (the study runner, its preflight and its report): the error a study stops with,
digests and atomic JSON writes."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any


class StudyError(ValueError):
    """A study file or study directory that cannot be used; the message says which and why."""


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _weights_digest(model_dir: Path) -> str:
    """A digest of a model directory's weight files (what a policy's behaviour depends on)."""
    digest = hashlib.blake2b(digest_size=16)
    files = sorted(model_dir.glob("*.safetensors")) + sorted(model_dir.glob("*.bin"))
    if not files:
        raise StudyError(f"{model_dir}: no weight files")
    for path in files:
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()


def _write_json(path: Path, data: Any) -> None:
    """Atomic JSON write: a half-written file never looks like a finished one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)
