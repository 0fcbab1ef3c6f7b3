"""carl-segment's critic warm-up (spec carl-segment.md §4, App. C), before PPO.

1. Tier labels: 5 no-tool rollouts per question (prompt 1, temperature 1); Tier 2 ("within competence") if any is
   correct, Tier 1 otherwise (§4.1).
2. Controlled rollouts of the base model under forced tool use (prompt 2, or prompt 4 for multi-hop tasks) and
   without tools (prompt 1): with the tier this gives four buckets (§4.2).
3. Pairs (boundary state, R): every boundary b_k of every trajectory, transient ones included, in the prompt of the
   mode that produced it (``WarmupSettings.states="mode"``, spec A14's option "literal contexts"). The spec's
   default, re-rendering every state with the PPO system prompt (A14 "canonicalize", ``states="canonical"``),
   puts a question's forced-tool and no-tool rollouts in one s_0 with different targets: an oracle critic that
   knows every state's true success rate then explains ~0.21 of the return variance, short of the paper's 0.45
   gate, against ~0.55 with an s_0 per mode (:func:`agentcredit.credit.metrics.oracle_explained_variance`,
   tests/train/test_warmup_gate.py). The paper states the gate, not the rendering, so the gate wins.
4. Critic training: MSE to R, batches drawn uniformly across the four buckets, the value head at its learning rate
   and the backbone 10x lower, the LM head (and tied input embeddings) frozen, no policy loss (§4.3, A9).
   On a CPU this runs in two phases. First ``head_epochs`` full-batch epochs of the head alone on boundary
   features computed once (one no-grad forward over the cached rollouts; bucket-balanced MSE): a few seconds
   for hundreds of epochs, where each joint step costs a forward and backward of the backbone (~20 s here).
   Then ``steps`` joint steps as in the paper (0 by default on a CPU). Measured on arith-tools from an SFT
   model: 60 joint steps (19 min) reached explained variance 0.11, short of the 0.45 gate; see the README.
5. The gate on held-out questions (§4.4): AUC of V(s_0) between tiers, sign accuracy of V after a retrieval (A22),
   explained variance, printed against the paper's thresholds. It is computed on the states RL reads: the held-out
   episodes re-rendered with the PPO prompt (:func:`rl_states`), whatever ``states`` the pairs were trained in,
   since that is the critic carl-segment's advantages use; with ``states="mode"`` the same statistics in
   the warm-up's own prompts are kept beside it (``gate_on_warmup_prompts``, not what the gate decides on). Under
   RL's prompt a question's forced-tool and no-tool rollouts share one s_0, so item 3's oracle ceiling holds for
   the gate's s_0 states whatever the training states: that is the critic PPO reads, and the gate says so.

Scale: the paper uses 32K trajectories (Table 4) and 1,800+ steps of 256 pairs; the defaults here (a scale-down) are
sized for the gate instead: 300 questions, 2 rollouts per mode, the gate judged on 20% of them (60 questions), set
in :class:`WarmupSettings`, the ``warmup`` command and a study's ``start.warmup``.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentcredit.config import MICRO_BATCH_TOKENS, Config
from agentcredit.credit.metrics import auc, explained_variance, sign_accuracy
from agentcredit.environment import build_environment
from agentcredit.progress import Progress
from agentcredit.rollout.infra import raise_on_infra_failures
from agentcredit.rollout.run import run_episodes
from agentcredit.rollout.tree import RolloutTree, Segment
from agentcredit.tasks import Example
from agentcredit.tasks.scoring import normalize_answer
from agentcredit.train.batch import build_batch, segment_spans
from agentcredit.train.optim import adamw
from agentcredit.train.signals import values_at

GATE = {
    "auc": (0.70, 0.80),
    "sign_accuracy": (0.60, 0.70),
    "explained_variance": (0.45, 0.55),
}  # (gate, target)
# the gate's held-out questions, at least (300 warm-up questions x 20%); fewer are flagged
MIN_GATE_QUESTIONS = 60
SUMMARY = "warmup_summary.json"  # written beside the warmed-up model by agentcredit.run.run_warmup


class WarmupGateFailed(ValueError):
    """RL was asked to start from a critic whose warm-up gate failed (``train.allow_failed_gate`` is off), or from a
    critic that was never warmed up where the method's critic is (``train.cold_start`` is off)."""


