"""The sandbox works wherever the interpreter lives, /tmp included (issue 11, item 2).

bubblewrap applies its mount operations in order, and the sandbox mounts a fresh tmpfs on /tmp. When that tmpfs
came after the read-only binds of the interpreter's directories, a virtualenv under /tmp (a checkout cloned to
/tmp) vanished inside the sandbox: ``run_python('print(1)')`` raised there, and every tool call of a run became
``ERROR: the python sandbox is unavailable``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyseccomp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcredit.tools.sandbox import tool as ps
from agentcredit.tools.sandbox.config import SandboxLimits, SandboxSettings
from agentcredit.tools.sandbox.session import _bwrap_argv, bwrap_workdir

REPO = Path(__file__).resolve().parents[2]


def _operation_index(argv: list[str], option: str, path: str) -> int:
    for i in range(len(argv) - 1):
        if argv[i] == option and argv[i + 1] == path:
            return i
    raise AssertionError(f"{option} {path} is not in the bubblewrap command: {argv}")


def test_bwrap_mounts_the_private_tmp_before_binding_a_venv_under_tmp():
    venv = "/tmp/agentcredit-some-clone/.venv"
    settings = SandboxSettings(python=f"{venv}/bin/python")
    argv = _bwrap_argv(settings, SandboxLimits(), rootless=False)
    tmpfs = _operation_index(argv, "--tmpfs", "/tmp")
    bind = _operation_index(argv, "--ro-bind", venv)
    assert tmpfs < bind, (
        "a tmpfs mounted after the bind hides the venv (bubblewrap applies operations in order)"
    )
    # The empty parents are made 0755 inside the fresh tmpfs (after it), and /tmp itself keeps its 1777 mount.
    parent = _operation_index(argv, "--dir", "/tmp/agentcredit-some-clone")
    assert tmpfs < parent < bind
    assert ("--dir", "/tmp") not in list(zip(argv, argv[1:], strict=False))


@pytest.fixture(scope="module")
def tmp_venv():
    """A bare venv (no pip, no packages: the sandbox child needs only the standard library) under /tmp."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    try:
        ps.sandbox_mode("bwrap")
    except RuntimeError as exc:
        pytest.skip(f"bubblewrap does not work here: {exc}")
    root = tempfile.mkdtemp(prefix="agentcredit-tmp-venv-", dir="/tmp")
    try:
        venv = Path(root) / "clone" / ".venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        yield venv
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run_in(venv: Path, code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
    # the package from this checkout and the host-side seccomp binding (the sandbox's own interpreter needs
    # neither: the host compiles the filter); the interpreter from the venv under /tmp
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(Path(pyseccomp.__file__).parent)])
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        capture_output=True, text=True, env=env, cwd="/tmp", timeout=120, check=False,
    )  # fmt: skip


def test_print_1_runs_in_bwrap_from_a_venv_under_tmp(tmp_venv):
    code = (
        "import sys\n"
        "from agentcredit.tools.sandbox import run_python, sandbox_mode\n"
        f"assert sys.prefix == {str(tmp_venv)!r}, sys.prefix\n"
        "result = run_python('print(1)', isolation='bwrap')\n"
        "print('RESULT', result.ok, repr(result.output), result.error)\n"
        "print('MODE', sandbox_mode().name)\n"
        # the venv's own directory and the base interpreter's standard library are both visible inside
        "result = run_python('import sys, decimal; print(sys.prefix, decimal.Decimal(6) * 7)', isolation='bwrap')\n"
        "print('PREFIX', result.ok, repr(result.output))\n"
    )
    done = _run_in(tmp_venv, code)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "RESULT True '1\\n' None" in lines, done.stdout + done.stderr
    assert "MODE bwrap" in lines, done.stdout + done.stderr  # the default mode: bubblewrap
    assert f"PREFIX True '{tmp_venv} 42\\n'" in lines, done.stdout + done.stderr


def test_preflight_passes_from_a_venv_under_tmp(tmp_venv):
    done = _run_in(
        tmp_venv,
        "from agentcredit.tools.sandbox import check_available\ncheck_available()\nprint('PREFLIGHT OK')",
    )
    assert done.returncode == 0 and "PREFLIGHT OK" in done.stdout, done.stdout + done.stderr


def test_bwrap_working_directory_is_never_a_parent_of_a_bind():
    """Issue 39, item 1: with a venv under /tmp, bubblewrap made its parents inside the working directory."""
    for venv in ("/tmp/nc/agentcredit/.venv", "/home/sandbox/x/.venv", "/work/main/.venv"):
        argv = _bwrap_argv(SandboxSettings(python=f"{venv}/bin/python"), SandboxLimits(), rootless=False)
        workdir = argv[argv.index("--chdir") + 1]
        binds = [argv[i + 1] for i, a in enumerate(argv) if a == "--ro-bind"]
        assert all(not (b + "/").startswith(workdir + "/") for b in binds), (workdir, binds)
        assert all(not workdir.startswith(b + "/") for b in binds), (workdir, binds)
        assert _operation_index(argv, "--tmpfs", workdir) < argv.index("--chdir")  # a fresh, empty tmpfs


def test_working_directory_is_empty_with_a_venv_under_tmp(tmp_venv):
    """Issue 39, item 1: ``os.listdir('.')`` printed ``['nc']`` when the checkout and its venv lived in /tmp/nc."""
    code = (
        "from agentcredit.tools.sandbox import run_python\n"
        "result = run_python(\"import os\\nprint(os.listdir('.'), os.getcwd() == os.environ['HOME'])\\n"
        "print(sorted(os.listdir('/tmp')))\", isolation='bwrap')\n"
        "print('RESULT', result.ok, repr(result.output), result.error)\n"
    )
    done = _run_in(tmp_venv, code)
    assert done.returncode == 0, done.stdout + done.stderr
    # the venv's parents are in /tmp (it is bound there at its own path), but the working directory is empty
    top = Path(tmp_venv).relative_to("/tmp").parts[0]
    assert f"RESULT True \"[] True\\n['{top}']\\n\" None" in done.stdout.splitlines(), (
        done.stdout + done.stderr
    )


_segment = st.sampled_from(["home", "sandbox", "var", "tmp", "nc", "work", ".venv", "x"])
_paths = st.lists(_segment, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))


@given(st.lists(_paths, max_size=6))
def test_working_directory_is_never_above_below_or_at_a_bind(binds):
    """Property behind issue 39, item 1: whatever the interpreter's directories, the chosen working directory
    holds none of them and is inside none of them, or the choice fails with a message naming them."""
    try:
        workdir = bwrap_workdir(binds)
    except RuntimeError as exc:
        assert "overlap every sandbox working directory" in str(exc)
        return
    for b in binds:
        assert b != workdir and not b.startswith(workdir + "/") and not workdir.startswith(b + "/")
