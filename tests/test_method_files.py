"""A built-in method is its method file, its presets and its tests (issue 37), shown on GiGPO.

Nothing lists the built-in methods by hand: ``agentcredit.credit.methods`` registers every module of its package
(:data:`~agentcredit.credit.methods.BUILT_IN`), the native ``algorithm`` block and verl's ``agentcredit`` block get
one settings section per built-in method from it (:func:`agentcredit.config.method_sections`), verl runs any
method from its generic Hydra config (a paper recipe per method is optional), and the test tables iterate over it. The last test greps the repository for ``gigpo`` and
finds it only in GiGPO's own files, the docs and the tests (and the allow-listed files below, each with its reason).
"""

from __future__ import annotations

import importlib
import pkgutil
import shutil
import subprocess
from pathlib import Path

import pytest

import agentcredit.credit.methods as methods_package
from agentcredit.config import CONFIG_DIR, AlgorithmConfig
from agentcredit.credit.methods import BUILT_IN, METHODS

ROOT = Path(__file__).resolve().parents[1]

#: GiGPO's own files: its method file (maths, settings, needs, estimate) and its preset; verl runs it from the
#: generic config (``--config-name agentcredit agentcredit.method=gigpo``), with no file of its own.
GIGPO_FILES = {
    "agentcredit/credit/methods/gigpo.py",
    "agentcredit/configs/methods/gigpo.yaml",
}
#: other files that name GiGPO, each with why it stays; the list only ever shrinks (agentcredit.credit re-exports
#: each home's public maths from the registry, without naming the method)
ALLOWED: dict[str, str] = {}


def _method_modules() -> list[str]:
    return [
        info.name
        for info in pkgutil.iter_modules(methods_package.__path__)
        if info.name != "base" and not info.name.startswith("_")
    ]


def test_every_method_file_is_registered():
    modules = _method_modules()
    found = [importlib.import_module(f"agentcredit.credit.methods.{m}").METHOD.name for m in modules]
    assert list(BUILT_IN) == found
    assert all(METHODS[name].name == name for name in BUILT_IN)


def test_every_built_in_method_has_its_sections_and_preset():
    from agentcredit.integrations.verl import GENERIC_CONFIG, METHOD_CONFIGS, config_dir
    from agentcredit.integrations.verl.settings import AgentCreditSettings

    # a verl recipe is optional (a paper's setting); every method runs from the generic config
    assert set(METHOD_CONFIGS) < set(BUILT_IN) and (config_dir() / f"{GENERIC_CONFIG}.yaml").is_file()
    for name in BUILT_IN:
        method = METHODS[name]
        for block in (AlgorithmConfig, AgentCreditSettings):  # the native block and verl's
            field = block.model_fields[method.section]
            assert issubclass(field.annotation, method.settings), (block.__name__, name)
            assert isinstance(field.default_factory(), method.settings)
        assert (CONFIG_DIR / "methods" / f"{name}.yaml").is_file(), name
        if name in METHOD_CONFIGS:
            assert (config_dir() / f"{METHOD_CONFIGS[name]}.yaml").is_file(), name


def _repository_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout (lists the repository's files)")
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [p for p in out.splitlines() if (ROOT / p).is_file()]


def test_gigpo_is_named_only_in_its_own_files_its_tests_and_the_docs():
    named = []
    for rel in _repository_files():
        # studies/: a study chooses the methods it compares, which is not part of adding one
        if rel in GIGPO_FILES or rel.startswith(("tests/", "docs/", "studies/")) or rel == "README.md":
            continue
        try:
            text = (ROOT / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a binary file
        if "gigpo" in text.lower():
            named.append(rel)
    unexpected = sorted(set(named) - set(ALLOWED))
    assert not unexpected, f"GiGPO is named outside its method file, presets, tests and docs: {unexpected}"
    assert set(ALLOWED) <= set(named), f"allow-listed but no longer naming gigpo: {set(ALLOWED) - set(named)}"
