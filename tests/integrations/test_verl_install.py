"""The documented install line against verl 0.9.1's own metadata and this repository's ``verl`` extra (issue 36).

``pip install "verl[vllm]==0.9.1"`` brought vLLM but neither flash-attn (verl's FSDP workers load models with
``flash_attention_2`` by default) nor cupy (TIPS's ``nccl`` checkpoint engine imports it in every actor worker):
only verl's ``fsdp`` / ``megatron`` extras pull them. The docs now say ``verl[vllm,fsdp]==0.9.1``.

What this checks, offline: the extras the documented line names, expanded through verl's installed metadata
(``Requires-Dist`` with its ``extra ==`` markers, verl's extras that name verl's other extras followed), pull
vLLM, flash-attn and cupy; the version is the one this repository pins. A real ``pip install --dry-run`` of the
line is not run: resolving it needs the package index (vLLM's and torch's CUDA wheels' metadata), which a CI
machine without network cannot reach, so the resolve is done here on verl's own metadata only.
"""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import metadata, requires
from pathlib import Path

import pytest

pytest.importorskip("verl")

from packaging.requirements import Requirement  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402

from agentcredit.integrations.verl import VERL_VERSION  # noqa: E402

pytestmark = pytest.mark.verl

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "scaling-out-with-verl.md"
#: the documented install line of verl's GPU stack
LINE = re.compile(r'^pip install "verl\[([a-z0-9,-]+)\]==([0-9.]+)"', re.MULTILINE)


def _documented() -> tuple[list[str], str]:
    lines = LINE.findall(DOC.read_text())
    assert len(lines) == 1, f'expected one `pip install "verl[...]==..."` line in {DOC.name}, found {lines}'
    extras, version = lines[0]
    return extras.split(","), version


def closure(extras: list[str]) -> set[str]:
    """Canonical names of the distributions ``verl[extras]`` requires (one level below verl: its own
    requirements and those of the named extras, following extras that name verl's other extras)."""
    reqs = [Requirement(r) for r in requires("verl") or []]
    wanted, seen, names = list(extras), set(), set()
    base = {"extra": ""}
    for r in reqs:  # unconditional requirements
        if r.marker is None or r.marker.evaluate(base):
            names.add(canonicalize_name(r.name))
    while wanted:
        extra = wanted.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for r in reqs:
            if r.marker is None or not r.marker.evaluate({"extra": extra}) or r.marker.evaluate(base):
                continue
            if canonicalize_name(r.name) == "verl":
                wanted.extend(r.extras)
            else:
                names.add(canonicalize_name(r.name))
    return names


def test_documented_line_pins_the_verl_of_this_repository():
    extras, version = _documented()
    assert version == VERL_VERSION == metadata("verl")["Version"]
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["verl"]
    assert f"verl=={VERL_VERSION}" in pins
    declared = set(metadata("verl").get_all("Provides-Extra") or [])
    assert set(extras) <= declared, f"verl {version} has no extra(s) {set(extras) - declared}"


def test_documented_extras_pull_vllm_flash_attn_and_cupy():
    extras, _ = _documented()
    pulled = closure(extras)
    for name in ("vllm", "flash-attn", "transferqueue", "torch"):
        assert name in pulled, f"verl[{','.join(extras)}] does not pull {name}"
    assert any(n.startswith("cupy-cuda") for n in pulled), f"verl[{','.join(extras)}] pulls no cupy"


def test_vllm_extra_alone_lacks_flash_attn_and_cupy():
    """Why the line names fsdp: verl[vllm] alone fails at launch (no flash-attn, no cupy for nccl)."""
    pulled = closure(["vllm"])
    assert "vllm" in pulled and "flash-attn" not in pulled
    assert not any(n.startswith("cupy") for n in pulled)