def gate_failures(gate: dict[str, float]) -> list[str]:
    """The gate's failed checks as ``name value < threshold``; a statistic that could not be computed (a missing or
    NaN value) fails with its cause and its fix in words (:func:`undefined_causes`), never as "nan"."""
    causes = undefined_causes(gate)
    out = []
    for name, (threshold, _) in GATE.items():
        value = gate.get(name, math.nan)
        if name in causes:
            out.append(causes[name])
        elif not (value >= threshold):
            out.append(f"{name} {value:.3f} < {threshold:.2f}")
    if gate.get("heldout_value_sd") == 0.0 and gate.get("heldout_boundaries", 0) > 0:
        out.append(
            f"V is {gate.get('heldout_value_mean', math.nan):.3f} at every held-out state: the value head did not "
            "learn (more --head-epochs)"
        )
    return out


def undefined_causes(gate: dict[str, float]) -> dict[str, str]:
    """For each gate statistic that is undefined (NaN or missing), why, from the counts :func:`_gate` records, and
    what to change. AUC needs held-out questions of both tiers; sign accuracy a held-out tool call; explained
    variance held-out returns that differ."""
    undefined = [n for n in GATE if not (gate.get(n, math.nan) >= -math.inf)]  # NaN or missing
    if "heldout_questions" not in gate:  # no held-out question, or a summary written before these counts
        return {
            n: f"{n} undefined: not measured on held-out questions; warm up on more questions"
            for n in undefined
        }
    out: dict[str, str] = {}
    questions = int(gate.get("questions", 0))
    tier2 = int(gate.get("tier2_questions", 0))
    held = int(gate["heldout_questions"])
    held2 = int(gate.get("heldout_tier2_questions", 0))
    if "auc" in undefined:
        if tier2 == 0:
            why = (
                f"all {questions} warm-up questions were Tier 1 (none answered without the tool), so V(s0) has "
                "no Tier 2 question to tell apart"
            )
            fix = (
                "warm up on questions the model also answers alone (an easier tier); a task with none cannot "
                "pass this gate"
            )
        elif tier2 == questions:
            why = (
                f"all {questions} warm-up questions were answered alone (Tier 2), so V(s0) has no Tier 1 "
                "question to tell apart"
            )
            fix = "warm up on questions that need the tool as well (a harder tier)"
        else:
            why = (
                f"its {held} held-out questions are all Tier {2 if held2 else 1} ({tier2} of the {questions} "
                "warm-up questions are Tier 2)"
            )
            fix = f"warm up on more questions (--questions; {warmup_questions_needed()} by default)"
        out["auc"] = f"auc undefined: {why}; {fix}"
    if "sign_accuracy" in undefined:
        out["sign_accuracy"] = (
            f"sign_accuracy undefined: no held-out rollout called a tool ({held} held-out question"
            f"{'' if held == 1 else 's'}), so there is "
            "no V after a tool result to judge; start from a model that calls the tool (SFT on demonstrations)"
        )
    if "explained_variance" in undefined:
        if gate.get("heldout_boundaries", 0) < 2:
            why = "fewer than 2 held-out boundary states"
        else:
            r = gate.get("heldout_return_mean", math.nan)
            why = f"every held-out rollout ended with R = {r:g}, so there is no return variance to explain"
        out["explained_variance"] = (
            f"explained_variance undefined: {why}; warm up on more questions, from a model that solves some of "
            "them and not others"
        )
    return out


def warmup_questions_needed(holdout_fraction: float | None = None) -> int:
    """The warm-up questions whose held-out share is :data:`MIN_GATE_QUESTIONS`, the gate's sample size: 300 at the
    default 20%. The default of ``agentcredit warmup --questions`` and :func:`run_warmup`."""
    fraction = WarmupSettings.holdout_fraction if holdout_fraction is None else holdout_fraction
    return math.ceil(MIN_GATE_QUESTIONS / fraction - 1e-9)


