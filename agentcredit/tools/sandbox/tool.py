"""Run untrusted, model-written Python in a sandbox and return what it printed, or why it failed.

    >>> result = run_python("x = 6 * 7\\nx")
    >>> result.ok, result.output
    (True, '42\\n')

Each call is a fresh interpreter (stateless, as carl-segment §2.4 / A26 prescribes) with ``math`` and
``search(query, k=3)`` pre-imported; a final bare expression is displayed Jupyter-style; an exception prints the
last lines of its traceback after whatever was printed. ``run_python`` never raises because of what the code
does: every failure (timeout, memory, crash, output flood, ...) comes back as ``ok=False`` with an ``error``.
When no sandbox can run on the machine at all it raises :class:`~agentcredit.tools.base.ToolUnavailableError`;
:func:`check_available` is that check done up front, once, before a task that needs the tool starts.

Two isolation modes, chosen once per process (``docs/sandbox.md`` says exactly what each guarantees):

- ``bwrap``: bubblewrap gives the code its own PID, network, IPC and mount namespaces, a read-only view of the
  system and Python directories only, private size- and inode-capped /tmp, /dev/shm and working directory, and a
  seccomp filter that denies what Docker's default profile denies and a little more
  (:mod:`agentcredit.tools.sandbox.seccomp`);
- ``rlimits``: the fallback, used only when asked for by name (never because bubblewrap failed): rlimits, a
  fresh host temp directory, and an empty network namespace where the kernel allows one (else a Python-level
  socket block). It is not safe for untrusted code, and a process that uses it logs a WARNING that says so, once.

In both modes, when the host runs as root, the code runs under a dedicated unprivileged uid leased for the call
(:mod:`agentcredit.tools.sandbox.procs`), which is what makes the process cap real and lets the parent kill every
process the code started, daemons included. The wrapper text around the output (carl-segment's ```output fence) is
the protocol's job, not this module's.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import threading
import warnings
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from agentcredit.tools.base import ToolFn, ToolUnavailableError, unavailable
from agentcredit.tools.sandbox.config import (
    ErrorKind,
    Isolation,
    KiB,
    MiB,
    SandboxLimits,
    SandboxMode,
    SandboxResult,
    SandboxSettings,
    SearchFn,
)
from agentcredit.tools.sandbox.session import run_sandboxed

__all__ = [
    "ErrorKind",
    "Isolation",
    "KiB",
    "MiB",
    "SandboxLimits",
    "SandboxMode",
    "SandboxPool",
    "SandboxResult",
    "SandboxSettings",
    "SearchFn",
    "check_available",
    "configure",
    "python_tool",
    "run_python",
    "sandbox_mode",
    "settings",
    "tool_text",
]

logger = logging.getLogger(__name__)

_settings = SandboxSettings()


def settings() -> SandboxSettings:
    """The host-side settings in force (interpreter, uid range, temp root)."""
    return _settings


def configure(**changes: Any) -> SandboxSettings:
    """Change host-side settings (fields of :class:`SandboxSettings`); returns the previous ones.

    The isolation mode is resolved again at the next call, since it depends on the interpreter.
    """
    global _settings
    names = {f.name for f in fields(SandboxSettings)}
    unknown = sorted(set(changes) - names)
    if unknown:
        raise ValueError(f"configure: unknown setting(s) {unknown}; valid: {sorted(names)}")
    with _mode_lock:
        previous, _settings = _settings, replace(_settings, **changes)
        _modes.clear()
    return previous


# --------------------------------------------------------------------------------------------------------------
# Isolation mode: decided once per process and per requested isolation.

_mode_lock = threading.Lock()
_modes: dict[str, SandboxMode] = {}
_announced: set[str] = set()


def sandbox_mode(isolation: Isolation = "bwrap") -> SandboxMode:
    """Resolve (once, then cached) which isolation mode ``isolation`` means on this machine.

    ``bwrap`` (the default) probes bubblewrap by really running a program in it and raises
    :class:`ToolUnavailableError` (a RuntimeError), one line saying why and how to opt in to the fallback, when
    that fails. ``rlimits`` is the fallback, used only when asked for by name: the first resolution logs the
    mode, and warns (``warnings.warn``, once per process) that it is not safe for untrusted code.
    """
    if isolation == "auto":
        raise ValueError(
            "isolation 'auto' no longer exists: it dropped model-written code to the unsafe rlimits fallback "
            "whenever bubblewrap failed; use 'bwrap' (the default) or ask for 'rlimits' by name"
        )
    if isolation not in ("bwrap", "rlimits"):
        raise ValueError(f"isolation must be 'bwrap' or 'rlimits', got {isolation!r}")
    with _mode_lock:
        if isolation not in _modes:
            _modes[isolation] = _resolve_mode(isolation)
        mode = _modes[isolation]
        if mode.name not in _announced:
            _announced.add(mode.name)
            message = (
                f"agentcredit sandbox: isolation mode '{mode.name}' ({mode.reason}); dedicated uid per run: "
                f"{'yes' if mode.dedicated_uid else 'no'}; network: {mode.network}"
            )
            if mode.name == "rlimits":
                # Once per process, loudly: the fallback shares the host's file system, UNIX sockets, keyrings
                # and kernel surface with the code (docs/sandbox.md), so it is for trusted code only.
                loud = (
                    f"{message}. The 'rlimits' fallback is NOT SAFE FOR UNTRUSTED CODE: the code sees every "
                    "world-readable host file (data sets and their answers included), can reach host UNIX "
                    "sockets and has no system-call filter; install bubblewrap for model-written code "
                    "(docs/sandbox.md)"
                )
                logger.warning(loud)
                warnings.warn(loud, stacklevel=2)
            else:
                logger.info(message)
    return mode


# The probe imports a standard-library module the bootstrap has not loaded, so it fails (as real code would) when
# the sandbox uid cannot read the interpreter's library, as with a pyenv install under a 0700 /root.
_PROBE_CODE = "import decimal\nprint('probe', decimal.Decimal(6) * 7)"


def _resolve_mode(isolation: Isolation) -> SandboxMode:
    dedicated = os.geteuid() == 0
    if isolation == "bwrap":
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            why = "bubblewrap is not installed (Debian package 'bubblewrap')"
        else:
            candidate = SandboxMode("bwrap", dedicated, "namespace (bubblewrap)", f"bubblewrap at {bwrap}")
            failure = _probe(candidate)
            if failure is None:
                return candidate
            why = f"bubblewrap at {bwrap} does not work here: {failure}"
        raise ToolUnavailableError(f"the python sandbox cannot start: {why}. {OPT_IN}")
    candidate = SandboxMode("rlimits", dedicated, "unknown", "requested by name")
    failure = _probe(candidate)
    if failure is not None:
        hint = _unreadable_hint(_settings.python) if dedicated else ""
        raise ToolUnavailableError(
            f"the sandbox cannot run Python on this machine (the rlimits fallback): {failure}{hint}"
        )
    return replace(candidate, network=_probe_network.get("rlimits", "unknown"))


_probe_network: dict[str, str] = {}

#: How to get the fallback, said wherever bubblewrap cannot start (one line with the reason).
OPT_IN = (
    "Install bubblewrap, or, for code you trust only, ask for the unsafe fallback by name: isolation='rlimits' "
    "(a config's tools.sandbox_isolation: rlimits; under verl agentcredit.tools.python_isolation=rlimits; "
    "docs/sandbox.md)"
)


def _probe(mode: SandboxMode) -> str | None:
    """Run a trivial program in ``mode``; None when it worked, else what went wrong."""
    try:
        result, network = run_sandboxed(_PROBE_CODE, SandboxLimits(timeout=20.0), None, mode, _settings)
    except (OSError, RuntimeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if result.ok and result.output.strip() == "probe 42":
        _probe_network[mode.name] = network or "unknown"
        return None
    return f"{result.error}; output: {result.output.strip()[-300:]!r}"


def _unreadable_hint(python: str) -> str:
    """Names the directory that keeps an unprivileged uid from the interpreter's files, if there is one."""
    import sysconfig

    for target in (os.path.realpath(python), sysconfig.get_paths()["stdlib"]):
        for parent in reversed(Path(target).parents):
            try:
                mode = parent.stat().st_mode
            except OSError:
                continue
            if not mode & stat.S_IXOTH:
                return (
                    f"; {parent} (mode {stat.filemode(mode)}) keeps the sandbox uid from {target}: use an "
                    f"interpreter other users can read (configure(python=...)) or install bubblewrap"
                )
    return ""


