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
    for line in pip:
        assert "--disable-pip-version-check" in line.split() and "-qq" in line.split(), line
    assert "--upgrade pip" in pip[0]
    assert "torch==" in pip[1]  # pinned torch before anything that depends on torch
    assert any(" -e " in line for line in pip[2:]), dry


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_setup_dev_installs_bfcl_eval_without_its_dependencies(tmp_path):
    """`make test`'s set-up brings in BFCL (issue 38): the bfcl-eval wheel with --no-deps (its pins would replace
    numpy and pull a dozen provider SDKs), after the package, then the `bfcl` extra."""
    dry = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "setup-dev", f"VENV={tmp_path / 'v'}"], capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip
    pip = [line for line in dry.splitlines() if "-m pip install" in line]
    wheel = next(i for i, line in enumerate(pip) if "bfcl-eval==" in line)
    assert "--no-deps" in pip[wheel].split()
    assert any("[dev" in line for line in pip[:wheel])  # the package first
    assert "[bfcl]" in pip[wheel + 1]
