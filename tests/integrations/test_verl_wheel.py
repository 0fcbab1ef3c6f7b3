"""The install commands of docs/scaling-out-with-verl.md work, and the wheel they build carries the verl plugin.

agentcredit is not on a package index, so a cluster installs it from a checkout or from a wheel built once. The
commands are read from the doc's "Install" section, never restated here: the wheel is built with the doc's own
`pip wheel` line (plus `--no-build-isolation`, so no build backend is downloaded) in a copy of the package under
pytest's tmp_path, then opened and run from its own files. The checks that need verl (resolving the documented
`[verl]` installs, registration from the wheel) run in .venv-verl (`make test-verl`) and are skipped elsewhere.
"""

from __future__ import annotations

import email
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

from agentcredit.integrations.verl import (
    AGENT_LOOP_NAME,
    ESTIMATOR_NAMES,
    METHOD_CONFIGS,
    REGISTER_MODULE,
    TRAINER_NAME,
    VERL_VERSION,
)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "scaling-out-with-verl.md"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
VERSION = PYPROJECT["project"]["version"]
#: How the doc names the checkout; the tests put their copy of the package there.
CHECKOUT = "/path/to/agentcredit"
WHEEL_NAME = f"agentcredit-{VERSION}-py3-none-any.whl"
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")


def _install_commands() -> list[list[str]]:
    """The shell commands of the doc's Install section, tokenised (comments dropped, `&&` chains split)."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index("## Install (every node)")
    end = text.index("\n## ", start + 1)
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text[start:end], re.S):
        for line in block.splitlines():
            tokens = shlex.split(line, comments=True)
            while tokens:
                cut = tokens.index("&&") if "&&" in tokens else len(tokens)
                commands.append(tokens[:cut])
                tokens = tokens[cut + 1 :]
    return [c for c in commands if c]


def _pip(sub: str) -> list[list[str]]:
    return [c for c in _install_commands() if c[:2] == ["pip", sub]]


def _agentcredit_installs() -> list[list[str]]:
    return [c for c in _pip("install") if any("agentcredit" in arg for arg in c[2:])]


def _localised(command: list[str], checkout: Path) -> list[str]:
    """``pip ...`` as ``<this python> -m pip ...``, with the doc's checkout path replaced by ``checkout``."""
    return [sys.executable, "-m", *(arg.replace(CHECKOUT, str(checkout)) for arg in command)]


def _verl_extra() -> list[str]:
    return PYPROJECT["project"]["optional-dependencies"]["verl"]


# ---------------------------------------------------------------- the doc's commands, without building anything


def test_docs_install_agentcredit_from_a_checkout_or_a_wheel_never_by_index_name():
    installs = _agentcredit_installs()
    targets = [arg for c in installs for arg in c[2:] if "agentcredit" in arg]
    assert targets, "the Install section installs no agentcredit at all"
    for target in targets:
        # `pip install "agentcredit[verl]"` asks an index for a package that is not published there
        assert target.startswith((CHECKOUT, ".", "/")), f"{target!r} is not a path"
        assert target.endswith("[verl]"), f"{target!r} lacks the verl extra"
    assert f"{CHECKOUT}[verl]" in targets  # from source
    assert any(c[2] == "-e" for c in installs)  # editable checkout
    wheel_targets = [t for t in targets if ".whl" in t]
    assert wheel_targets == [f"{CHECKOUT}/dist/{WHEEL_NAME}[verl]"], (
        "the wheel install must name the file `pip wheel ... -w dist/` writes for this version"
    )
    text = DOC.read_text(encoding="utf-8")
    assert not re.search(r"^\s*pip install [\"']?agentcredit\[", text, re.M)


def test_docs_pin_the_verl_release_the_extra_pins():
    verl_lines = [c for c in _pip("install") if any(a.startswith("verl[") for a in c[2:])]
    assert verl_lines, "the Install section no longer installs verl's GPU stack"
    for command in verl_lines:
        (target,) = [a for a in command[2:] if a.startswith("verl[")]
        assert target.endswith(f"=={VERL_VERSION}")
    assert f"verl=={VERL_VERSION}" in _verl_extra()


def test_docs_build_the_wheel_in_the_checkout():
    commands = _install_commands()
    (build,) = _pip("wheel")
    assert "--no-deps" in build and "-w" in build
    before = commands[: commands.index(build)]
    assert ["cd", CHECKOUT] in before, "the wheel is built from the checkout"


