"""The lab stays apart from the library: importing the command line (every start of `agentcredit`, whichever
command) loads no module of agentcredit.lab; the lab's commands import it when they run. The import contracts in
pyproject.toml (tests/test_architecture.py) forbid every library module to import it at all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECK = (
    "import sys, agentcredit.cli, agentcredit.run; "
    "print(sorted(m for m in sys.modules if m == 'agentcredit.lab' or m.startswith('agentcredit.lab.')))"
)


def test_the_command_line_loads_no_lab_module_until_a_lab_command_runs():
    done = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout
