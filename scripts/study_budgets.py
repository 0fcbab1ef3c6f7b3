"""Every study file's budget in CPU hours and in GPU hours for one GPU (issue 49), for the comment blocks in studies/.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python scripts/study_budgets.py [--json]

One line per ``studies/*.yaml``: the CPU figure read from the study's published folder (``docs/results/<name>/``)
and where it was read, and the one-GPU range with its inputs. The CPU figure is what the folder holds: the wall
time of the finished runs and the start (a study whose arms ran), the preflight's planned CPU hours (a study whose
arms never ran), or the probe report's CPU seconds or wall time (a mechanism probe). No GPU step of this code has
been timed, so every GPU figure is an *estimate, not measured*:

* a study whose published report prints the preflight's estimate (:mod:`agentcredit.lab.gpu_estimate`): that range,
  read from the report;
* a study whose arms ran: :func:`agentcredit.lab.gpu_estimate.estimate_hours` over the arms that ran, from the
  study file's settings (steps, prompts_per_step x n episodes, seeds, rollout caps, update epochs, critic) and the
  start's published held-out means (policy tokens and tool calls, ``start/summary.json``); the prompt and the
  observation tokens, not published for these starts, are borrowed from a start whose episode records are
  (``BORROWED_FROM``, named in the output);
* a mechanism probe: its sequential forwards (rounds x forwards per round, as carl-critical-mechanism.yaml's
  comment counts them) x gpu_estimate's 10-50 ms per forward; model loading and tool calls left out.

Reads only committed files and the presets; runs in a second.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agentcredit.lab.bench.flops import DecoderShape  # noqa: E402
from agentcredit.lab.gpu_estimate import (  # noqa: E402
    FORWARD_SECONDS,
    ArmPlan,
    arm_plan,
    episode_means,
    estimate_hours,
    forward_flops_per_token,
    gpu_estimate_range,
    rollout_rounds,
)
from agentcredit.tasks.example import iter_jsonl  # noqa: E402

#: SmolLM2-135M-Instruct's shape (every study's start: its config.json, 30 layers, hidden 576, 9 / 3 heads)
SMOLLM2_135M = DecoderShape(
    layers=30, hidden=576, heads=9, kv_heads=3, intermediate=1536, vocab=49152, head_dim=64
)

#: the start whose greedy held-out episode records (``docs/results/<study>/start/eval_*_episodes.jsonl.gz``, 300 an
#: arith start's, codefence; 300 a kb start's, jsoncall) give each family's prompt tokens and observation tokens per
#: tool call, borrowed for the starts that published only policy tokens and tool calls; kb-multihop-credit's tags
#: prompt is assumed as long as jsoncall's (the same world and search_k 3: an approximation, named in the output).
BORROWED_FROM = {"arith": "arith-tool-can-hurt", "kb": "kb-jsoncall-portool-regime"}


def borrowed(family: str, root: Path = ROOT) -> dict:
    """The prompt and per-call observation tokens of ``family``'s published start records, and where from."""
    study = BORROWED_FROM[family]
    paths = sorted((root / "docs" / "results" / study / "start").glob("eval_*_episodes.jsonl.gz"))
    if not paths:
        raise ValueError(f"docs/results/{study}/start/: no eval_*_episodes.jsonl.gz to borrow tokens from")
    records = [row for path in paths for _, row in iter_jsonl(path)]  # gz-aware; a bad line is named
    means = episode_means(records)
    return {
        "prompt": means["prompt"],
        "observation_per_call": means["observation"] / means["tool_calls"] if means["tool_calls"] else 0.0,
        "from": f"{study}'s start, {len(records)} held-out episodes",
    }


# ------------------------------------------------------------------------------------------------ pure parts
def probe_gpu_hours(questions: int, forwards_low: float, forwards_high: float) -> tuple[float, float]:
    """(low, high) one-GPU hours of a mechanism probe: ``questions`` x its sequential forwards per question (the
    measured-length episode at the low end, the rollout caps at the high end) x gpu_estimate's 10 / 50 ms."""
    return (
        questions * forwards_low * FORWARD_SECONDS[0] / 3600,
        questions * forwards_high * FORWARD_SECONDS[1] / 3600,
    )