# ---------------------------------------------------------------- the wheel the doc's command builds


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of the package source (what a checkout holds for the build), named like the doc's checkout."""
    dest = tmp_path_factory.mktemp("src") / "agentcredit"
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "agentcredit", dest / "agentcredit", ignore=IGNORED)
    return dest


@pytest.fixture(scope="module")
def wheel(checkout) -> Path:
    pytest.importorskip("setuptools")  # the build backend, used in place (--no-build-isolation: no download)
    (build,) = _pip("wheel")
    command = _localised(build, checkout) + ["--no-build-isolation", "--disable-pip-version-check"]
    started = time.monotonic()
    proc = subprocess.run(command, cwd=checkout, capture_output=True, text=True, timeout=600)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, (
        f"{shlex.join(command)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    out = checkout / build[build.index("-w") + 1]
    assert sorted(p.name for p in out.iterdir()) == [WHEEL_NAME], "the doc names another wheel file"
    print(f"wheel built in {elapsed:.1f} s: {shlex.join(command)}")
    return out / WHEEL_NAME


def _names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


def _read(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(name).decode("utf-8")


def test_wheel_holds_every_file_of_the_package(wheel, checkout):
    """Code and package data alike: every file under agentcredit/ reads something at run time."""
    source = {
        p.relative_to(checkout).as_posix()
        for p in (checkout / "agentcredit").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    names = _names(wheel)
    missing = sorted(source - names)
    assert not missing, f"the wheel lacks (package data in pyproject.toml?): {missing}"
    stray = sorted(n for n in names - source if not n.startswith(f"agentcredit-{VERSION}.dist-info/"))
    assert not stray, f"the wheel carries files that are not in the package: {stray}"


def test_wheel_holds_what_the_verl_plugin_reads(wheel):
    names = _names(wheel)
    verl = "agentcredit/integrations/verl/"
    for module in ("__init__", "__main__", "register", "agent_loop", "trainer", "advantages", "estimators"):
        assert f"{verl}{module}.py" in names
    configs = {n.removeprefix(f"{verl}config/") for n in names if n.startswith(f"{verl}config/")}
    # cpu/laptop.yaml: the `+cpu=laptop` scale-down of verl's own loop on the CPU
    assert configs == {"agentcredit_base.yaml", "agentcredit.yaml", "cpu/laptop.yaml"} | {
        f"{c}.yaml" for c in METHOD_CONFIGS.values()
    }
    # prepare-data's default --val nq,hotpotqa falls back on the shipped samples, search on their corpora
    for sample in ("nq-dev", "hotpotqa-dev", "musique-dev", "2wiki-dev", "bamboogle-test", "gsm8k-test"):
        assert f"agentcredit/data/samples/{sample}.jsonl.gz" in names
    for corpus in ("hotpotqa", "musique", "2wiki"):
        assert f"agentcredit/data/samples/corpora/{corpus}.jsonl.gz" in names
    assert "agentcredit/data/tools/knowledge.jsonl" in names  # PORTool's tool suite


def test_wheel_registers_the_plugin_the_way_verl_finds_it(wheel):
    """verl 0.9.1 loads the ``verl.plugins`` entry points at ``import verl`` in every process: the wheel declares
    the register module there, so no VERL_USE_EXTERNAL_MODULES is needed (nor forwarded by the configs)."""
    base = yaml.safe_load(_read(wheel, "agentcredit/integrations/verl/config/agentcredit_base.yaml"))
    assert "ray_kwargs" not in base
    assert f"{REGISTER_MODULE.replace('.', '/')}.py" in _names(wheel)
    entry_points = _read(wheel, f"agentcredit-{VERSION}.dist-info/entry_points.txt")
    assert re.search(r"^\[console_scripts\]\s*\nagentcredit = agentcredit\.cli:app$", entry_points, re.M)
    assert re.search(
        rf"^\[verl\.plugins\]\s*\nagentcredit = {re.escape(REGISTER_MODULE)}$", entry_points, re.M
    )


def test_wheel_metadata_carries_the_verl_extra(wheel):
    meta = email.message_from_string(_read(wheel, f"agentcredit-{VERSION}.dist-info/METADATA"))
    assert "verl" in meta.get_all("Provides-Extra")
    pinned = sorted(
        req.split(";")[0].replace(" ", "")
        for req in meta.get_all("Requires-Dist")
        if re.search(r"extra\s*==\s*[\"']verl[\"']", req)
    )
    assert pinned == sorted(r.replace(" ", "") for r in _verl_extra())


def _from_the_wheel(wheel: Path, where: Path, code: str, **env_extra: str) -> subprocess.CompletedProcess:
    """Run ``code`` with the unpacked wheel first on sys.path, away from the checkout and its data folder."""
    site = where / "site"
    if not site.exists():
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(site)
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTCREDIT_DATA", "VERL_USE_EXTERNAL_MODULES")}
    env.update(PYTHONPATH=str(site), AGENTCREDIT_HOME=str(where / "home"), **env_extra)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=where, env=env, capture_output=True, text=True, timeout=300
    )


RUN_FROM_WHEEL = """
import json, subprocess, sys, warnings
warnings.simplefilter("ignore")
import agentcredit
from agentcredit.integrations.verl import config_dir
from agentcredit.tasks import load_task, task_corpus
from agentcredit.tools.suite.data import data_text
helper = subprocess.run([sys.executable, "-m", "agentcredit.integrations.verl", "config-dir"],
                        capture_output=True, text=True, check=True).stdout.strip()
print(json.dumps({
    "package": agentcredit.__file__,
    "config_dir": str(config_dir()),
    "helper": helper,
    "configs": sorted(p.name for p in config_dir().glob("*.yaml")),
    "nq": len(load_task("nq")),
    "hotpotqa": len(load_task("hotpotqa")),
    "corpus": str(task_corpus("hotpotqa")),
    "knowledge": len(data_text("knowledge.jsonl").splitlines()),
}))
"""


@pytest.mark.slow
def test_wheel_runs_from_its_own_files(wheel, tmp_path):
    proc = _from_the_wheel(wheel, tmp_path, RUN_FROM_WHEEL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    site = tmp_path / "site"
    assert Path(found["package"]).is_relative_to(site)
    assert Path(found["config_dir"]) == Path(found["helper"]) == site / "agentcredit/integrations/verl/config"
    assert found["configs"] == sorted(
        {"agentcredit_base.yaml", "agentcredit.yaml"} | {f"{c}.yaml" for c in METHOD_CONFIGS.values()}
    )
    assert found["nq"] > 0 and found["hotpotqa"] > 0 and found["knowledge"] > 0
    assert Path(found["corpus"]).is_file()


# ---------------------------------------------------------------- with verl installed (.venv-verl)


REGISTER_FROM_WHEEL = """
import json, sys
import verl  # loads the verl.plugins entry points (the wheel's dist-info is on the path), as in every Ray worker
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.trainer.ppo.v1 import get_trainer_cls
print(json.dumps({
    "register": sys.modules[%(register)r].__file__,
    "estimators": [get_adv_estimator_fn(n).__module__ for n in %(estimators)r],
    "agent_loop": _agent_loop_registry.get(%(agent)r),
    "trainer": get_trainer_cls(%(trainer)r).__name__,
}))
"""


@pytest.mark.verl
def test_wheel_registers_in_verl(wheel, tmp_path):
    pytest.importorskip("verl")
    code = REGISTER_FROM_WHEEL % {
        "register": REGISTER_MODULE,
        "estimators": ESTIMATOR_NAMES,
        "agent": AGENT_LOOP_NAME,
        "trainer": TRAINER_NAME,
    }
    proc = _from_the_wheel(wheel, tmp_path, code, VERL_USE_EXTERNAL_PLUGINS="agentcredit")
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(found["register"]).is_relative_to(tmp_path / "site")
    assert found["estimators"] == ["agentcredit.integrations.verl.estimators"] * len(ESTIMATOR_NAMES)
    assert found["agent_loop"] == {
        "_target_": "agentcredit.integrations.verl.agent_loop.AgentCreditAgentLoop"
    }
    assert found["trainer"] == "AgentCreditTrainer"


@pytest.mark.verl
def test_documented_installs_resolve_with_the_verl_extra(wheel, checkout):
    """Every `pip install` of agentcredit in the doc, dry-run offline against the installed verl stack."""
    pytest.importorskip("verl")
    for documented in _agentcredit_installs():
        command = _localised(documented, checkout) + [
            "--dry-run",
            "--no-index",
            "--no-build-isolation",
            "--disable-pip-version-check",
        ]
        proc = subprocess.run(command, cwd=checkout, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{shlex.join(command)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        assert f"Would install agentcredit-{VERSION}" in proc.stdout
        assert f"verl=={VERL_VERSION}" in proc.stdout  # the extra was applied, and is satisfied
