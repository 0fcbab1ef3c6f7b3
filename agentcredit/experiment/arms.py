"""Where two arms of a study differ: their resolved configs compared field by field, and each difference sorted by
what a claim says of it (the parts it is about, the confounds it tolerates, or neither, which stops the study)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentcredit.config import load_config

# Fields that name or observe a run rather than set what it trains: never a difference between two arms. `method`
# is the run's name; `algorithm.log_kl_ref` only logs policy/kl_ref (carl-critical's presets turn it on; the loss
# is the same with or without it).
_LABELS = ("method", "algorithm.log_kl_ref")


def config_fields(cfg) -> dict[str, Any]:
    """A config as ``{dotted field: value}``, nested sections flattened, the protocol's options with their defaults
    filled in (an arm that spells a default out runs the same protocol as one that leaves it implicit)."""
    data = cfg.model_dump(mode="json")
    data["protocol"] = {"name": cfg.protocol.name, "options": resolved_protocol(cfg)}
    data["protocol"]["options"].pop("name")
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, sub in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), sub)
        else:
            out[prefix] = value

    walk("", data)
    for label in _LABELS:
        out.pop(label, None)
    return out


def config_differences(a, b) -> dict[str, tuple[Any, Any]]:
    """``{field: (a's value, b's value)}`` for every field where two configs differ (None where one lacks it)."""
    fa, fb = config_fields(a), config_fields(b)
    return {k: (fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)}


def _covers(fields: list[str], name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in fields)


@dataclass(frozen=True)
class ClaimDifferences:
    """Where a claim's arm and baseline differ, sorted by what the claim says of each field."""

    about: dict[str, tuple[Any, Any]]  # in the parts the claim is about
    tolerated: dict[str, tuple[Any, Any]]  # outside them, named by the claim's 'tolerate'
    unexplained: dict[str, tuple[Any, Any]]  # anywhere else: the study refuses to run


def claim_differences(spec: Any, claim: Any, configs: dict[str, Any] | None = None) -> ClaimDifferences:
    """Compare the resolved configs of a claim's arm and baseline (each arm's preset with the study's common
    ``set`` and its own). A claim isolates a part of a method only when its two arms differ in that part alone: the
    GEAR study's GRPO arm once trained with token-mean aggregation beside GEAR's seq-mean-token-mean, though the
    paper writes both with 1/|tau| (GEAR Eqs. 1 and 6), so a "GEAR vs GRPO" verdict also measured the
    aggregation. ``configs``: already loaded configs keyed ``arm '<name>'`` (as :func:`load_study` keys them)."""

    def config(name: str):
        if configs is not None and f"arm {name!r}" in configs:
            return configs[f"arm {name!r}"]
        arm = next(a for a in spec.arms if a.name == name)
        return load_config(arm.preset, [*spec.set, *arm.set])

    about, tolerated, unexplained = {}, {}, {}
    for name, pair in config_differences(config(claim.arm), config(claim.baseline)).items():
        if _covers(claim.about, name):
            about[name] = pair
        elif _covers(claim.tolerate, name):
            tolerated[name] = pair
        else:
            unexplained[name] = pair
    return ClaimDifferences(about, tolerated, unexplained)


def resolved_protocol(cfg) -> dict[str, Any]:
    """The protocol a config runs: its name and every option, defaults filled in."""
    from agentcredit.protocols import protocol_options

    return {"name": cfg.protocol.name, **protocol_options(cfg.protocol.name), **cfg.protocol.options}