def start_means(heldout: dict[str, dict], borrowed: dict[str, float]) -> dict[str, float]:
    """The start's mean greedy held-out episode (gpu_estimate's ``means``) from its published per-set policy tokens
    and tool calls (weighted by episodes), with the prompt and the observations per call ``borrowed``; one prefill
    for the prompt and one per tool output."""
    n = sum(float(s["episodes"]) for s in heldout.values())
    policy = sum(float(s["episodes"]) * float(s["policy_tokens"]) for s in heldout.values()) / n
    calls = sum(float(s["episodes"]) * float(s["tool_calls"]) for s in heldout.values()) / n
    return {
        "prompt": borrowed["prompt"],
        "policy": policy,
        "observation": borrowed["observation_per_call"] * calls,
        "prefills": 1.0 + calls,
        "tool_calls": calls,
    }


def report_wall_hours(report: str) -> tuple[float, float]:
    """(runs, start) wall hours from a study report's "Wall time of the finished runs: X h (start: Y h)"; its start
    figure is not used where the start folder records its parts (a report written before
    agentcredit.lab.study_report.start_seconds read only the start's last process)."""
    m = re.search(r"Wall time of the finished runs: ([0-9.]+) h \(start: ([0-9.]+) h\)", report)
    if not m:
        raise ValueError("report.md: no 'Wall time of the finished runs: X h (start: Y h)'")
    return float(m.group(1)), float(m.group(2))


def report_gpu_range(report: str) -> tuple[str, str | None]:
    """The printed one-GPU estimate of a report's Budget section: ("a–b", "c–d" to decide or None)."""
    m = re.search(
        r"GPU hours \(estimate, not measured\): ([0-9.]+–[0-9.]+)\*\*[^(]*(?:\(([0-9.]+–[0-9.]+) to decide)?",
        report,
    )
    if not m:
        raise ValueError("report.md: no 'GPU hours (estimate, not measured): a–b'")
    return m.group(1), m.group(2)


def _h(x: float) -> str:
    return f"{x:.2f}" if x < 1 else f"{x:.1f}"


def _span(low: float, high: float) -> str:
    """A probe's (low, high) GPU hours in the unit that shows them: seconds, minutes or hours (by the high end)."""
    if high * 3600 < 120:
        return f"{low * 3600:.1f}-{high * 3600:.0f} GPU-s"
    if high < 1:
        return f"{low * 60:.1f}-{high * 60:.0f} GPU-min"
    return f"{low * 60:.1f} GPU-min-{_h(high)} GPU h"


# ------------------------------------------------------------------------------------------------ per study
@dataclass(frozen=True)
class Probe:
    """A mechanism probe's GPU model: questions, forwards per question at both ends, and what they count; the CPU
    figure is the report's sentence matched by ``cpu_pattern`` (its first group the number)."""

    questions: int
    forwards: tuple[float, float]
    counted: str
    cpu_file: str
    cpu_pattern: str
    cpu_unit: str


def _caps(preset: str, sets: list[str]) -> tuple[int, int]:
    from agentcredit.lab.arms import study_config

    r = study_config(preset, sets).rollout
    return r.max_episode_tokens, r.max_turns


