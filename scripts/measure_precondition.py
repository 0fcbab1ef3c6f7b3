"""Measure one of a study's policy preconditions on a given model with extra common settings: a candidate regime
for a study's next round, measured on training questions with the preflight's own code and seeds, without
touching the study or its output.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python scripts/measure_precondition.py \\
        --study studies/kb-jsoncall-portool-regime.yaml --model STUDY_OUT/start/sft-model \\
        --set "task.options={train_hop_fractions: {1: 0.5, 2: 0.3, 3: 0.2}}" --out candidate.json

``--set`` is appended to the study's common settings (``set:``), so it reaches the measured arm as it would in a
study that adopted it; the start's SFT is not redone (``--model`` is measured as it is). The result, the
settings, the model's weight digest, the wall time and the load average before and after go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

from agentcredit.lab.common import _weights_digest
from agentcredit.lab.preflight import holds, measure_policy
from agentcredit.lab.study_spec import load_study


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", required=True, type=Path)
    parser.add_argument("--model", required=True, type=Path, help="the model directory to measure")
    parser.add_argument("--set", action="append", default=[], help="a common setting to add (repeatable)")
    parser.add_argument("--precondition", help="its name (default: the study's first policy precondition)")
    parser.add_argument("--questions", type=int, help="training questions (default: the precondition's)")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    # a user's mistake (no such study or model, a study file that does not load) is one line and exit 2
    if not args.model.is_dir():
        print(f"error: --model {args.model}: not a model directory", file=sys.stderr)
        return 2
    try:
        data = yaml.safe_load(args.study.read_text())
    except (OSError, yaml.YAMLError) as exc:
        print(f"error: --study {args.study}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    try:  # the user's own file first, so a mistake names it (not the temporary copy below)
        load_study(args.study)
    except ValueError as exc:  # StudyError, ConfigError: the message names the file and the field
        print(f"error: {exc}", file=sys.stderr)
        return 2
    data["set"] = [*data.get("set", []), *args.set]
    for pre in data.get("preconditions", []):
        if args.questions:
            pre["questions"] = args.questions
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "study.yaml"
        config.write_text(yaml.safe_dump(data))
        try:
            spec = load_study(config)
        except ValueError as exc:  # an added --set the study refuses
            print(f"error: --set {args.set}: {exc}", file=sys.stderr)
            return 2
        policy = [p for p in spec.preconditions if p.measure != "warmup_gate"]
        chosen = [p for p in policy if args.precondition in (None, p.name)]
        if not chosen:
            print(f"error: {args.study}: no policy precondition named {args.precondition!r}", file=sys.stderr)
            return 2
        pre = chosen[0]
        load_before, began = os.getloadavg(), time.perf_counter()
        measured = measure_policy(spec, pre, args.model)
        record = {
            "study": str(args.study),
            "model": str(args.model.resolve()) if args.model.is_dir() else str(args.model),
            "weights": _weights_digest(args.model) if args.model.is_dir() else None,
            "added_settings": args.set,
            "precondition": pre.model_dump(mode="json"),
            "met": holds(measured["value"], pre.op, pre.threshold),
            **measured,
            "wall_seconds": time.perf_counter() - began,
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    print(
        f"{pre.name}: {measured['value']:.3f} (se {measured['se']:.3f}, n={measured['n']}) {pre.op} {pre.threshold}:"
        f" {'met' if record['met'] else 'NOT MET'}; {record['wall_seconds']:.0f} s -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
