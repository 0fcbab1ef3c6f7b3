"""Progress of a long phase (SFT, critic warm-up, rollouts, evaluation, RL steps) with an ETA.

On a terminal (or a notebook) a live rich bar redraws in place. On a pipe or a file (``make demo | tee log``, CI)
rich draws nothing until the bar stops and Python block-buffers stdout, so the phase prints plain, flushed lines
instead: at most one every ``every`` seconds, and always the last one, each with the elapsed time and an ETA
from the mean rate so far. The bottom layer: anything may use it, it uses nothing of the package.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable


def live_console() -> bool:
    """True when stdout is a terminal (or a notebook) where rich can redraw a live progress bar in place.

    On a pipe or a file rich draws nothing until the bar stops, so callers print :func:`progress_line` lines.
    """
    from rich.console import Console

    console = Console()
    return bool(console.is_terminal or console.is_jupyter)


def line_buffered_stdout() -> None:
    """Make ``sys.stdout`` line-buffered when it is not a terminal.

    Python block-buffers stdout on a pipe or a file, so ``print`` output (run directory, held-out evaluations,
    SFT losses) would otherwise arrive in one burst minutes later, or at exit. A no-op on a terminal (already
    line-buffered) and on streams that cannot be reconfigured.
    """
    stream = sys.stdout
    try:
        if stream is None or stream.isatty():
            return
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    except (AttributeError, OSError, ValueError):  # a closed or exotic stream: leave it as it is
        return


def progress_line(text: str) -> None:
    """One plain progress line on stdout, flushed at once (the non-terminal stand-in for a live bar)."""
    print(text, flush=True)


def eta_seconds(done: int, total: int, elapsed: float) -> float:
    """Seconds left at the mean rate so far; NaN before the first unit is done (no rate yet)."""
    if done <= 0:
        return math.nan
    return max(0.0, elapsed / done * (total - done))


def format_duration(seconds: float) -> str:
    """``'42s'``, ``'3m05s'``, ``'1h02m'``; ``'?'`` for an unknown (NaN) duration."""
    if math.isnan(seconds):
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """``with Progress("sft", total=64, unit="steps") as p: ... p.advance(info="loss 0.81")``.

    ``every``: the least number of seconds between two plain lines (0: a line for every advance). ``initial``:
    units already done before this process (a resumed run); the ETA uses only this process's rate. ``enabled``
    False shows nothing. ``clock`` is injectable for tests.
    """

    def __init__(
        self,
        description: str,
        total: int,
        *,
        unit: str = "",
        every: float = 10.0,
        initial: int = 0,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.description, self.total, self.unit, self.every = description, int(total), unit, every
        self.enabled, self.clock = enabled and total > 0, clock
        self.initial = self.done = int(initial)
        self._bar = None
        self._task = None

    def __enter__(self) -> Progress:
        self.started = self.clock()
        self._last_line = -math.inf
        self.plain = self.enabled and not live_console()
        if self.plain:
            line_buffered_stdout()
        elif self.enabled:
            from rich.progress import BarColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.description, total=self.total, completed=self.done, info="")
        return self

    def line(self, info: str = "") -> str:
        """The plain line for the progress so far."""
        elapsed = self.clock() - self.started
        eta = eta_seconds(self.done - self.initial, self.total - self.initial, elapsed)
        unit = f" {self.unit}" if self.unit else ""
        text = (
            f"{self.description} {self.done}/{self.total}{unit} ({self.done / self.total:.0%}), "
            f"{format_duration(elapsed)} elapsed, ETA {format_duration(eta)}"
        )
        return f"{text}: {info}" if info else text

    def advance(self, n: int = 1, info: str = "") -> None:
        self.done = min(self.total, self.done + n)
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, info=info)
            return
        now = self.clock()
        if self.done >= self.total or now - self._last_line >= self.every:
            self._last_line = now
            progress_line(self.line(info))

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
            self._bar = None