def probes() -> dict[str, Probe]:
    # the arith starts' mean greedy episode: 48 policy tokens + ~2 prefills (arith-tool-can-hurt's start) ~ 50, the
    # round figure carl-critical-mechanism.yaml's own comment counts with (its published records give 49.2:
    # episode_means, policy + prefills); kept so the script quotes the file's numbers
    arith_low = 50.0
    cs_tokens, cs_turns = _caps("carl-segment-arith-tools", [])
    pt_tokens, pt_turns = _caps("portool-kb-multihop", ["rollout.max_episode_tokens=448"])
    cc_tokens, cc_turns = _caps("carl-critical-arith-tools", [])
    return {
        # its own comment: 3 rounds (episode, one action per resample, greedy continuations), 330 + 97 + 330 at caps
        "carl-critical-mechanism": Probe(
            200,
            (3 * arith_low, (cc_tokens + cc_turns) + (96 + 1) + (cc_tokens + cc_turns)),
            "main: 200 questions x 3 rounds (episode, resampled actions, greedy continuations)",
            "docs/results/carl-critical-mechanism/README.md",
            r"Main: [0-9,]+ s wall and ([0-9,]+) s of CPU",
            "CPU-s (measured, main part, load 7.7 -> 2.3)",
        ),
        # per question: 3 rollout groups one after another (5 no-tool, 2 optional, 2 forced) + 1 value pass; the
        # warm-up's 96 questions the same 3 groups (tier samples, forced, no-tool) + 1 feature pass
        "carl-segment-mechanism": Probe(
            16 + 40 + 96,
            (3 * arith_low + 1, 3 * (cs_tokens + cs_turns) + 1),
            f"pilot 16 + main 40 + warm-up 96 questions x (3 rollout groups + 1 pass), caps {cs_tokens} tokens "
            f"{cs_turns} turns",
            "docs/results/carl-segment-mechanism/README.md",
            r"together took \*\*([0-9,]+) CPU-s",
            "CPU-s (measured: warm-up + pilot + main)",
        ),
        # scripted episodes: no decoding; per question 2 deviations x (student pass + teacher pass)
        "gear-mechanism": Probe(
            14 + 22,
            (4, 4),
            "pilot 14 + main 22 questions x 2 scripted episodes x (student + teacher pass)",
            "docs/results/gear-mechanism/README.md",
            r"the main part took ([0-9,]+) s wall",
            "s wall (measured, main part, load 10.6-14)",
        ),
        # scripted trees need no forward; the pilot's 5 sampled trees decode one episode's depth each (a PORTool
        # tree's rounds run along one episode: rollout_rounds), the kb jsoncall start's 176 + 3.4 at the low end
        "portool-mechanism": Probe(
            5 * rollout_rounds("step_forks", 4),
            (176 + 3.4, pt_tokens + pt_turns),
            f"the pilot's 5 sampled trees x one episode's forwards (caps {pt_tokens} tokens {pt_turns} turns); "
            "scripted trees none",
            "docs/results/portool-mechanism/README.md",
            r"about ([0-9]+) CPU-minutes for this probe in all",
            "CPU-minutes (the report's timed rate x trees)",
        ),
        # scripted episodes: Phi over every segment context, one batched pass (low) to one pass per context:
        # 3 + 4 + 4 contexts for the direct and the two detour episodes (high)
        "tips-mechanism": Probe(
            12 + 17,
            (1, 11),
            "pilot 12 + main 17 questions x 1-11 scoring passes (3 scripted episodes' contexts)",
            "docs/results/tips-mechanism/README.md",
            r"pilot \+ main\s+([0-9.]+) CPU minutes",
            "CPU-minutes (measured, pilot + main)",
        ),
    }


def probe_budget(name: str, probe: Probe, root: Path = ROOT) -> dict:
    text = " ".join((root / probe.cpu_file).read_text().split())
    m = re.search(probe.cpu_pattern, text)
    if not m:
        raise ValueError(f"{probe.cpu_file}: no match for {probe.cpu_pattern!r}")
    low, high = probe_gpu_hours(probe.questions, *probe.forwards)
    return {
        "study": name,
        "cpu": f"{m.group(1)} {probe.cpu_unit}",
        "cpu_source": probe.cpu_file,
        "gpu": _span(low, high),
        "gpu_inputs": f"{probe.counted}: {probe.forwards[0]:g}-{probe.forwards[1]:g} forwards x 10-50 ms",
    }


def preflight_budget(name: str, root: Path = ROOT) -> dict:
    folder = root / "docs" / "results" / name
    budget = json.loads((folder / "preflight.json").read_text())["budget"]
    stored = budget.get("gpu_estimate")
    if stored and "low" in stored:
        gpu, decide = gpu_estimate_range(stored), gpu_estimate_range(stored, "gpu_hours_to_decide")
        source = "preflight.json budget.gpu_estimate"
    else:
        gpu, decide = report_gpu_range((folder / "report.md").read_text())
        source = "report.md Budget (gpu_estimate computed from the preflight record)"
    return {
        "study": name,
        "cpu": f"{budget['planned_cpu_hours']:.1f} CPU h planned ({budget['seeds']} seeds; "
        f"{budget['cpu_hours_to_decide']:.0f} at the {budget['seeds_to_decide']} seeds to decide)",
        "cpu_source": f"docs/results/{name}/preflight.json budget",
        "gpu": f"{gpu} h" + (f" ({decide} to decide)" if decide else ""),
        "gpu_inputs": source,
    }