def start_gate(config: Config) -> dict[str, Any] | None:
    """The critic warm-up gate of the model RL starts from (``<model.name>/warmup_summary.json``), or None.

    carl-segment App. C (carl-segment-level-credit.txt l.425): "Warm-up training continues until the verification
    gate passes", so a critic whose gate failed stops here with one line giving the measured values and the
    thresholds, unless ``train.allow_failed_gate`` (``--allow-failed-gate``); then the returned record says
    ``allowed_failed: true`` and the run's summary and reports carry it.
    """
    if config.algorithm.critic == "none":
        return None
    path = Path(config.model.name) / SUMMARY
    if not path.is_file():
        if config.algorithm.critic != WARMED_CRITIC:
            return None
        # carl-segment's critic without its warm-up: the paper's cold-start ablation (l. 94), refused when RL
        # starts (Trainer.train -> require_warmup) unless train.cold_start; recorded so every report can say so
        return {"passed": False, "allowed_failed": False, "missing": True, "gate": {}, "source": str(path)}
    summary = json.loads(path.read_text())
    gate = summary.get("gate", {})
    passed = bool(summary.get("passed")) and not gate_failures(gate)
    if not passed and not config.train.allow_failed_gate:
        raise WarmupGateFailed(
            f"{path}: the critic warm-up gate failed ({', '.join(gate_failures(gate))}); RL does not start on a "
            "failed gate (the paper's App. C: the warm-up continues until the gate passes): warm up further, or pass "
            "--allow-failed-gate (train.allow_failed_gate=true) to train anyway"
        )
    return {"passed": passed, "allowed_failed": not passed, "gate": gate, "source": str(path)}


#: The critic kind whose method warms it up before RL and gates it (carl-segment's boundary critic, §3.3 / App. C).
#: PPO's and TIPS's token critics have no warm-up in their paper (TIPS Table 10: trainer.critic_warmup 0).
WARMED_CRITIC = "boundary"


def require_warmup(record: dict[str, Any] | None, config: Config) -> None:
    """Refuse to start RL on a critic that was never warmed up (``record["missing"]``), unless ``train.cold_start``.

    carl-segment calls the warm-up essential (carl-segment-level-credit.txt l. 94: "without it, early random critic
    gradients corrupt the shared backbone"; the cold-start ablation trails by ~9 EM). Called where RL starts
    (:meth:`agentcredit.train.trainer.Trainer.train`), not where a trainer is built: SFT's rejection sampling, the
    credit probe and the benchmarks build one to roll out, and train no critic."""
    if record is not None and record.get("missing") and not config.train.cold_start:
        raise WarmupGateFailed(
            f"{record['source']}: no critic warm-up: {config.method}'s critic is warmed up and gated before RL "
            "(the paper's App. C; without it its cold-start ablation trails by ~9 EM, l. 94): run "
            "`agentcredit warmup` on this model first, or pass --cold-start (train.cold_start=true) to start cold"
        )


def gate_line(record: dict[str, Any] | None) -> str | None:
    """The line a run prints first (and its reports carry) when RL starts without a passed gate; None otherwise."""
    if record is None or record.get("passed"):
        return None
    if record.get("missing"):
        return (
            f"RL started with a COLD critic: no critic warm-up ({record['source']} is missing), allowed by "
            "train.cold_start; the paper calls the warm-up essential (cold start: ~9 EM lower, l. 94)"
        )
    return (
        f"RL started on a FAILED critic warm-up gate ({', '.join(gate_failures(record.get('gate', {})))}), "
        "allowed by train.allow_failed_gate; the paper's warm-up continues until the gate passes"
    )


