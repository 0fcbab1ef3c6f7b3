"""The package's layers point one way and no package has an import cycle (issue 14; docs/architecture.md).

import-linter reads the contracts from pyproject.toml and checks every import, function-local ones included (they
hid the old eval <-> train cycle). ``make lint`` runs the same check.
"""

from __future__ import annotations

from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold():
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0
