#!/usr/bin/env bash
# The whole example on the embedded model (CPU): data -> SFT -> critic warm-up -> evaluate -> GRPO and
# carl-segment from the same start -> evaluate -> a before/after table and `agentcredit compare`'s report.
#
#   ./run.sh                      # writes runs/<time>/ here
#   OUT=runs/a STEPS=8 ./run.sh   # settings below can be overridden like this
#   SET="model.name=tiny task.eval_limit=2" SFT_EXAMPLES=2 STEPS=1 ./run.sh   # what the test runs (tests/)
set -euo pipefail
cd "$(dirname "$0")"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # so that tools.environment can import shop_env

AGENTCREDIT=${AGENTCREDIT:-$(command -v agentcredit || echo ../../.venv/bin/agentcredit)}
PYTHON=${PYTHON:-$(dirname "$AGENTCREDIT")/python}
OUT=${OUT:-runs/$(date +%Y%m%d-%H%M%S)}
SFT_EXAMPLES=${SFT_EXAMPLES:-32}  # training questions demonstrated (of 142)
SFT_EPOCHS=${SFT_EPOCHS:-2}
SFT_LR=${SFT_LR:-1e-4}            # 4 optimiser steps of 16 demonstrations: twice the command's default LR
WARMUP_QUESTIONS=${WARMUP_QUESTIONS:-16}  # a scale-down for time (the gate is sized for 300): see ALLOW_FAILED_GATE
STEPS=${STEPS:-4}                 # RL steps per method (2 questions x 4 episodes each)
SET=${SET:-}                      # extra --set overrides for every stage, e.g. SET="model.name=tiny"
# carl-segment's critic gate (AUC of V(s0) between Tier 1 and Tier 2 questions, carl-segment App. C) cannot pass on
# this task: no shop question can be answered without the tool, so the warm-up finds no Tier 2 question and the AUC
# is undefined at any warm-up size. carl-segment therefore runs on a failed gate by choice (train.allow_failed_gate):
# the run's summary, its report and table.md say so. ALLOW_FAILED_GATE=false stops at the gate instead.
ALLOW_FAILED_GATE=${ALLOW_FAILED_GATE:-true}

mkdir -p "$OUT"
extra=()
for s in $SET; do extra+=(--set "$s"); done
stage() {  # stage NAME DONE_FILE COMMAND...: run it unless DONE_FILE exists (a rerun continues), log its wall time
  local name=$1 done=$2 start=$SECONDS
  shift 2
  if [ -e "$done" ]; then echo "== $name: done before ($done)"; return; fi
  echo "== $name"
  "$@"
  echo "$name $((SECONDS - start))" >>"$OUT/times.txt"
}

stage data "" "$PYTHON" make_data.py  # always: it is deterministic and takes a second
stage sft "$OUT/sft-model/sft_summary.json" \
  "$AGENTCREDIT" sft --config carl-segment.yaml "${extra[@]}" --out "$OUT/sft-model" \
  --examples "$SFT_EXAMPLES" --epochs "$SFT_EPOCHS" --lr "$SFT_LR"
stage warmup "$OUT/start-model/warmup_summary.json" \
  "$AGENTCREDIT" warmup --config carl-segment.yaml "${extra[@]}" --set "model.name=$OUT/sft-model" \
  --out "$OUT/start-model" --questions "$WARMUP_QUESTIONS"
stage eval-start "$OUT/eval-start/summary.json" \
  "$AGENTCREDIT" eval --model "$OUT/start-model" --config carl-segment.yaml "${extra[@]}" --out "$OUT/eval-start"
for method in grpo carl-segment; do  # both from the warmed-up start (GRPO ignores its critic)
  stage "$method" "$OUT/$method/eval_summary.json" \
    "$AGENTCREDIT" train --config "$method.yaml" "${extra[@]}" \
    --set "model.name=$OUT/start-model" --set "train.steps=$STEPS" \
    --set "train.allow_failed_gate=$ALLOW_FAILED_GATE" --run-dir "$OUT/$method"
done
"$AGENTCREDIT" compare "$OUT/grpo" "$OUT/carl-segment" --out "$OUT/report"

"$PYTHON" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

from agentcredit.train.warmup import gate_failures

out = Path(sys.argv[1])
columns = {
    "after SFT + warm-up": out / "eval-start" / "summary.json",
    "after GRPO": out / "grpo" / "eval_summary.json",
    "after carl-segment": out / "carl-segment" / "eval_summary.json",
}
summaries = {}
for name, path in columns.items():
    data = json.loads(path.read_text())
    summaries[name] = data.get("metrics", data)
rows = [("accuracy", "accuracy"), ("accuracy, one-table questions", "one-table/accuracy"),
        ("accuracy, join questions", "join/accuracy"), ("tool-call rate", "tool_call_rate"),
        ("tool calls / episode", "tool_calls"), ("policy tokens / episode", "policy_tokens"),
        ("critic ECE of V(s0)", "critic/ece")]
lines = ["| held-out test (greedy) | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
for label, key in rows:
    cells = [summaries[c].get(key) for c in columns]
    lines.append(f"| {label} | " + " | ".join("-" if v is None else f"{v:.3f}" for v in cells) + " |")
times = dict(line.split() for line in (out / "times.txt").read_text().splitlines())
failures = gate_failures(json.loads((out / "start-model" / "warmup_summary.json").read_text())["gate"])
gate = ("carl-segment started on a FAILED critic warm-up gate, by choice (ALLOW_FAILED_GATE): " + "; ".join(failures)
        if failures else "carl-segment started on a passed critic warm-up gate.")
table = "\n".join(lines) + f"\n\n{gate}\n\nWall time (s): " + ", ".join(f"{k} {v}" for k, v in times.items()) + "\n"
(out / "table.md").write_text(table)
print(table)
EOF
echo "table: $OUT/table.md; report: $OUT/report/report.md"