def gate_metrics(record: dict[str, Any] | None) -> dict[str, float]:
    """Per-step metrics of the gate the run's critic started on: ``critic/warmup_gate_passed`` (1 or 0) and
    ``critic/cold_start`` (1 when there was no warm-up at all); none for a run without a gated critic."""
    if record is None:
        return {}
    return {
        "critic/warmup_gate_passed": 1.0 if record.get("passed") else 0.0,
        "critic/cold_start": 1.0 if record.get("missing") else 0.0,
    }


@dataclass
class WarmupSettings:
    tier_samples: int = 5  # §4.1: 5 no-tool rollouts per question
    # controlled rollouts per question and prompt mode: >= 2, so a state's target is not a single 0/1 draw (issue
    # 31's sizing; the paper splits its 32K trajectories equally between the modes within each tier, Table 4)
    rollouts_per_mode: int = 2
    # the prompt modes of the controlled rollouts (App. C / Table 4: forced-tool and no-tool); "optional" adds
    # on-policy rollouts with the PPO prompt itself (not the paper's: a variant that trains V on the s_0 PPO sees)
    modes: tuple[str, ...] = ("forced", "no_tool")
    # boundary states in their own mode's prompt ("mode", spec A14's "literal contexts" option) or re-rendered
    # with the PPO prompt ("canonical", the spec's A14 default, which caps the gate's EV: module docstring)
    states: str = "mode"
    # head-only epochs on cached boundary features (CPU phase, module docstring) and their full-batch AdamW LR:
    # chosen on the warm-up's own held-out questions (training split; 3 random 20% splits of 96 questions on
    # arith-tools): 50 epochs at 3e-4 gave AUC 0.69 / 0.63 / 0.80; 300 epochs at 1e-3 over-fitted (0.60 / 0.61 /
    # 0.59, explained variance below 0.10)
    head_epochs: int = 50
    feature_lr: float = 3e-4
    steps: int = 0  # joint head + backbone steps after it (paper: >= 1,800; ~20 s each on 2 CPU cores)
    pairs_per_step: int = 64  # paper: 256 pairs, 64 per bucket (A29)
    head_lr: float = 5e-5  # paper: 5e-6 (CPU-scaled 10x, like the PPO presets)
    backbone_lr: float = 5e-6  # paper: 5e-7 (10x below the head)
    weight_decay: float = 0.01
    # paper: 5% of questions (A30); 20% of the default 300 questions judges the gate on 60 held-out questions
    holdout_fraction: float = 0.2
    seed: int = 0


@dataclass
class Pair:
    row: int
    col: int
    target: float
    bucket: str
    is_s0: bool


@dataclass
class WarmupReport:
    tiers: dict[str, str]
    buckets: dict[str, int]
    losses: list[float]
    gate: dict[str, float]
    seconds: float
    passed: bool
    extra: dict[str, Any] = field(default_factory=dict)

    def table(self) -> str:
        lines = [f"{'check':<22}{'value':>9}{'gate':>8}{'target':>8}  result"]
        causes = undefined_causes(self.gate)
        for name, (gate, target) in GATE.items():
            value = self.gate.get(name, float("nan"))
            ok = "pass" if value >= gate else "FAIL"
            shown = "undefined" if name in causes else f"{value:.3f}"
            lines.append(f"{name:<22}{shown:>9}{gate:>8.2f}{target:>8.2f}  {ok}")
        lines += [causes[name] for name in GATE if name in causes]
        held = self.extra.get("heldout_questions", 0)
        if held < MIN_GATE_QUESTIONS:
            lines.append(
                f"judged on {held} held-out questions only (sized for >= {MIN_GATE_QUESTIONS}): noisy"
            )
        return "\n".join(lines)


def _with_prompt(config: Config, prompt: str) -> Config:
    data = config.model_dump()
    data["protocol"]["options"] = {**data["protocol"]["options"], "prompt": prompt}
    return Config.model_validate(data)


def tier_labels(
    model: Any, tokenizer: Any, config: Config, examples: Sequence[Example], samples: int, seed: int
) -> dict[str, str]:
    """Tier 2 if any of ``samples`` no-tool rollouts (temperature 1) is correct, else Tier 1 (§4.1)."""
    counts = tier_counts(model, tokenizer, config, examples, samples, seed)
    return labels_from_counts(counts)


