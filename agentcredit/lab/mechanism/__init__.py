"""Mechanism probes (issue 48): does each method's signal do, on the model's own rollouts and teacher passes, what
its paper says it does? One kind per method, each a module here with ``Spec`` fields, ``questions``,
``open_context`` and ``score_question`` (and ``summarise`` where its statistics are not means over questions); :mod:`.core` holds what they share (power plan, verdicts, the run).

    agentcredit probe --study studies/gear-mechanism.yaml --part pilot   # planning SDs
    agentcredit probe --study studies/gear-mechanism.yaml --part main    # verdicts
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from agentcredit.lab.mechanism.core import MechanismSpec, Part, format_summary, run_parts, summarise

__all__ = ["KINDS", "format_summary", "load_spec", "run_probe"]

# kind -> (module, its spec class): one line per method's probe
KINDS: dict[str, tuple[str, str]] = {
    "gear": ("agentcredit.lab.mechanism.gear", "GearProbe"),
    "tips": ("agentcredit.lab.mechanism.tips", "TipsProbe"),
    "carl-segment": ("agentcredit.lab.mechanism.carl_segment", "CarlSegmentProbe"),
    "portool": ("agentcredit.lab.mechanism.portool", "PortoolProbe"),
    "carl-critical": ("agentcredit.lab.mechanism.carl_critical", "CarlCriticalProbe"),
}


def _kind(name: str) -> Any:
    if name not in KINDS:
        raise ValueError(f"kind: unknown probe kind {name!r}; known: {', '.join(sorted(KINDS))}")
    return importlib.import_module(KINDS[name][0])


def load_spec(path: Path) -> MechanismSpec:
    """The study file's spec, validated by its kind's fields (a wrong field: one ``ValueError`` naming it)."""
    from pydantic import ValidationError

    path = Path(path)
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or "kind" not in data:
        raise ValueError(f"{path}: a probe's study file needs 'kind' ({', '.join(sorted(KINDS))})")
    module = _kind(data["kind"])
    try:
        return getattr(module, KINDS[data["kind"]][1]).model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top)"
        raise ValueError(f"{path}: {where}: {first['msg']}") from None


def run_probe(spec: MechanismSpec, out: Path, *, part: Part, log: Callable[[str], None] = print) -> dict:
    module = _kind(spec.kind)
    return run_parts(
        spec,
        out,
        part=part,
        questions=module.questions,
        open_context=module.open_context,
        score_question=module.score_question,
        summarise=getattr(module, "summarise", summarise),
        log=log,
    )
