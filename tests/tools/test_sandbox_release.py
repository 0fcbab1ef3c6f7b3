"""A sandbox's uid goes back to the pool only when the kernel has released every process of it, zombies included.

Regression: bubblewrap's outer process returns as soon as the code's first process exits, while its init in the
pid namespace is still reaping the children killed with it. The uid was released with those zombies still
counted against its ``RLIMIT_NPROC`` (CI once saw nine of them right after a fork bomb's timeout), so the next
sandbox on that uid could start with fewer processes than its limit. The race is rare (not reproduced in 16
loaded runs here), so the end-to-end check stays ``test_sandbox_hostile.py::test_fork_bomb_is_contained``, which
counts zombies; this file pins down the helper the fix waits with.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from agentcredit.tools.sandbox import procs

UID_BASE = 1_996_000  # a range of its own, as in the other sandbox tests

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a dedicated sandbox uid needs root")


@needs_root
def test_zombies_are_seen_only_when_asked():
    child = subprocess.Popen(["/bin/true"], user=UID_BASE, group=UID_BASE, extra_groups=[])
    try:
        while procs.processes_of_uid(UID_BASE):  # until it has exited and is an unreaped zombie
            pass
        assert procs.processes_of_uid(UID_BASE, zombies=True) == [child.pid]
        assert procs.wait_until_released(UID_BASE, wait=0.05) == [child.pid]  # nobody reaps it: it stays
    finally:
        child.wait()
    assert procs.wait_until_released(UID_BASE, wait=0.05) == []