def labels_from_counts(counts: dict[str, int], *, at_least: int = 1) -> dict[str, str]:
    """ "tier2" where at least ``at_least`` no-tool samples were correct (the paper's rule: 1 of 5, §4.1; a strict
    rule asks for all of them), else "tier1"."""
    return {qid: "tier2" if n >= at_least else "tier1" for qid, n in counts.items()}


def tier_counts(
    model: Any, tokenizer: Any, config: Config, examples: Sequence[Example], samples: int, seed: int
) -> dict[str, int]:
    """Per question: how many of ``samples`` no-tool rollouts (temperature 1) are correct."""
    env = build_environment(_with_prompt(config, "no_tool"))
    try:
        trees = run_episodes(
            model,
            tokenizer,
            env,
            examples,
            samples=samples,
            temperature=1.0,
            max_new_tokens=config.rollout.max_new_tokens,
            max_episode_tokens=config.rollout.max_episode_tokens,
            seed=seed,
            progress="tier labels",
        )
    finally:
        env.close()
    raise_on_infra_failures(trees, "tier labelling")
    return {
        example.id: sum(1 for r in tree.outcomes().values() if r >= 1.0)
        for tree, example in zip(trees, examples, strict=True)
    }


def canonical(tree: RolloutTree, prompt_ids: list[int], prompt_text: str) -> RolloutTree:
    """The same episode with its prompt replaced by ``prompt_ids`` (carl-segment.md A14)."""
    out = RolloutTree(
        Segment(prompt_ids, prompt_text, role="prompt", kind="prompt"),
        prompt_id=tree.prompt_id,
        info=tree.info,
    )
    for i in range(1, len(tree)):
        node = tree.nodes[i]
        new = out.add(node.segment, node.parent, info=node.info)
        out.nodes[new].reward = node.reward
    return out


def controlled_rollouts(
    model: Any,
    tokenizer: Any,
    config: Config,
    examples: Sequence[Example],
    tiers: dict[str, str],
    settings: WarmupSettings,
) -> tuple[list[RolloutTree], list[Example], list[str]]:
    """Rollouts in each of ``settings.modes`` (forced-tool and no-tool by default), their boundary states in their
    own prompt or re-rendered with the PPO prompt (``settings.states``); returns trees, their examples, buckets."""
    if settings.states not in ("mode", "canonical"):
        raise ValueError(f"warm-up states must be 'mode' or 'canonical', got {settings.states!r}")
    unknown = set(settings.modes) - {"forced", "no_tool", "optional"}
    if unknown or not settings.modes:
        raise ValueError(f"warm-up modes must be among forced, no_tool, optional; got {list(settings.modes)}")
    trees, owners, buckets = [], [], []
    for mode in settings.modes:
        prompt = mode
        if mode == "forced" and any(ex.info.get("hops", 1) > 1 for ex in examples):
            prompt = "multihop"  # A32: prompt 4 for multi-hop data
        env = build_environment(config if mode == "optional" else _with_prompt(config, prompt))
        try:
            rolled = run_episodes(
                model,
                tokenizer,
                env,
                examples,
                samples=settings.rollouts_per_mode,
                temperature=1.0,
                max_new_tokens=config.rollout.max_new_tokens,
                max_episode_tokens=config.rollout.max_episode_tokens,
                seed=settings.seed + {"forced": 1, "no_tool": 2, "optional": 3}[mode],
                progress=f"warm-up rollouts ({mode})",
            )
        finally:
            env.close()
        raise_on_infra_failures(rolled, "critic warm-up")
        trees.extend(rolled)
        owners.extend(examples)
        buckets.extend(f"{tiers[example.id]}/{mode}" for example in examples)
    if settings.states == "canonical":
        trees = rl_states(trees, owners, config, tokenizer)
    return trees, owners, buckets