# --------------------------------------------------------------------------------------------------------------
# Public entry points.


def run_python(
    code: str,
    *,
    timeout: float = 5.0,
    limits: SandboxLimits | None = None,
    search_fn: SearchFn | Any | None = None,
    isolation: Isolation = "bwrap",
) -> SandboxResult:
    """Run ``code`` in a fresh sandboxed interpreter and return its output or the reason it failed.

    ``timeout`` is the wall-clock limit in seconds. With ``limits``, ``limits.timeout`` is the limit instead, and
    passing a different ``timeout`` as well is a ValueError (one limit, one place). ``search_fn(query, k) -> str``
    answers the sandbox's ``search()`` (an object with a ``.search(query, k)`` method works too); without it
    ``search()`` raises inside the sandbox. Never raises for anything the code does; raises ValueError for bad
    arguments and :class:`ToolUnavailableError` (a RuntimeError) when no sandbox can run on this machine at all.
    """
    if not isinstance(code, str):
        raise ValueError(f"run_python: code must be a str, got {type(code).__name__}")
    if limits is None:
        limits = SandboxLimits(timeout=timeout)
    elif timeout != 5.0 and timeout != limits.timeout:
        raise ValueError(
            f"run_python: timeout={timeout} conflicts with limits.timeout={limits.timeout}; give one"
        )
    mode = sandbox_mode(isolation)
    result, _ = run_sandboxed(code, limits, _as_search_fn(search_fn), mode, _settings)
    return result


