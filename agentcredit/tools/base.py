"""What every tool shares: a call, a result, and a runtime that runs calls concurrently.

A tool is any callable ``(arguments: dict) -> str``. It returns text for the model to read, and reports its
own failures as text too (``"ERROR: ..."``): a bad call from the model is an observation, never an exception
that ends a batch. :class:`ToolRuntime` enforces that for tools that raise anyway.

One kind of failure is not an observation: a tool that could not run at all (the python sandbox cannot start,
the search corpus is missing). That is the machine's fault, not the model's, and its text must never be trained
on or scored as the tool's answer. A tool reports it by returning :func:`unavailable` text (or raising
:class:`ToolUnavailableError`); :class:`ToolRuntime` then marks the result ``infra=True``. The mark rides on the
type of the returned string, not on its words, so code that prints the same words is still an ordinary answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

ToolFn = Callable[[dict[str, Any]], str]


class ToolUnavailableError(RuntimeError):
    """A tool the task needs cannot run here (sandbox, search corpus): an infrastructure problem, not the model's.

    The message says what is wrong and how to fix it; the ``agentcredit`` command prints it alone (no traceback)
    and exits non-zero.
    """


class UserCodeError(RuntimeError):
    """The user's own code failed (a ``task.reward`` that raises, an environment whose ``step`` returns the wrong
    shape): not the model's mistake and not the machine's. The message names the function and the example; the
    ``agentcredit`` command prints it alone (no traceback) and exits 2, as for any other bad input. An exception
    inside a tool *call* is not one: the model sees it as an ``ERROR:`` observation."""


class UnavailableText(str):
    """The text of a tool that could not run at all; :class:`ToolRuntime` marks its result ``infra=True``."""


def unavailable(message: str) -> UnavailableText:
    """``ERROR: <message>`` marked as an infrastructure failure (what the model reads is unchanged)."""
    return UnavailableText(message if message.startswith("ERROR:") else f"ERROR: {message}")


@dataclass
class ToolCall:
    """One call parsed from model output. ``raw`` is the text it was parsed from (for logs and errors)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments, "raw": self.raw}


@dataclass
class ToolResult:
    """What a call returned. ``ok`` is False when the tool reported or raised an error; ``infra`` is True when it
    could not run at all (an infrastructure failure: the output is not the tool's answer)."""

    name: str
    output: str
    ok: bool = True
    seconds: float = 0.0
    infra: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "output": self.output, "ok": self.ok, "seconds": self.seconds, "infra": self.infra,
        }  # fmt: skip


def run_call(tools: Mapping[str, ToolFn], call: ToolCall) -> ToolResult:
    """``call`` run on the tool it names: an unknown name, an ``ERROR:`` text or an exception is an observation
    (``ok=False``); a tool that could not run at all is marked ``infra=True`` (see the module docstring)."""
    start = time.perf_counter()
    fn = tools.get(call.name)
    if fn is None:
        known = ", ".join(sorted(tools)) or "none"
        return ToolResult(call.name, f"ERROR: unknown tool {call.name!r}; available: {known}", ok=False)
    infra = False
    try:
        output = fn(call.arguments)
        infra = isinstance(output, UnavailableText)
        ok = not infra and not output.startswith("ERROR:")
    except ToolUnavailableError as exc:
        output, ok, infra = f"ERROR: tool {call.name!r} is unavailable: {exc}", False, True
    except Exception as exc:  # a tool bug must not end the batch; the model sees the error
        output, ok = f"ERROR: tool {call.name!r} failed: {type(exc).__name__}: {exc}", False
    return ToolResult(call.name, str(output), ok=ok, seconds=time.perf_counter() - start, infra=infra)


class ToolRuntime:
    """Named tools plus a bounded thread pool; ``run`` executes a list of calls concurrently, in order."""

    def __init__(
        self, tools: Mapping[str, ToolFn] | None = None, *, max_workers: int = 8, episodes: Any = None
    ):
        self.tools: dict[str, ToolFn] = dict(tools or {})
        # a per-episode environment (agentcredit.tools.episodes.EpisodeEnvironments): when set, the engine sends
        # every call of an episode to that episode's own environment instead of ``tools``
        self.episodes = episodes
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="agentcredit-tool")
        # ``submit`` runs a whole step (its calls then go to ``_pool``) on a separate pool: a step waiting for its
        # calls must never occupy a worker its own calls need, or a full pool deadlocks.
        self._steps = ThreadPoolExecutor(max_workers=64, thread_name_prefix="agentcredit-tool-step")

    def register(self, name: str, fn: ToolFn) -> None:
        self.tools[name] = fn

    def run_one(self, call: ToolCall) -> ToolResult:
        return run_call(self.tools, call)

    def run(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        if self.episodes is not None and calls:
            raise RuntimeError(
                "this runtime's calls go to a per-episode environment: run them through the rollout engine, or "
                "agentcredit.tools.episodes.EpisodeTools for one episode"
            )
        if len(calls) <= 1:
            return [self.run_one(c) for c in calls]
        return list(self._pool.map(self.run_one, calls))

    def submit(self, calls: Sequence[ToolCall]):
        """Start ``calls`` in the pool; returns a future of the result list (the engine overlaps tools)."""
        return self._steps.submit(self.run, list(calls))

    def submit_step(self, fn: Callable[..., Any], *args: Any):
        """Run ``fn(*args)`` (a per-episode environment's step) on the step pool; returns its future."""
        return self._steps.submit(fn, *args)

    def close(self) -> None:
        self._steps.shutdown(wait=False, cancel_futures=True)
        self._pool.shutdown(wait=False, cancel_futures=True)
