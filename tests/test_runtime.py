"""agentcredit.runtime: the malloc setting the CLI makes at start-up (issue 13)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

CALL = "from agentcredit.runtime import fix_malloc_mmap_threshold as f; print(f())"


def _run(env_extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"} | env_extra
    out = subprocess.run([sys.executable, "-c", CALL], capture_output=True, text=True, env=env, check=True)
    return out.stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt(M_MMAP_THRESHOLD) is a glibc knob")
def test_sets_the_threshold_on_glibc():
    assert _run({}) == "True"


def test_a_threshold_the_user_chose_is_kept():
    assert _run({"MALLOC_MMAP_THRESHOLD_": "65536"}) == "False"
