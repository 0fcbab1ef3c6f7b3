"""The package's layers point one way and no package has an import cycle (issue 14; docs/architecture.md).

import-linter reads the contracts from pyproject.toml and checks every import, function-local ones included (they
hid the old eval <-> train cycle). ``make lint`` runs the same check. It runs in a child process: import-linter
configures logging with ``dictConfig``, which disables every logger already created in the calling process (in
the suite, it silenced the BM25 index's cache warnings for every later test).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECK = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True))"


def test_import_contracts_hold():
    done = subprocess.run(
        [sys.executable, "-c", CHECK, str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
