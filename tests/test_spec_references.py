"""Every spec a comment cites ships with the repository (issue 14: they pointed into ../shared, which users lack).

A comment cites ``<spec>.md §x`` or, in a module about one method, ``spec §x``; the file must exist under
``docs/specs/`` (or be one of the docs under ``docs/``), and a module that says ``spec §x`` must name its spec.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(
    [
        p
        for ext in ("*.py", "*.yaml")
        for p in (ROOT / "agentcredit").rglob(ext)
        if "__pycache__" not in p.parts
    ]
    + [p for p in (ROOT / "tests").rglob("*.py") if "__pycache__" not in p.parts]
    + [*(ROOT / "docs").glob("*.md"), ROOT / "README.md"]
)
DOCS = {p.name for p in (ROOT / "docs").rglob("*.md") if "results" not in p.parts}
SPECS = {p.name for p in (ROOT / "docs" / "specs").glob("*.md")} - {"README.md"}
# names of files the code writes, not citations
WRITTEN = {"README.md", "report.md", "table.md"}
BARE = re.compile(r"\bspecs? (?:§|A\d|\[R\]|item|section|\d)")


def test_the_method_specs_ship():
    assert {"carl-segment.md", "carl-critical-actions.md", "portool.md", "tips.md", "gear.md"} <= SPECS


def test_every_cited_markdown_file_exists():
    missing = []
    for path in SOURCES:
        for name in set(re.findall(r"\b([a-z][a-z0-9-]*\.md)\b", path.read_text(encoding="utf-8"))):
            if name not in DOCS and name not in WRITTEN:
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, missing


def test_a_bare_spec_reference_names_its_spec():
    unnamed = [
        str(path.relative_to(ROOT))
        for path in SOURCES
        if BARE.search(text := path.read_text(encoding="utf-8")) and not any(s in text for s in SPECS)
    ]
    assert not unnamed, f"say which docs/specs/*.md these modules cite: {unnamed}"