_checked: set[tuple[str, SandboxSettings]] = set()
_FIX = (
    "To fix it: install bubblewrap (Debian package 'bubblewrap') where it can create namespaces, or point the "
    "sandbox at an interpreter every user can read (agentcredit.tools.sandbox.configure(python=...)); docs/sandbox.md "
    "says what each isolation mode needs"
)


def check_available(isolation: Isolation = "bwrap") -> None:
    """Run ``print(1)`` in the sandbox (once per process and settings); raise when that does not work.

    The preflight of every task that needs the python tool: without it a broken sandbox turns every tool call
    into an ``ERROR:`` observation and a whole run goes on with it. Raises :class:`ToolUnavailableError` with one
    message: what failed, and how to fix it.
    """
    key = (isolation, _settings)
    if key in _checked:
        return
    try:
        result = run_python("print(1)", timeout=20.0, isolation=isolation)
    except (RuntimeError, OSError) as exc:
        raise ToolUnavailableError(f"the python sandbox cannot run code here: {exc}. {_FIX}") from exc
    if not (result.ok and result.output == "1\n"):
        why = result.error or f"it printed {result.output[-300:]!r} instead of '1'"
        raise ToolUnavailableError(
            f"the python sandbox cannot run code here ({result.mode} mode): print(1) failed: {why}. {_FIX}"
        )
    _checked.add(key)


def tool_text(result: SandboxResult) -> str:
    """The text a model sees for ``result``.

    A program that ran (even one that raised: its traceback is in the output, as carl-segment §2.4 wants) gives
    its output. A program the sandbox had to stop gives ``ERROR: <why>`` and then whatever it printed, so
    :class:`~agentcredit.tools.base.ToolRuntime` counts it as a failed call. A sandbox that could not be set up
    (before any of the code ran) is the machine's failure, not the code's: that text is marked
    :func:`~agentcredit.tools.base.unavailable`.
    """
    if result.ok or result.error_kind == "exception":
        return result.output
    text = f"ERROR: {result.error}"
    text = f"{text}\n{result.output}" if result.output.strip() else text
    return unavailable(text) if result.error_kind == "setup" else text


