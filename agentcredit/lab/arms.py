"""Where two arms of a study differ: their resolved configs compared field by field, and each difference sorted by
what a claim says of it (the parts it is about, the confounds it tolerates, or neither, which stops the study)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import yaml

from agentcredit.config import (
    OLD_ESTIMATORS,
    RENAMED_KEYS,
    Config,
    ConfigError,
    apply_overrides,
    load_config,
    read_preset,
)
from agentcredit.credit.methods import compose, get_method, resolve_method

# Fields that observe a run rather than set what it trains: never a difference between two arms.
# `algorithm.log_kl_ref` only logs policy/kl_ref (carl-critical's presets turn it on; the loss is the same with or
# without it). An arm's label (algorithm.method's -<label>) is dropped by config_fields.
_LABELS = ("algorithm.log_kl_ref",)
#: The method's parts as a config written before issue 37 named them (a first-round study file's arm sets
#: algorithm.reweight=none); translated to algorithm.method by :func:`translate_old_overrides`.
_PART_KEYS = ("algorithm.estimator", "algorithm.shaping", "algorithm.reweight", "algorithm.critic")


def translate_old_overrides(preset: str, overrides: list[str]) -> list[str]:
    """A study's overrides with the method's old parts (``algorithm.estimator / shaping / reweight / critic``)
    written as the ``algorithm.method`` they name, so study files from before issue 37 keep loading unchanged. The
    loss aggregation the old preset stated is kept (changing a part never changed it): ``algorithm.reweight=none``
    on gear's preset is GRPO in GEAR's recipe, seq-mean-token-mean included."""
    out: list[str] = []
    for assignment in overrides:
        key, _, raw = assignment.partition("=")
        key = key.strip()
        if key not in _PART_KEYS:
            out.append(assignment)
            continue
        if key == "algorithm.critic":  # follows from the method now; the resolved config checks it
            continue
        data = read_preset(preset)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            apply_overrides(data, out)
        algorithm = data.get("algorithm") or {}
        try:
            method = resolve_method(str(algorithm.get("method", "grpo")))[0]
            value = str(yaml.safe_load(raw))
            base, mods = method.estimating, list(method.parts[1:])
            if key == "algorithm.estimator":
                base = get_method(OLD_ESTIMATORS.get(value, value))
            else:
                kind = key.rsplit(".", 1)[1]
                mods = [m for m in mods if m.modifier != kind] + (
                    [] if value == "none" else [get_method(value)]
                )
            new = compose(base, *mods).name
        except ValueError as exc:
            raise ConfigError(
                f"{assignment} (written before issue 37; now algorithm.method): {exc}"
            ) from None
        if algorithm.get("loss_agg") is None:
            out.append(f"algorithm.loss_agg={method.all_needs.loss_agg}")
        out.append(f"algorithm.method={new}")
    return out


def study_config(preset: str, overrides: list[str], name: str | None = None) -> Config:
    """The config of a study's start or arm: ``preset`` with ``overrides`` (old part keys translated,
    :func:`translate_old_overrides`). ``name``: the arm's name, which must name the method the arm trains
    (``<method>[+<modifier>...][-<label>]``) and becomes its ``algorithm.method`` (label included)."""
    overrides = translate_old_overrides(preset, overrides)
    config = load_config(preset, overrides)
    if name is None:
        return config
    trains = config.algorithm.credit_method.name
    try:
        named = resolve_method(name)[0].name
    except ValueError as exc:
        raise ConfigError(f"arm name {name!r}: {exc}") from None
    if named != trains:
        raise ConfigError(
            f"arm {name!r} trains algorithm.method={trains!r}: name the arm {trains!r} or {trains}-<label>, or set "
            f"algorithm.method={named!r}"
        )
    return load_config(preset, [*overrides, f"algorithm.method={name}"])


def config_fields(cfg) -> dict[str, Any]:
    """A config as ``{dotted field: value}``, nested sections flattened, the protocol's options with their defaults
    filled in (an arm that spells a default out runs the same protocol as one that leaves it implicit)."""
    data = cfg.model_dump(mode="json")
    data["algorithm"]["method"] = cfg.algorithm.credit_method.name  # what trains; an arm's label is its name
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
    # a study written before issue 37 names the method's old parts (algorithm.estimator, algorithm.critic, ...):
    # each covers the key it became (algorithm.method)
    fields = [_renamed(f) for f in fields]
    return any(name == f or name.startswith(f + ".") for f in fields)


def _renamed(field: str) -> str:
    for old, new in RENAMED_KEYS.items():
        if field == old or field.startswith(old + "."):
            return new + field[len(old) :]
    return field


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
        return study_config(arm.preset, [*spec.set, *arm.set])

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
