"""The sandbox's value types: limits, results, the isolation mode, and host-side settings.

They live apart from :mod:`agentcredit.tools.sandbox` (which re-exports the public ones) so that the
session code and the public API can share them without importing each other.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Literal

KiB, MiB = 1024, 1024 * 1024
Isolation = Literal["bwrap", "rlimits"]
SearchFn = Callable[[str, int], str]
ErrorKind = Literal["timeout", "memory", "cpu", "output", "exception", "crash", "exit", "setup", "input"]


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed call. Every field can be set; the defaults suit carl-segment's tool."""

    timeout: float = 5.0
    """Wall-clock seconds before the whole sandbox is killed (carl-segment §2.4 recommends 5-10 s)."""
    cpu_seconds: int | None = None
    """RLIMIT_CPU per process (SIGXCPU, then SIGKILL one second later); None means ceil(timeout) + 1."""
    memory_bytes: int = 512 * MiB
    """RLIMIT_AS per process: allocations beyond it raise MemoryError."""
    max_processes: int = 16
    """RLIMIT_NPROC: processes *and threads* the code may have at once, the interpreter included."""
    output_bytes: int = 8 * KiB
    """stdout+stderr kept (head and tail) in ``output``; the cut is marked in the text."""
    output_kill_bytes: int = 1 * MiB
    """A program that writes more than this in total is killed (an output flood is a failure, not a result)."""
    file_bytes: int = 16 * MiB
    """RLIMIT_FSIZE: largest file the code may write."""
    tmp_bytes: int = 64 * MiB
    """Bytes the code may write to its /tmp, /dev/shm and working directory together (bwrap mode: they live in
    memory). Without root each of the three is its own tmpfs capped at this size."""
    tmp_inodes: int = 16_384
    """Files and directories the code may create there (bwrap mode with a root host). Each costs the host about
    1 KiB of kernel memory whatever its size (180k empty files held 180 MiB); 16k is ~16 MiB."""
    open_files: int = 256
    """RLIMIT_NOFILE."""
    traceback_lines: int = 8
    """Lines of an exception's traceback kept (the last ones: where it failed and why)."""
    max_search_calls: int = 32
    """search() calls answered per run; later calls raise inside the sandbox."""
    search_result_bytes: int = 64 * KiB
    """A search answer longer than this is cut (marked) before it is sent to the sandbox."""
    max_code_bytes: int = 256 * KiB
    """Code longer than this is refused without being run."""

    def __post_init__(self) -> None:
        if not (isinstance(self.timeout, int | float) and math.isfinite(self.timeout) and self.timeout > 0):
            raise ValueError(
                f"SandboxLimits.timeout must be a positive number of seconds, got {self.timeout!r}"
            )
        if self.cpu_seconds is not None and (not isinstance(self.cpu_seconds, int) or self.cpu_seconds < 1):
            raise ValueError(
                f"SandboxLimits.cpu_seconds must be a positive int or None, got {self.cpu_seconds!r}"
            )
        minimum = {
            "memory_bytes": 64 * MiB,
            "output_bytes": 64,
            "file_bytes": 0,
            "tmp_bytes": MiB,
            "tmp_inodes": 64,
        }
        for f in fields(self):
            if f.name in ("timeout", "cpu_seconds"):
                continue
            value = getattr(self, f.name)
            low = minimum.get(f.name, 1)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"SandboxLimits.{f.name} must be an int >= {low}, got {value!r}")
        if self.output_kill_bytes < self.output_bytes:
            raise ValueError(
                f"SandboxLimits.output_kill_bytes ({self.output_kill_bytes}) must be >= output_bytes "
                f"({self.output_bytes})"
            )

    @property
    def cpu_limit(self) -> int:
        return self.cpu_seconds if self.cpu_seconds is not None else math.ceil(self.timeout) + 1


@dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed run gave. ``ok`` is True when the program ran to the end with exit status 0."""

    ok: bool
    output: str
    """What the program printed (stdout and stderr interleaved, capped), then the traceback's last lines."""
    error: str | None = None
    """Why it failed, in words, or None when ok."""
    error_kind: ErrorKind | None = None
    """The failure's category, for metrics and for :func:`tool_text`."""
    exit_code: int | None = None
    seconds: float = 0.0
    mode: str = ""
    truncated: bool = False
    search_calls: int = 0


@dataclass(frozen=True)
class SandboxMode:
    """The isolation mode in force, and what it could set up on this machine."""

    name: Literal["bwrap", "rlimits"]
    dedicated_uid: bool
    """True when the host is root, so every run gets a uid of its own (the process cap then really holds)."""
    network: str
    """How the network is cut off: 'namespace (bubblewrap)', 'namespace' or 'python-level block only'."""
    reason: str
    """Why this mode was chosen."""


@dataclass(frozen=True)
class SandboxSettings:
    """Host-side settings that are not resource limits; change them with ``agentcredit.tools.sandbox.configure``."""

    python: str = field(default_factory=lambda: sys.executable)
    """The interpreter run inside the sandbox. In fallback mode its files must be readable by other users."""
    uid_base: int = 1_990_000
    """First of the uids leased to sandboxes when the host is root (none of them may be a real account)."""
    uid_count: int = 256
    """How many uids; at most this many sandboxes run at once on the machine (all processes together)."""
    tmp_root: str | None = None
    """Where the fallback mode makes its temporary working directories (None: the system temp directory)."""

    def __post_init__(self) -> None:
        if not isinstance(self.uid_base, int) or not 1000 <= self.uid_base < 2**31 - self.uid_count:
            raise ValueError(
                f"SandboxSettings.uid_base must be an int in [1000, 2**31 - uid_count), got {self.uid_base!r}"
            )
        if not isinstance(self.uid_count, int) or self.uid_count < 1:
            raise ValueError(f"SandboxSettings.uid_count must be a positive int, got {self.uid_count!r}")
