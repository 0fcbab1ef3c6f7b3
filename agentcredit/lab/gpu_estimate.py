"""A study's budget in GPU hours for one GPU, **estimated** where no step was timed on a GPU.

The preflight prices the arms from steps it timed (:func:`agentcredit.lab.preflight.budget_hours`): CPU hours on a
machine without a GPU. So that a user with a GPU can see what the study would cost there, this module gives a
labelled *estimate* of the same plan on one GPU, as a range (low, high), from:

* what the preflight measured: the episodes per timed step (prompts x n of its timing record) and, from the
  start's held-out evaluation records, the mean tokens of an episode (prompt, policy, observations) and its
  prefills (the prompt and each tool output fed to the model);
* what the study file fixes: per arm its update epochs, whether its critic is a second model, the rollout caps
  (``rollout.max_episode_tokens``, ``rollout.max_turns``, ``rollout.max_batch``), the seeds, the steps and the
  evaluations; and the start model's shape (its ``config.json``: the FLOPs of one token's forward);
* the assumptions below (ours, not measurements).

A step's GPU seconds = its sequential forwards (the rollout decodes token after token: a small model's decode step
is bound by kernel launches and Python, not by FLOPs) x a per-forward latency + the tool calls on an episode's
path (the tools run on threads while other episodes decode, but an episode waits for its own) + its training
FLOPs / an achieved FLOP rate. The low end takes the measured mean episode, the fast latency and tool call and
the high utilisation (not a floor: a batch decodes until its longest episode ends); the high end the episode at
the rollout caps, the slow latency and tool call and the low utilisation. Model loading and checkpoints are left
out. A preflight whose steps ran on a GPU measures GPU hours instead, and no estimate is shown.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentcredit.lab.bench.flops import DecoderShape, linear_flops_per_token, lm_head_flops_per_row
from agentcredit.lab.power import planned_seconds, runs_evaluations, seconds_to_decide

# ------------------------------------------------------------------------------------------------ assumptions
# ASSUMPTIONS (ours, not measurements: no step of this code has been timed on a GPU). A measured GPU preflight
# (`agentcredit study ... --preflight-only` with model.device: auto on a machine with a GPU) replaces all of them.

#: seconds of one sequential forward (a decode step of every sequence in flight, or a prefill) of a ~100M-parameter
#: decoder under the Hugging Face backend on one GPU: launch-bound (30 layers x ~25 kernels each, plus the engine's
#: sampling and bookkeeping in Python), so nearly independent of the batch (ours: 10 ms to 50 ms)
FORWARD_SECONDS: tuple[float, float] = (0.010, 0.050)
#: dense bf16 peak of the GPU assumed (an H100 SXM's datasheet figure, 989 TFLOP/s); a slower GPU raises the high end
PEAK_FLOPS: float = 989e12
#: fraction of that peak a small model's batched training and scoring passes reach (ours: 1% to 10%; short
#: sequences of a 135M model keep the GPU far from its peak)
UTILISATION: tuple[float, float] = (0.01, 0.10)
#: seconds of one sandboxed tool call, measured on the development CPU (docs/sandbox.md, "Measured": bwrap, median 92
#: ms, p90 up to 149 ms at load ~4); a measurement of this machine, not of a GPU machine's CPU
TOOL_SECONDS: tuple[float, float] = (0.092, 0.149)
#: forward-only scoring passes over a step's tokens before the update (old log-probs, the reference, a critic or a
#: teacher: ours, 1 to 3)
SCORING_PASSES: tuple[int, int] = (1, 3)

ASSUMPTIONS = {
    "forward_seconds": list(FORWARD_SECONDS),
    "peak_flops": PEAK_FLOPS,
    "utilisation": list(UTILISATION),
    "scoring_passes": list(SCORING_PASSES),
    "tool_seconds": list(TOOL_SECONDS),
    "flops_per_token": "2 x (linear + LM head parameters) forward, 6 x for forward + backward; attention left out",
    "decoding": "episodes of a step decode together, ceil(episodes / rollout.max_batch) batches one after another; "
    "entropy-guided forking's rounds one after another, each priced as a whole episode",
    "left_out": "model loading, checkpoints, tool calls",
    "source": "ours, not measured: the same preflight on a GPU measures these hours and replaces the estimate",
}


# ------------------------------------------------------------------------------------------------ pure parts
@dataclass(frozen=True)
class EpisodeShape:
    """One episode's size: tokens fed to the model in a training or scoring pass (prompt + policy + observations)
    and sequential forwards in its rollout (each policy token is one decode step; the prompt and each
    observation one prefill), and the tool calls it waits for."""

    tokens: float
    forwards: float
    tool_calls: float = 0.0


def forward_flops_per_token(shape: DecoderShape) -> int:
    """FLOPs of one token's forward: every layer's projections and the LM head (2 per parameter they hold); the
    input embedding only gathers a row, attention's own FLOPs are left out (short sequences here)."""
    return linear_flops_per_token(shape) + lm_head_flops_per_row(shape)


