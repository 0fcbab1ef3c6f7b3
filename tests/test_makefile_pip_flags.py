"""The set-up step stays quiet: every pip call in the Makefile passes --disable-pip-version-check and -qq
(errors only, no build-backend deprecation banners), and the install order is unchanged: pinned torch first,
then the package (issue 11, item 5)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("target", ["setup-dev", "setup", "test-verl"])
def test_make_setup_pip_calls_are_quiet_and_torch_first(target, tmp_path):
    dry = subprocess.run(
        ["make", "-n", "-C", str(ROOT), target, f"VENV={tmp_path / 'v'}", f"VERL_VENV={tmp_path / 'vv'}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pip = [line for line in dry.splitlines() if "-m pip install" in line]
    assert len(pip) == 3, dry
    for line in pip:
        assert "--disable-pip-version-check" in line.split() and "-qq" in line.split(), line
    assert "--upgrade pip" in pip[0]
    assert "torch==" in pip[1] and " -e " in pip[2]  # pinned torch before the package
