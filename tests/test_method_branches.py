"""No code outside ``agentcredit/credit/methods/`` branches on a method's name (issue 37).

A method is one object (:mod:`agentcredit.credit.methods`): the trainers, the verl adapter, the config and the
environment read its :class:`~agentcredit.credit.Needs` and settings, so adding a method touches its method file,
its preset and its tests. This test greps the package for a comparison of a method, estimator, shaping or reweight
value with a registered method's name (``estimator == "portool"``, ``method in ("gae", "segment")``) and for a
lookup keyed by one (``{...}[cfg.estimator]``). What is left is allow-listed below with the reason; the list only
ever shrinks.
"""

from __future__ import annotations

import re
from pathlib import Path

from agentcredit.credit import METHODS

PACKAGE = Path(__file__).resolve().parents[1] / "agentcredit"
NAMES = sorted(
    {n for m in METHODS.values() for n in (m.name, m.section)} | {"gae", "segment", "critical"}
)  # old estimator names too
QUOTED = "|".join(re.escape(n) for n in NAMES)
BRANCH = re.compile(
    rf"\b(method|estimator|shaping|reweight|preset)\b[^#\n]*?(==|!=|\bin\b)\s*[\(\[\{{]?[^#\n]*?['\"]({QUOTED})['\"]"
    rf"|['\"]({QUOTED})['\"]\s*(==|!=)[^#\n]*\b(method|estimator|shaping|reweight|preset)\b"
    r"|\}\s*\[[\w.]*\b(estimator|method)\]"
)

#: path (relative to agentcredit/) -> (number of branching lines, why they stay)
#: (empty since the run report reads a method's report settings and variant label from its Method)
ALLOWED: dict[str, tuple[int, str]] = {}


def branches() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("credit/methods/"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if BRANCH.search(code):
                found.setdefault(rel, []).append(f"{number}: {line.strip()}")
    return found


def test_no_method_name_branch_outside_the_method_files():
    found = branches()
    unexpected = {p: lines for p, lines in found.items() if p not in ALLOWED}
    assert not unexpected, f"branches on a method's name (read its Needs instead): {unexpected}"
    for path, (count, why) in ALLOWED.items():
        assert len(found.get(path, [])) <= count, (path, why, found.get(path))


def test_the_grep_sees_a_branch():
    """The pattern catches the forms it is for (so an empty result means something)."""
    for line in (
        'elif config.algorithm.estimator == "portool":',
        'if a.estimator in ("gae", "segment") and r.strategy != "independent":',
        'if settings.method == "carl-segment":',
        'return {"grpo": {}, "gae": {}}[cfg.estimator]',
        'if preset.shaping == "tips":',
    ):
        assert BRANCH.search(line), line
    for line in (
        'if rollout.strategy == "portool":',
        'if needs.critic == "boundary":',
        'if style == "tips":',
    ):
        assert not BRANCH.search(line), line


def section_reads() -> dict[str, list[str]]:
    """Reads of a method's settings by its section's name (``settings.tips.refresh_every``) outside
    ``credit/methods/``, in code (strings and comments left out; a module such as ``methods.carl_segment`` is not a
    settings read)."""
    import io
    import tokenize

    sections = {m.section for m in METHODS.values()} | {"gae", "critical"}
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("credit/methods/"):
            continue
        tokens = [
            t
            for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
            if t.type in (tokenize.NAME, tokenize.OP)
        ]
        for before, dot, name in zip(tokens, tokens[1:], tokens[2:], strict=False):
            if (
                dot.string == "."
                and name.string in sections
                and before.type == tokenize.NAME
                and before.string
                not in ("methods", "strategies")  # a module, or a rollout strategy's function
                and not before.line.lstrip().startswith(("from ", "import "))
            ):
                found.setdefault(rel, []).append(f"{name.start[0]}: {name.line.strip()}")
    return found


def test_no_settings_section_is_read_by_name_outside_the_method_files():
    """verl's trainer, agent loop and teacher once read ``settings.tips`` / ``gear`` / ``portool`` /
    ``carl_segment`` by name; they ask the method object for the settings of the part that needs something
    (``AgentCreditSettings.settings_for``), as the native trainer does (``Method.settings_from``)."""
    assert section_reads() == {}
