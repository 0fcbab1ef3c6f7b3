"""Every ``agentcredit`` command writes line by line on a pipe (SFT losses, held-out lines before the first step)."""

from __future__ import annotations

import subprocess
import sys


def test_the_cli_callback_line_buffers_a_piped_stdout():
    child = "import sys; from agentcredit.cli import main; main(); print(sys.stdout.line_buffering)"
    out = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "True"