def arms_estimate(spec: Any, names: set[str], means: dict[str, float]) -> tuple[dict[str, ArmPlan], dict]:
    """gpu_estimate's :func:`estimate_hours` over the study's arms named in ``names``, each priced as the preflight
    prices it (:func:`agentcredit.lab.gpu_estimate.arm_plan`), with the start's ``means``."""
    from agentcredit.lab.arms import study_config

    arms = {
        arm.name: arm_plan(study_config(arm.preset, [*spec.set, *arm.set], arm.name))
        for arm in spec.arms
        if arm.name in names
    }
    return arms, estimate_hours(
        arms,
        flops_per_token=float(forward_flops_per_token(SMOLLM2_135M)),
        means=means,
        questions=sum(h.limit for h in spec.heldout),
        seeds=len(spec.seeds),
        steps=spec.steps,
        eval_every=spec.eval_every,
    )


def ran_budget(name: str, family: str, root: Path = ROOT) -> dict:
    from agentcredit.lab.study_report import start_seconds
    from agentcredit.lab.study_spec import load_study

    folder = root / "docs" / "results" / name
    runs, reported = report_wall_hours((folder / "report.md").read_text())
    # the start: the larger of the report's figure and what its SFT, warm-up and evaluation recorded; each can miss
    # a part (a report written before start_seconds read only the start's last process; a start folder without
    # eval_seconds misses the held-out evaluation)
    recorded = (
        start_seconds(json.loads((folder / "start" / "summary.json").read_text()), folder / "start") / 3600
    )
    start = max(reported, recorded)
    spec = load_study(root / "studies" / f"{name}.yaml")
    ran = {p.name.rsplit("-s", 1)[0] for p in (folder / "runs").iterdir() if p.is_dir()}
    heldout = json.loads((folder / "start" / "summary.json").read_text())["heldout"]
    lent = borrowed(family, root)
    means = start_means(heldout, lent)
    arms, est = arms_estimate(spec, ran, means)
    not_run = [a.name for a in spec.arms if a.name not in ran]
    episodes = sorted({a.episodes for a in arms.values()})
    caps = sorted({(a.max_episode_tokens, a.max_turns) for a in arms.values()})
    return {
        "study": name,
        "cpu": f"{runs + start:.2f} h wall measured (runs {runs:.2f} + start {start:.2f}; the start: report "
        f"{reported:.2f}, its parts' records {recorded:.2f})",
        "cpu_source": f"docs/results/{name}/report.md, start/",
        "gpu": f"{gpu_estimate_range(est)} h",
        "gpu_inputs": f"{len(arms)} arms that ran x {len(spec.seeds)} seeds x {spec.steps} steps, "
        f"{'/'.join(map(str, episodes))} episodes a step, caps "
        + ", ".join(f"{t} tokens {n} turns" for t, n in caps)
        + f"; start mean {means['policy']:.0f} policy tokens, {means['tool_calls']:.2f} calls (published), "
        f"prompt {means['prompt']:.0f} + {lent['observation_per_call']:.0f} per call "
        f"(borrowed: {lent['from']})" + (f"; not run: {', '.join(not_run)}" if not_run else ""),
    }


RAN = {"arith-when-to-call": "arith", "kb-jsoncall-portool": "kb", "kb-multihop-credit": "kb"}


def study_budget(name: str, root: Path = ROOT) -> dict:
    """One study's row: its CPU figure and source, its GPU range and inputs."""
    found = probes()
    if name in found:
        return probe_budget(name, found[name], root)
    if name in RAN:
        return ran_budget(name, RAN[name], root)
    if (root / "docs" / "results" / name / "preflight.json").is_file():
        return preflight_budget(name, root)
    raise ValueError(f"studies/{name}.yaml: no published budget under docs/results/{name}/")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="one JSON object per study instead of the table")
    args = p.parse_args(argv)
    for path in sorted((ROOT / "studies").glob("*.yaml")):
        row = study_budget(path.stem)
        if args.json:
            print(json.dumps(row))
        else:
            print(
                f"{row['study']}\n  CPU: {row['cpu']}  [{row['cpu_source']}]\n  GPU (estimate, not measured): "
                f"{row['gpu']}\n    inputs: {row['gpu_inputs']}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
