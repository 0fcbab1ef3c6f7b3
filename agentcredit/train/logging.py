"""Run metrics: JSONL (always), TensorBoard and W&B (when asked for). Progress lines: :mod:`agentcredit.progress`."""

from __future__ import annotations

import json
import math
import time
import warnings
from pathlib import Path
from typing import Any


class MetricsLogger:
    """Appends one JSON object per step to ``metrics.jsonl`` and mirrors scalars to TensorBoard / W&B."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        tensorboard: bool = True,
        wandb: bool = False,
        wandb_project: str = "agentcredit",
        config: dict | None = None,
        filename: str = "metrics.jsonl",
    ):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / filename
        self._tb = None
        self._wandb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
        if wandb:
            try:
                import wandb as wandb_module
            except ImportError:
                warnings.warn(
                    "train.wandb is on but wandb is not installed; logging to JSONL/TensorBoard only",
                    stacklevel=2,
                )
            else:
                self._wandb = wandb_module.init(
                    project=wandb_project, dir=str(self.run_dir), config=config or {}
                )

    def drop_after(self, step: int) -> int:
        """Forget the rows of steps after ``step`` (a resume from that checkpoint logs them again); returns how many.

        A malformed last line (not UTF-8, not JSON, or not an object with an integer ``step``) is a write cut off
        by a kill: it is dropped with a warning naming the file (not counted). A malformed line anywhere else is
        damage this cannot explain: a ValueError naming file and line, and the file is left as it was.
        TensorBoard / W&B keep their copies (they show the redone steps as later points of the same step).
        """
        if not self.path.is_file():
            return 0
        lines = self.path.read_bytes().splitlines(keepends=True)
        rows: list[tuple[bytes, dict | None]] = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                rows.append((line, None))
                continue
            row, problem = _metrics_row(line)
            if problem is None:
                rows.append((line, row))
                continue
            if any(rest.strip() for rest in lines[number:]):
                raise ValueError(
                    f"{self.path} line {number}: {problem}; only a torn last line is repaired on resume"
                )
            warnings.warn(
                f"{self.path} line {number}: dropped a malformed last line ({problem}; most likely a write "
                f"cut off by a kill): {line[:60]!r}",
                stacklevel=2,
            )
            break
        kept = [line for line, row in rows if row is None or row["step"] <= step]
        if kept and not kept[-1].endswith(b"\n"):  # so the next row starts on a line of its own
            kept[-1] += b"\n"
        if kept != lines:
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            tmp.write_bytes(b"".join(kept))
            tmp.replace(self.path)
        return len(rows) - len(kept)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, "time": time.time(), **metrics}
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record, default=_jsonable) + "\n")
        scalars = {
            k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if self._tb is not None:
            for key, value in scalars.items():
                if math.isfinite(value):
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _metrics_row(line: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """One line of a metrics file as ``(row, None)``, or ``(None, what is wrong with it)``."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 (byte 0x{line[exc.start]:02x} at column {exc.start + 1})"
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON ({exc.msg} at column {exc.colno})"
    step = row.get("step") if isinstance(row, dict) else None
    if not isinstance(step, int) or isinstance(step, bool):
        got = type(row).__name__ if not isinstance(row, dict) else f"step {step!r}"
        return None, f"expected a JSON object with an integer step, got {got}"
    return row, None


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics JSONL file (a run directory is accepted)."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    from agentcredit.tasks.example import iter_jsonl  # errors name the file and line

    return [row for _, row in iter_jsonl(path)]