def shape_from_json(config: dict[str, Any]) -> DecoderShape:
    """A Llama-style decoder's shape from its ``config.json``."""
    return DecoderShape(
        layers=int(config["num_hidden_layers"]),
        hidden=int(config["hidden_size"]),
        heads=int(config["num_attention_heads"]),
        kv_heads=int(config.get("num_key_value_heads") or config["num_attention_heads"]),
        intermediate=int(config["intermediate_size"]),
        vocab=int(config["vocab_size"]),
        head_dim=config.get("head_dim"),
    )


def episode_bounds(
    prompt: float,
    policy: float,
    observation: float,
    prefills: float,
    max_episode_tokens: int,
    max_turns: int,
    tool_calls: float = 0.0,
) -> tuple[EpisodeShape, EpisodeShape]:
    """(low, high) episode from measured means per episode (``prompt``, ``policy`` and ``observation`` tokens,
    ``prefills``: the prompt and each tool output, ``tool_calls``) and the rollout caps. Low: the measured mean
    episode. High: the policy at its cap ``max_episode_tokens``, the observations and tool calls grown in the same
    proportion, and one prefill per turn up to ``max_turns``."""
    low = EpisodeShape(
        tokens=prompt + policy + observation, forwards=policy + prefills, tool_calls=tool_calls
    )
    grow = max_episode_tokens / policy if policy > 0 else 1.0
    high = EpisodeShape(
        tokens=prompt + max_episode_tokens + observation * grow,
        forwards=max_episode_tokens + max(prefills, max_turns),
        tool_calls=tool_calls * grow,
    )
    return low, high


def rollout_rounds(strategy: str, n: int, forks_per_round: int = 1) -> int:
    """Generation rounds of a step's rollout that run one after another, each at most a whole episode: one for
    independent episodes and for PORTool's tree (its rounds are one step each, along one episode's depth), 1 +
    ceil(n / forks_per_round) for carl-critical's entropy-guided forking (its forks wait for the episodes before)."""
    if strategy == "entropy_guided":
        return 1 + math.ceil(n / max(1, forks_per_round))
    return 1


def step_seconds(
    episode: EpisodeShape,
    *,
    episodes: int,
    max_batch: int,
    flops_per_token: float,
    update_passes: float,
    scoring_passes: float,
    forward_seconds: float,
    flops_per_second: float,
    tool_seconds: float = 0.0,
    rounds: int = 1,
) -> float:
    """GPU seconds of one RL step: its rollout's ``ceil(episodes / max_batch)`` batches of ``rounds`` generation
    rounds (:func:`rollout_rounds`) one after another, each ``episode.forwards`` sequential forwards at
    ``forward_seconds`` and ``episode.tool_calls`` tool calls at ``tool_seconds`` (a bound: a fork starts mid-way),
    plus its FLOPs at ``flops_per_second``: ``update_passes`` forward + backward passes (3 x a forward) and
    ``scoring_passes`` forward passes over every episode's tokens."""
    if episodes < 1 or max_batch < 1 or flops_per_second <= 0:
        raise ValueError(
            f"step_seconds: need episodes, max_batch >= 1 and a positive FLOP rate, got {episodes}, {max_batch}, "
            f"{flops_per_second}"
        )
    path = episode.forwards * forward_seconds + episode.tool_calls * tool_seconds
    decode = math.ceil(episodes / max_batch) * rounds * path
    tokens = episodes * episode.tokens
    flops = flops_per_token * tokens * (3 * update_passes + scoring_passes)
    return decode + flops / flops_per_second


