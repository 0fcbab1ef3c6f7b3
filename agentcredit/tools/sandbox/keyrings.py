"""Kernel keyrings: each sandboxed call starts in a session keyring of its own, not the host's.

Keyrings are not covered by any namespace bubblewrap makes. A process inherits its parent's session keyring, and
possessing a keyring grants the "possessor" permissions on the keys in it, so sandboxed code could read a key the
host had put in its session keyring. Three layers keep keys apart:

1. here, on the host: the call's process tree is started from a thread that first joined a new, empty anonymous
   session keyring (``keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)``), so it inherits that one and never the
   host's. Credentials, session keyring included, are per thread in Linux (since 3.8), so the host's other
   threads keep theirs, and the thread ends with the call;
2. in bubblewrap mode, the seccomp filter (:mod:`agentcredit.tools.sandbox.seccomp`) denies every keyring call;
3. in the fallback mode, which has no filter, the sandbox's bootstrap (``child.py``) joins yet another session
   keyring and clears the leased uid's user and user-session keyrings as that uid, before the code runs, so a
   key one call leaves there is gone for the next call on the uid.

The system call goes through ``ctypes`` (libkeyutils is a thin wrapper over the same call and is not always
installed).
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections.abc import Callable
from typing import TypeVar

from agentcredit.tools.base import ToolUnavailableError

T = TypeVar("T")

KEYCTL_GET_KEYRING_ID = 0
KEYCTL_JOIN_SESSION_KEYRING = 1
KEYCTL_CLEAR = 7
KEYCTL_SEARCH = 10
KEY_SPEC_SESSION_KEYRING = -3
KEY_SPEC_USER_KEYRING = -4
KEY_SPEC_USER_SESSION_KEYRING = -5
# The keyctl system call's number per machine (asm/unistd.h); the only architectures the sandbox is tested on.
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def keyctl(operation: int, *args: int | bytes | None) -> int:
    """``syscall(SYS_keyctl, operation, *args)``; raises OSError with the errno on failure."""
    number = _SYS_KEYCTL.get(os.uname().machine)
    if number is None:
        raise OSError(errno.ENOSYS, f"keyctl: unknown system call number on {os.uname().machine}")
    converted = [ctypes.c_long(a) if isinstance(a, int) else ctypes.c_char_p(a) for a in args]
    result = _libc.syscall(ctypes.c_long(number), ctypes.c_long(operation), *converted)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"keyctl({operation}): {os.strerror(err)}")
    return int(result)


def join_new_session_keyring() -> int | None:
    """Give the calling thread a new, empty anonymous session keyring; returns its id (None: no keyrings here)."""
    try:
        return keyctl(KEYCTL_JOIN_SESSION_KEYRING, None)
    except OSError as exc:
        if exc.errno == errno.ENOSYS:  # a kernel without CONFIG_KEYS has no keyrings to share
            return None
        raise ToolUnavailableError(
            f"the sandbox cannot give its call a session keyring of its own ({exc}); without one the code could "
            "read keys from the host's session keyring"
        ) from exc


def in_fresh_session_keyring(fn: Callable[[], T]) -> T:
    """Run ``fn`` in a new thread that first joined a new session keyring; returns its result or raises its error.

    Every process ``fn`` starts inherits that keyring. The thread lives until ``fn`` returns, which matters:
    ``PR_SET_PDEATHSIG`` (bubblewrap's ``--die-with-parent``) fires when the *thread* that started a child
    ends, so ``fn`` must cover the child's whole life, as :class:`~agentcredit.tools.sandbox.session._Session`
    does.
    """
    outcome: dict[str, object] = {}

    def body() -> None:
        try:
            join_new_session_keyring()
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread, which raises it
            outcome["error"] = exc

    thread = threading.Thread(target=body, name="agentcredit-sandbox-call", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]