def python_tool(
    search_fn: SearchFn | Any | None = None, *, isolation: Isolation = "bwrap", **limits: Any
) -> ToolFn:
    """The sandbox as a :class:`~agentcredit.tools.base.ToolRuntime` tool: ``{"code": str} -> text``.

    ``limits`` are :class:`SandboxLimits` fields (e.g. ``timeout=10``). The returned function never raises: a
    missing or non-string ``code`` gives an ``ERROR:`` text, a run gives :func:`tool_text`, and a sandbox that
    cannot run at all gives an ``ERROR:`` text marked :func:`~agentcredit.tools.base.unavailable` (an
    infrastructure failure, never to be trained on or scored as the tool's answer). So does a run in which
    ``search_fn`` could not run (it raised ``OSError`` or ``ToolUnavailableError``: the index cannot be read):
    the code still sees its ``search()`` fail, but whatever it made of that is not the tool's answer. Any other
    exception of ``search_fn`` (a query it rejects) stays an ordinary answer.
    """
    names = {f.name for f in fields(SandboxLimits)}
    unknown = sorted(set(limits) - names)
    if unknown:
        raise ValueError(f"python_tool: unknown limit(s) {unknown}; valid: {sorted(names)}")
    sandbox_limits = SandboxLimits(**limits)
    search = _as_search_fn(search_fn)

    def python(arguments: dict[str, Any]) -> str:
        code = arguments.get("code") if isinstance(arguments, dict) else None
        if not isinstance(code, str):
            got = type(code).__name__ if isinstance(arguments, dict) and "code" in arguments else "nothing"
            return f"ERROR: the python tool needs a string argument 'code' (the program to run); got {got}"
        failures: list[str] = []  # per call: the tool runs calls concurrently
        watched = _watch_search(search, failures) if search is not None else None
        try:
            result = run_python(code, limits=sandbox_limits, search_fn=watched, isolation=isolation)
        except (RuntimeError, OSError) as exc:  # no sandbox can run here: say so instead of ending a batch
            return unavailable(f"ERROR: the python sandbox is unavailable: {exc}")
        text = tool_text(result)
        if failures:
            return unavailable(f"ERROR: search() inside the sandbox could not run: {failures[0]}\n{text}")
        return text

    return python


def _watch_search(search: SearchFn, failures: list[str]) -> SearchFn:
    """``search`` that records (and re-raises) the failures that are the index's, not the query's."""

    def watched(query: str, k: int) -> str:
        try:
            return search(query, k)
        except (OSError, ToolUnavailableError) as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
            raise  # the session reports it to the code as before

    return watched


class SandboxPool:
    """Runs many sandboxed calls concurrently with at most ``max_workers`` sandboxes alive at once.

    Each worker thread waits on its own sandbox process, so the threads cost nothing while code runs; the bound
    is on concurrent interpreters (memory, CPU), not on Python threads.
    """

    def __init__(
        self,
        max_workers: int = 2,
        *,
        limits: SandboxLimits | None = None,
        search_fn: SearchFn | Any | None = None,
        isolation: Isolation = "bwrap",
    ):
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ValueError(f"SandboxPool: max_workers must be a positive int, got {max_workers!r}")
        self.limits = limits or SandboxLimits()
        self.search_fn = _as_search_fn(search_fn)
        self.isolation: Isolation = isolation
        self.mode = sandbox_mode(isolation)  # resolve (and warn) now, not inside the first worker
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="agentcredit-sandbox")

    def submit(self, code: str) -> Future[SandboxResult]:
        return self._executor.submit(
            run_python, code, limits=self.limits, search_fn=self.search_fn, isolation=self.isolation
        )

    def map(self, codes: Iterable[str]) -> list[SandboxResult]:
        """Run every code block; results come back in the order of ``codes``."""
        return [future.result() for future in [self.submit(code) for code in codes]]

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _as_search_fn(search_fn: Any) -> SearchFn | None:
    if search_fn is None or callable(search_fn):
        return search_fn
    method = getattr(search_fn, "search", None)
    if callable(method):
        return method
    raise ValueError(
        f"search_fn must be a callable (query, k) -> str or an object with a .search(query, k) method, "
        f"got {type(search_fn).__name__}"
    )