def rl_states(
    trees: Sequence[RolloutTree], owners: Sequence[Example], config: Config, tokenizer: Any
) -> list:
    """Each tree re-rendered with the prompt RL reads (``config``'s protocol prompt, carl-segment.md A14): the
    boundary states PPO's critic will be asked about."""
    env = build_environment(config)
    try:
        out = []
        for tree, example in zip(trees, owners, strict=True):
            state = env.protocol.new_episode(example.question)
            text = env.protocol.prompt(state, tokenizer)
            out.append(canonical(tree, tokenizer(text, add_special_tokens=False)["input_ids"], text))
        return out
    finally:
        env.close()


def _freeze_for_critic(model: Any) -> list[torch.nn.Parameter]:
    """Backbone parameters that train during warm-up: everything but the LM head and the (tied) input embeddings."""
    frozen = {id(p) for p in model.get_output_embeddings().parameters()}
    frozen |= {id(p) for p in model.get_input_embeddings().parameters()}
    return [p for p in model.parameters() if id(p) not in frozen and p.requires_grad]


def warmup(
    model: Any,
    value_head: Any,
    tokenizer: Any,
    config: Config,
    examples: Sequence[Example],
    settings: WarmupSettings,
    *,
    log=print,
) -> WarmupReport:
    """Run the whole warm-up on ``examples``; trains ``model``'s backbone and ``value_head`` in place."""
    start = time.perf_counter()
    rng = random.Random(settings.seed)
    model.eval()
    log(f"tier labels: {settings.tier_samples} no-tool rollouts for each of {len(examples)} questions")
    tiers = tier_labels(model, tokenizer, config, examples, settings.tier_samples, settings.seed)
    tier2 = sum(t == "tier2" for t in tiers.values())
    one_tier = " (one tier only: the gate's AUC will be undefined)" if tier2 in (0, len(tiers)) else ""
    log(f"tiers: {len(tiers) - tier2} Tier 1, {tier2} Tier 2{one_tier}")
    log("controlled rollouts: forced-tool and no-tool")
    trees, owners, buckets = controlled_rollouts(model, tokenizer, config, examples, tiers, settings)

    ids = sorted({ex.id for ex in examples})
    rng.shuffle(ids)
    held = set(ids[: max(1, round(len(ids) * settings.holdout_fraction))])
    batch = build_batch(trees, pad_id=tokenizer.pad_token_id or 0)
    train_pairs: list[Pair] = []
    eval_info = []  # (traj index, spans) for held-out trajectories
    for j, traj in enumerate(batch.trajectories):
        example = owners[traj.tree]
        spans = segment_spans(batch, traj)
        if example.id in held:
            eval_info.append((j, spans))
            continue
        for k, (r, first, _) in enumerate(spans):
            train_pairs.append(Pair(r, first, traj.reward, buckets[traj.tree], k == 0))
    by_bucket: dict[str, list[Pair]] = {}
    for p in train_pairs:
        by_bucket.setdefault(p.bucket, []).append(p)
    log("buckets (training pairs): " + ", ".join(f"{b}={len(v)}" for b, v in sorted(by_bucket.items())))

    head_params = list(value_head.parameters())
    optimizer = adamw(
        [
            {
                "params": _freeze_for_critic(model),
                "lr": settings.backbone_lr,
                "weight_decay": settings.weight_decay,
            },
            {"params": head_params, "lr": settings.head_lr, "weight_decay": 0.0},
        ]
    )
    losses = []
    if settings.head_epochs:
        losses += train_head_on_features(model, value_head, batch, train_pairs, settings, log=log)
    model.train()
    per_bucket = max(1, settings.pairs_per_step // max(1, len(by_bucket)))
    with Progress("warm-up", total=settings.steps, unit="steps") as bar:
        for step in range(settings.steps):
            pairs = [
                rng.choice(pool) for pool in by_bucket.values() for _ in range(per_bucket)
            ]  # uniform over buckets
            positions: dict[int, list[int]] = {}
            for p in pairs:
                positions.setdefault(p.row, []).append(p.col)
            positions = {r: sorted(set(c)) for r, c in positions.items()}
            optimizer.zero_grad(set_to_none=True)
            values = values_at(
                model, value_head, batch, positions, max_tokens=config.train.micro_batch_tokens
            )
            loss = torch.stack([(values[(p.row, p.col)] - p.target) ** 2 for p in pairs]).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_([q for g in optimizer.param_groups for q in g["params"]], 1.0)
            optimizer.step()
            losses.append(float(loss.detach()))
            bar.advance(info=f"critic MSE {losses[-1]:.4f}")
            if (step + 1) % max(1, settings.steps // 5) == 0:
                log(f"warm-up step {step + 1}/{settings.steps}: critic MSE {losses[-1]:.4f}")
    optimizer.zero_grad(set_to_none=True)  # the backbone's gradients: not needed by the gate or the save
    model.eval()
    # The gate judges the critic RL will read: the held-out episodes' boundary states under the prompt PPO rolls
    # out with (carl-segment.md A14), whatever prompts the pairs were trained in. With states="mode" the
    # same episodes in their warm-up prompts are judged too, as a secondary record (gate_on_warmup_prompts).
    gate = _gate_on_rl_states(model, value_head, tokenizer, config, trees, owners, tiers, buckets, held)
    extra: dict[str, Any] = {"heldout_questions": len(held), "gate_states": "rl"}
    if settings.states == "mode":
        extra["gate_on_warmup_prompts"] = _gate(
            model, value_head, batch, trees, owners, tiers, eval_info, buckets
        )
    passed = all(gate.get(name, float("nan")) >= g for name, (g, _) in GATE.items())
    return WarmupReport(
        tiers,
        {b: len(v) for b, v in by_bucket.items()},
        losses,
        gate,
        time.perf_counter() - start,
        passed,
        extra=extra,
    )


def _gate_on_rl_states(model, value_head, tokenizer, config, trees, owners, tiers, buckets, held):
    """:func:`_gate` on the held-out episodes re-rendered with RL's prompt (:func:`rl_states`)."""
    idx = [i for i, ex in enumerate(owners) if ex.id in held]
    held_owners = [owners[i] for i in idx]
    held_trees = rl_states([trees[i] for i in idx], held_owners, config, tokenizer)
    batch = build_batch(held_trees, pad_id=tokenizer.pad_token_id or 0)
    info = [(j, segment_spans(batch, traj)) for j, traj in enumerate(batch.trajectories)]
    return _gate(model, value_head, batch, held_trees, held_owners, tiers, info, [buckets[i] for i in idx])


@torch.no_grad()
def boundary_features(
    model: Any, batch: Any, positions: dict[int, list[int]], *, max_tokens: int = MICRO_BATCH_TOKENS
) -> dict[tuple[int, int], torch.Tensor]:
    """The hidden state the value head reads for V at ``(row, col)``: position col - 1, as in :func:`values_at`."""
    from agentcredit.models.packing import padded_chunks
    from agentcredit.models.scoring import hidden_states

    out: dict[tuple[int, int], torch.Tensor] = {}
    rows = sorted(positions)
    lengths = [int(batch.attention_mask[r].sum()) for r in rows]
    for chunk in padded_chunks(lengths, max_tokens):
        chunk_rows = [rows[i] for i in chunk]
        sub = batch.select(chunk_rows)
        hidden = hidden_states(model, sub.input_ids, sub.attention_mask)
        for k, r in enumerate(chunk_rows):
            for c in positions[r]:
                out[(r, c)] = hidden[k, c - 1].float().clone()
    return out


def train_head_on_features(
    model: Any, value_head: Any, batch: Any, pairs: list[Pair], settings: WarmupSettings, *, log=print
) -> list[float]:
    """Head-only critic epochs on features computed once; bucket-balanced MSE (each bucket weighs the same)."""
    positions: dict[int, list[int]] = {}
    for p in pairs:
        positions.setdefault(p.row, []).append(p.col)
    was_training = model.training
    model.eval()
    features = boundary_features(model, batch, {r: sorted(set(c)) for r, c in positions.items()})
    model.train(was_training)
    x = torch.stack([features[(p.row, p.col)] for p in pairs])
    y = torch.tensor([p.target for p in pairs], dtype=torch.float32, device=x.device)
    counts: dict[str, int] = {}
    for p in pairs:
        counts[p.bucket] = counts.get(p.bucket, 0) + 1
    w = torch.tensor([1.0 / (counts[p.bucket] * len(counts)) for p in pairs], device=x.device)
    optimizer = adamw(
        value_head.parameters(), lr=settings.feature_lr, weight_decay=0.0
    )  # no decay: calibration
    losses = []
    for epoch in range(settings.head_epochs):
        optimizer.zero_grad(set_to_none=True)
        loss = (w * (value_head(x) - y) ** 2).sum()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        if (epoch + 1) % max(1, settings.head_epochs // 5) == 0:
            log(f"critic head epoch {epoch + 1}/{settings.head_epochs}: balanced MSE {losses[-1]:.4f}")
    return losses


@torch.no_grad()
def _gate(model, value_head, batch, trees, owners, tiers, eval_info, buckets) -> dict[str, float]:
    """The gate on held-out questions. AUC of V(s_0) between tiers: the mean V(s_0) of a question's no-tool
    rollouts when there are any (the tiers are defined by no-tool success, §4.1; with states="mode" each mode
    has its own s_0), else of all its rollouts."""
    positions: dict[int, list[int]] = {}
    for _, spans in eval_info:
        for r, first, _ in spans:
            positions.setdefault(r, []).append(first)
    if not positions:
        return {}
    values = values_at(model, value_head, batch, {r: sorted(set(c)) for r, c in positions.items()})
    s0_all: dict[str, list[float]] = {}
    s0_no_tool: dict[str, list[float]] = {}
    s0_labels, all_v, all_r, deltas, expected = {}, [], [], [], []
    for j, spans in eval_info:
        traj = batch.trajectories[j]
        example = owners[traj.tree]
        tree = trees[traj.tree]
        v = [float(values[(r, first)]) for r, first, _ in spans]
        s0_all.setdefault(example.id, []).append(v[0])
        if buckets[traj.tree].endswith("/no_tool"):
            s0_no_tool.setdefault(example.id, []).append(v[0])
        s0_labels[example.id] = 1.0 if tiers[example.id] == "tier2" else 0.0
        all_v.extend(v)
        all_r.extend([traj.reward] * len(v))
        gold = [normalize_answer(a) for a in example.answers]
        for k, node in enumerate(traj.policy_nodes[:-1]):
            if tree.segment(node).kind != "invoke":
                continue
            raw = " ".join(
                tree.segment(c).text for c in tree.children(node) if tree.segment(c).role == "observation"
            )
            deltas.append(v[k + 1] - v[k])  # V(s~_{k+1}) - V(s_k), A22
            expected.append(any(g and g in normalize_answer(raw) for g in gold))
    s0_scores = {i: sum(vs) / len(vs) for i, vs in (s0_no_tool or s0_all).items()}
    ids = sorted(s0_scores)
    return {
        "auc": auc([s0_scores[i] for i in ids], [s0_labels[i] for i in ids]),
        "sign_accuracy": sign_accuracy(deltas, expected),
        "explained_variance": explained_variance(all_v, all_r),
        "heldout_boundaries": float(len(all_v)),
        "heldout_invokes": float(len(deltas)),
        # the counts that say why a statistic above is undefined (undefined_causes)
        "questions": float(len(tiers)),
        "tier2_questions": float(sum(t == "tier2" for t in tiers.values())),
        "heldout_questions": float(len(ids)),
        "heldout_tier2_questions": float(sum(s0_labels[i] for i in ids)),
        "heldout_return_mean": float(torch.tensor(all_r).mean()),
        "heldout_value_mean": float(torch.tensor(all_v).mean()),
        "heldout_value_sd": float(torch.tensor(all_v).std(unbiased=False)),
    }