def evaluation_seconds(
    episode: EpisodeShape,
    *,
    questions: int,
    max_batch: int,
    flops_per_token: float,
    forward_seconds: float,
    flops_per_second: float,
    tool_seconds: float = 0.0,
) -> float:
    """GPU seconds of one held-out evaluation of ``questions`` questions (one greedy episode each): its
    ``ceil(questions / max_batch)`` batches of sequential forwards and tool calls, and one forward over every
    episode's tokens."""
    if questions < 1:
        return 0.0
    path = episode.forwards * forward_seconds + episode.tool_calls * tool_seconds
    decode = math.ceil(questions / max(1, max_batch)) * path
    return decode + flops_per_token * questions * episode.tokens / flops_per_second


@dataclass(frozen=True)
class ArmPlan:
    """What the estimate needs of one arm: episodes per step, its config's caps and passes, its critic-only steps,
    its rollout's sequential rounds."""

    episodes: int
    max_batch: int
    max_episode_tokens: int
    max_turns: int
    update_passes: float  # optim.epochs x (1 + a separate critic model)
    critic_only: int
    rounds: int = 1


def estimate_hours(
    arms: dict[str, ArmPlan],
    *,
    flops_per_token: float,
    means: dict[str, float],
    questions: int,
    seeds: int,
    steps: int,
    eval_every: int,
    seeds_to_decide: int | None = None,
    arm_seeds: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The one-GPU estimate of a study's arms at both ends: per end, the step seconds per arm, one evaluation's
    seconds, ``planned_seconds`` (:func:`agentcredit.lab.power.planned_seconds`, the CPU plan's formula),
    ``planned_gpu_hours`` and ``gpu_hours_to_decide`` (at ``seeds_to_decide``). ``means`` holds the measured mean
    episode (``prompt``, ``policy``, ``observation``, ``prefills``); ``questions`` the held-out questions of one
    evaluation (every set)."""
    ends: dict[str, Any] = {}
    for i, end in enumerate(("low", "high")):
        fast, slow = (i == 0), (i == 1)
        latency = FORWARD_SECONDS[1] if slow else FORWARD_SECONDS[0]
        rate = PEAK_FLOPS * (UTILISATION[1] if fast else UTILISATION[0])
        scoring = SCORING_PASSES[1] if slow else SCORING_PASSES[0]
        tool = TOOL_SECONDS[1] if slow else TOOL_SECONDS[0]
        per_step, evals = {}, []
        for name, a in arms.items():
            shapes = episode_bounds(
                means["prompt"],
                means["policy"],
                means["observation"],
                means["prefills"],
                a.max_episode_tokens,
                a.max_turns,
                means.get("tool_calls", 0.0),
            )
            ep = shapes[i]
            per_step[name] = step_seconds(
                ep,
                episodes=a.episodes,
                max_batch=a.max_batch,
                flops_per_token=flops_per_token,
                update_passes=a.update_passes,
                scoring_passes=scoring,
                forward_seconds=latency,
                flops_per_second=rate,
                tool_seconds=tool,
                rounds=a.rounds,
            )
            evals.append(
                evaluation_seconds(
                    ep,
                    questions=questions,
                    max_batch=a.max_batch,
                    flops_per_token=flops_per_token,
                    forward_seconds=latency,
                    flops_per_second=rate,
                    tool_seconds=tool,
                )
            )
        # every arm evaluates the same sets; the arms' caps may differ, so the dearest evaluation prices them all
        evaluation = max(evals) if evals else 0.0
        plan = planned_seconds(
            per_step, seeds, steps, evaluation, eval_every, {n: a.critic_only for n, a in arms.items()}
        )
        ends[end] = {
            "step_seconds": per_step,
            "eval_seconds": evaluation,
            "planned_seconds": plan,
            "planned_gpu_hours": plan["total"] / 3600,
            # each arm at the seeds its own claims need (arm_seeds); a record without them: every arm at the most
            "gpu_hours_to_decide": seconds_to_decide(plan, seeds, arm_seeds) / 3600
            if arm_seeds
            else plan["total"] / 3600 * seeds_to_decide / seeds
            if seeds_to_decide
            else None,
        }
    return {
        "kind": "estimate",
        **ends,
        "inputs": {
            "flops_per_token": flops_per_token,
            "episode_means": means,
            "questions_per_evaluation": questions,
            "evaluations_per_run": runs_evaluations(steps, eval_every),
            "arms": {n: vars(a) for n, a in arms.items()},
        },
        "assumptions": ASSUMPTIONS,
    }


def episode_means(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Mean tokens per episode by role (prompt, policy, observation), mean prefills (prompt and observation
    segments) and mean tool calls over ``agentcredit eval`` episode records (their ``segments``, ``tool_calls``)."""
    n = len(records)
    out = {"prompt": 0.0, "policy": 0.0, "observation": 0.0, "prefills": 0.0, "tool_calls": 0.0}
    if n == 0:
        return out
    for r in records:
        out["tool_calls"] += float(r.get("tool_calls", 0))
        for s in r.get("segments", []):
            role = s.get("role")
            if role in ("prompt", "policy", "observation"):
                out[role] += float(s.get("tokens", 0))
            if role in ("prompt", "observation"):
                out["prefills"] += 1.0
    return {k: v / n for k, v in out.items()}


# ------------------------------------------------------------------------------------------------ from a study
def arm_plan(cfg: Any, *, prompts: int | None = None, n: int | None = None) -> ArmPlan:
    """An arm's :class:`ArmPlan` from its run config (``agentcredit.lab.arms.study_config``): prompts_per_step x n
    episodes a step (``prompts`` / ``n``: a timed step's, when the preflight timed one; an entropy-guided tree holds
    n0 + n episodes, ``RolloutConfig.leaves``), the rollout caps, update epochs x (1 + a separate critic), its
    critic-only steps (``train.critic_warmup``) and the strategy's sequential rollout rounds."""
    r = cfg.rollout
    leaves = r.leaves() if r.strategy == "entropy_guided" else int(n if n is not None else r.n)
    return ArmPlan(
        episodes=int(prompts if prompts is not None else r.prompts_per_step) * leaves,
        max_batch=r.max_batch,
        max_episode_tokens=r.max_episode_tokens,
        max_turns=r.max_turns,
        update_passes=cfg.optim.epochs * (2 if cfg.algorithm.critic_model == "separate" else 1),
        critic_only=cfg.train.critic_warmup,
        rounds=rollout_rounds(r.strategy, r.n, r.forks_per_round),
    )


def study_gpu_estimate(layout: Any, record: dict[str, Any]) -> dict[str, Any] | None:
    """The one-GPU estimate of a study whose budget is in CPU hours, from its preflight ``record`` (the timed steps'
    episodes, the seeds to decide), the start's held-out episode records and model config, and the study file
    (``layout``: a :class:`agentcredit.lab.study_spec.StudyLayout`). None when the budget was measured on a GPU;
    ``{"missing": why}`` when something it reads is not there."""
    from agentcredit.lab.arms import study_config

    budget = record.get("budget") or {}
    if not budget or budget.get("unit", "CPU") != "CPU":
        return None
    spec = layout.spec
    timing = record.get("timing", {})
    records: list[dict[str, Any]] = []
    for h in spec.heldout:
        path = Path(layout.start_dir) / f"eval_{h.name}_episodes.jsonl"
        if not path.is_file():
            return {"missing": f"{path} (the start's held-out episodes)"}
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    arms: dict[str, ArmPlan] = {}
    flops_per_token = None
    for arm in spec.arms:
        cfg = study_config(arm.preset, [*spec.set, *arm.set], arm.name)
        model_config = Path(layout.arm_start(arm)) / "config.json"
        if not model_config.is_file():
            return {"missing": f"{model_config} (the start model's shape)"}
        fpt = forward_flops_per_token(shape_from_json(json.loads(model_config.read_text())))
        flops_per_token = fpt if flops_per_token is None else max(flops_per_token, fpt)
        t = timing.get(arm.name, {})
        arms[arm.name] = arm_plan(cfg, prompts=t.get("prompts"), n=t.get("n"))
    return estimate_hours(
        arms,
        flops_per_token=float(flops_per_token or 0.0),
        means=episode_means(records),
        questions=len(records),
        seeds=len(spec.seeds),
        steps=spec.steps,
        eval_every=spec.eval_every,
        seeds_to_decide=budget.get("seeds_to_decide"),
        arm_seeds=budget.get("arm_seeds_to_decide"),
    )


def gpu_estimate_range(estimate: dict[str, Any], key: str = "planned_gpu_hours") -> str:
    """``"a–b"`` GPU hours of an estimate's two ends (``key``: ``planned_gpu_hours`` or ``gpu_hours_to_decide``),
    "–" when it has none."""
    low, high = (estimate.get(end, {}).get(key) for end in ("low", "high"))
    if not isinstance(low, int | float) or not isinstance(high, int | float):
        return "–"
    return f"{_hours(low)}–{_hours(high)}"


def _hours(x: float) -> str:
    return f"{x:.2f}" if x < 1 else f"{x:.1f}"


def gpu_estimate_text(estimate: dict[str, Any], computed_here: bool = False) -> str:
    """The report's sentence for an estimate: both ends, what they rest on, the assumptions, and what replaces it."""
    inp = estimate["inputs"]
    m = inp["episode_means"]
    arms = inp["arms"].values()
    episodes = sorted({a["episodes"] for a in arms})
    caps = sorted({(a["max_episode_tokens"], a["max_turns"]) for a in arms})
    lo_f, hi_f = (f * 1000 for f in FORWARD_SECONDS)
    lo_t, hi_t = (t * 1000 for t in TOOL_SECONDS)
    lo_u, hi_u = (u * 100 for u in UTILISATION)
    decide = gpu_estimate_range(estimate, "gpu_hours_to_decide")
    text = (
        f"**GPU hours (estimate, not measured): {gpu_estimate_range(estimate)}** on one GPU for the same plan"
        + (f" ({decide} to decide)" if decide != "–" else "")
        + f". It rests on {', '.join(map(str, episodes))} episodes per step, the mean episode of the start's "
        f"held-out evaluation ({inp['questions_per_evaluation']} greedy episodes: "
        f"{m['prompt'] + m['policy'] + m['observation']:.0f} tokens, {m['policy']:.0f} of them the policy's, "
        f"{m['tool_calls']:.2f} tool calls) at the low end and the rollout caps ("
        + ", ".join(f"{t} policy tokens, {n} turns" for t, n in caps)
        + f") at the high end, {inp['flops_per_token'] / 1e6:.0f} MFLOPs per token's forward (the start model's "
        "shape; x3 for forward + backward), each arm's update epochs and critic model. Assumptions (ours, not "
        f"measurements): {lo_f:.0f}-{hi_f:.0f} ms per sequential forward (decoding a small model is launch-bound, "
        f"not FLOP-bound), {lo_u:.0f}-{hi_u:.0f}% of a {PEAK_FLOPS / 1e12:.0f} TFLOP/s bf16 peak (an H100's) in the "
        f"training and scoring passes, {SCORING_PASSES[0]}-{SCORING_PASSES[1]} scoring passes per step, "
        f"{lo_t:.0f}-{hi_t:.0f} ms per tool call on an episode's path (the sandbox call as measured on the "
        "development CPU, docs/sandbox.md, assumed for the GPU machine's CPU); model loading and checkpoints left "
        "out. The same `--preflight-only` command on a machine with a GPU (`model.device: "
        "auto`) times the steps there and replaces this estimate with measured GPU hours; `scripts/gpu_check.py` "
        "checks the GPU path first (on a tiny model: it times no step of this study)."
    )
    if computed_here:
        text += (
            " (Estimate computed for this report from the preflight record and the study's files: the record "
            "predates the stored estimate.)"
        )
    return text
