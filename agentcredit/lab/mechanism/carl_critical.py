"""``agentcredit probe`` kind ``carl-critical``: is a state's action entropy higher where its action is critical?

carl-critical's claim (seed lines 99-105 and 120-134, Fig. 2(b), line 110): an action's *criticality* is the SD of
the outcome reward when only that action is resampled, ``C(a_t) = Std_{a' ~ pi(.|s_t)} R(tau_{s_t, a'})`` with
greedy decoding after a' (Eq. 5, lines 101-103); and "states preceding high-criticality actions exhibit clearly
higher action entropy than states preceding low-criticality actions" (line 134), the action entropy being the
mean length-normalised NLL of sampled actions (Eqs. 6-8, lines 124-132). The method forks where that entropy is
high (Algorithm 1), so the claim is what makes its rollout budget land on critical actions. The probe checks the
mechanism, not an outcome: no RL, only rollouts.

Design (pre-registered in ``studies/carl-critical-mechanism.yaml``): per training question, one sampled episode
(the trainer's phase-1 rollout); its first ``states`` states (the prompt and each state an action was taken from).
At each state:

* **criticality** (Eq. 5): ``continuations`` actions a' sampled at the preset's temperature, each followed by greedy
  decoding to the end; the SD (population, as Eq. 5's Std) of their outcome rewards. A state is *high* when the SD
  is > 0 (with binary rewards and 4 continuations that is SD >= 0.433, above the paper's 0.4 line for its minority
  of high-criticality actions, line 105) and *low* when all continuations score alike;
* **action entropy** (Eqs. 7-8, the trainer's ``action_entropy``, rollout/strategies.py): the mean over
  ``entropy_samples`` actions sampled at the state, independent of the continuations' actions (the episode's own
  action and ``entropy_samples - 1`` fresh ones), so that one unlikely draw cannot raise both the entropy and the
  spread of the same state.

The statistic is the AUC of the entropy for high against low states (Mann-Whitney, ties 1/2), minus 0.5; its
one-sided interval is a percentile bootstrap that resamples questions (the unit: a question's states share its
difficulty), read by :func:`~agentcredit.lab.mechanism.core.decide`. The pilot's bootstrap SE, times the
square root of its questions, is the planning SD per question that core's power plan takes.
"""

from __future__ import annotations

import dataclasses
import math
import random
import zlib
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field

from agentcredit.lab.mechanism.core import (
    MechanismSpec,
    Part,
    decide,
    load_model,
    planned_questions,
    training_questions,
)

__all__ = [
    "CarlCriticalProbe",
    "auc",
    "cluster_bootstrap_auc",
    "open_context",
    "population_sd",
    "questions",
    "score_question",
    "summarise",
]

STATISTIC = "auc_entropy"


class CarlCriticalProbe(MechanismSpec):
    statistic_names: ClassVar[tuple[str, ...]] = (STATISTIC,)

    kind: Literal["carl-critical"] = "carl-critical"
    preset: str = "carl-critical-arith-tools"
    states: int = Field(3, ge=1, description="states per question: the first ones of its sampled episode")
    continuations: int = Field(
        4, ge=2, description="K: resampled actions per state, each then greedy (Eq. 5)"
    )
    entropy_samples: int = Field(
        4, ge=1, description="N of Eq. 7: actions whose mean NLL is the state's entropy"
    )
    bootstrap: int = Field(2000, ge=100, description="question-level bootstrap resamples")
    seed: int = Field(0, description="the engine's and the bootstrap's seed")


# --- statistics (pure) -----------------------------------------------------------------------------------------


def population_sd(values: Sequence[float]) -> float:
    """Eq. 5's Std over the continuations' rewards (ddof 0: the SD of the K draws themselves)."""
    n = len(values)
    if n == 0:
        raise ValueError("population_sd: no values")
    mean = math.fsum(values) / n
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / n)


def auc(high: Sequence[float], low: Sequence[float]) -> float:
    """P(a high state's entropy > a low state's) + P(tie) / 2, over all pairs (Mann-Whitney's U / (n1 n0))."""
    if not high or not low:
        raise ValueError(f"auc: needs states in both groups (high {len(high)}, low {len(low)})")
    wins = sum((h > lo) + 0.5 * (h == lo) for h in high for lo in low)
    return wins / (len(high) * len(low))


def _pooled(groups: Sequence[Sequence[tuple[float, bool]]]) -> float | None:
    high = [h for g in groups for h, hi in g if hi]
    low = [h for g in groups for h, hi in g if not hi]
    return auc(high, low) if high and low else None


def cluster_bootstrap_auc(
    by_question: Sequence[Sequence[tuple[float, bool]]], *, resamples: int, alpha: float, seed: int = 0
) -> dict:
    """The pooled AUC and its one-sided percentile interval from resampling whole questions.

    ``by_question``: per question, its states' ``(entropy, high)``. A resample with no high or no low state has no
    AUC and is dropped (counted in ``dropped``). ``low`` is the ``alpha`` quantile of the resampled AUCs, ``high``
    the ``1 - alpha`` one; ``se`` their SD; ``p_one_sided`` the share of them at or below 0.5.
    """
    point = _pooled(by_question)
    if point is None:
        raise ValueError("cluster_bootstrap_auc: no high or no low state among the questions")
    rng = random.Random(seed)
    n = len(by_question)
    values = []
    for _ in range(resamples):
        v = _pooled([by_question[rng.randrange(n)] for _ in range(n)])
        if v is not None:
            values.append(v)
    values.sort()
    if len(values) < 2:
        raise ValueError("cluster_bootstrap_auc: fewer than two resamples have both groups")

    def quantile(q: float) -> float:  # linear interpolation between order statistics
        pos = q * (len(values) - 1)
        i = int(math.floor(pos))
        j = min(i + 1, len(values) - 1)
        return values[i] + (values[j] - values[i]) * (pos - i)

    mean = math.fsum(values) / len(values)
    se = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return {
        "auc": point,
        # the bootstrap's one-sided p of "AUC > 0.5": the share of resamples at or below 0.5
        "p_one_sided": sum(v <= 0.5 for v in values) / len(values),
        "low": quantile(alpha),
        "high": quantile(1 - alpha),
        "se": se,
        "resamples": len(values),
        "dropped": resamples - len(values),
    }


def _by_question(records: Sequence[dict]) -> list[list[tuple[float, bool]]]:
    out: dict[str, list[tuple[float, bool]]] = {}
    for r in records:
        out.setdefault(r["question"], []).append((float(r["entropy"]), bool(r["high"])))
    return [out[q] for q in sorted(out)]


def summarise(spec: CarlCriticalProbe, records: Sequence[dict], part: str) -> dict:
    """Pilot: the bootstrap SE, the planning SD per question (SE x sqrt(questions)) and the questions it plans at
    the effect of interest. Main: the AUC's interval and verdict (one statistic: no Holm step)."""
    stat = spec.statistics[0]
    groups = _by_question(records)
    high = sum(1 for r in records if r["high"])
    out: dict[str, Any] = {
        "part": part,
        "questions": len(groups),
        "records": len(records),
        "states_high": high,
        "states_low": len(records) - high,
        "reward_mean": math.fsum(r["reward_mean"] for r in records) / len(records) if records else None,
    }
    boot = cluster_bootstrap_auc(groups, resamples=spec.bootstrap, alpha=spec.alpha, seed=spec.seed)
    n = len(groups)
    if part == "pilot":
        sd = boot["se"] * math.sqrt(n)
        q, sd_up = planned_questions(stat.effect, sd, n, spec.alpha, spec.power)
        out["planning"] = {
            STATISTIC: {
                "n": n,
                "mean": boot["auc"] - 0.5,
                "sd": sd,
                "sd_upper_80": sd_up,
                "questions": q,
                "bootstrap_se": boot["se"],
            }
        }
        return out
    low, high_b = boot["low"] - 0.5, boot["high"] - 0.5
    result = decide(low, high_b, stat)
    entry = {
        "n": n,
        "mean": boot["auc"] - 0.5,
        "auc": boot["auc"],
        "sd": boot["se"] * math.sqrt(n),
        "bootstrap_se": boot["se"],
        "low": low,
        "high": high_b,
        "p_one_sided": boot["p_one_sided"],
        "alpha": spec.alpha,
        "verdict": result,
        "resamples": boot["resamples"],
        "dropped_resamples": boot["dropped"],
    }
    if result == "underpowered":
        entry["questions_to_decide"] = planned_questions(stat.effect, entry["sd"], n, spec.alpha, spec.power)[
            0
        ]
    out["statistics"] = {STATISTIC: entry}
    return out


# --- the rollouts ----------------------------------------------------------------------------------------------


def questions(spec: MechanismSpec, part: Part) -> list[Any]:
    """The part's training questions (none from the start's SFT set; the main part none from the pilot)."""
    return training_questions(spec, part)


class _Probe:
    """A rollout strategy for one question: the episode, then per state the entropy actions and the Eq. 5
    continuations. Between its two rounds it switches the engine to greedy decoding (the continuations after a'),
    which is safe because the probe runs one prompt per ``engine.run``: no other job is in flight."""

    name = "carl-critical-probe"
    needs_prefix_store = True

    def __init__(self, engine: Any, spec: CarlCriticalProbe):
        self.engine, self.spec = engine, spec
        self.states: list[dict] = []

    def plan(self, ctx: Any) -> Any:
        from agentcredit.rollout.engine import Job
        from agentcredit.rollout.sampling import SamplingParams
        from agentcredit.rollout.strategies import action_entropy

        tree, spec = ctx.tree, self.spec
        sampled = self.engine.config
        (episode,) = yield [Job(0)]
        actions = [n for n in episode.nodes if tree.segment(n).role == "policy"][: spec.states]
        states = [tree.parent(a) for a in actions]
        k, extra = spec.continuations, spec.entropy_samples - 1
        jobs = [Job(s, max_steps=1) for s in states for _ in range(k + extra)]
        first = yield jobs
        per_state = [first[i * (k + extra) : (i + 1) * (k + extra)] for i in range(len(states))]
        todo = [r.end for group in per_state for r in group[:k] if not r.finished]
        greedy: list[Any] = []
        if todo:
            self.engine.config = dataclasses.replace(sampled, sampling=SamplingParams(temperature=0.0))
            try:
                greedy = yield [Job(node) for node in todo]
            finally:
                self.engine.config = sampled
        leaf_of = {r.job.node: r.end for r in greedy}
        for state, action, group in zip(states, actions, per_state, strict=True):
            rewards = []
            for r in group[:k]:
                leaf = r.end if r.finished else leaf_of[r.end]
                rewards.append(float(tree.nodes[leaf].reward))
            first_policy = [next(n for n in r.nodes if tree.segment(n).role == "policy") for r in group]
            h_cont = [action_entropy(tree.segment(n).logprobs) for n in first_policy[:k]]
            h_ent = [action_entropy(tree.segment(action).logprobs)] + [
                action_entropy(tree.segment(n).logprobs) for n in first_policy[k:]
            ]
            self.states.append(
                {
                    "state_node": state,
                    "action_kind": tree.segment(action).kind,
                    "entropy": math.fsum(h_ent) / len(h_ent),
                    "entropy_samples": h_ent,
                    "entropy_continuations": math.fsum(h_cont) / len(h_cont),
                    "rewards": rewards,
                    "episode_reward": float(tree.nodes[episode.end].reward) if episode.finished else None,
                }
            )
        # the entropy-only actions stop after one step: keep the rewarded leaves only (the engine wants rewards)
        keep = [leaf for leaf in tree.leaves() if tree.nodes[leaf].reward is not None]
        return tree.prune(keep)[0]


def score_question(ctx: dict, spec: CarlCriticalProbe, example: Any) -> list[dict]:
    """The question's states: entropy, the continuations' rewards, their SD and whether the state is high."""
    import torch

    engine = ctx["engine"]
    probe = _Probe(engine, spec)
    # the question's own seed: a resumed run samples what an uninterrupted one would
    seed = zlib.crc32(f"{spec.seed}/{example.id}".encode())
    with torch.no_grad():
        engine.run([example], probe, ctx["env"].reward, prompt_ids=[example.id], seed=seed)
    out = []
    for i, s in enumerate(probe.states):
        sd = population_sd(s["rewards"])
        out.append(
            {
                "question": example.id,
                "state": i,
                **s,
                "reward_mean": math.fsum(s["rewards"]) / len(s["rewards"]),
                "reward_sd": sd,
                "high": sd > 0,
            }
        )
    return out


def open_context(spec: CarlCriticalProbe) -> dict:
    from agentcredit.environment import build_environment
    from agentcredit.rollout.engine import EngineConfig, RolloutEngine
    from agentcredit.rollout.sampling import SamplingParams

    config = spec.config()
    model, tokenizer = load_model(spec)
    env = build_environment(config)
    r = config.rollout
    engine = RolloutEngine.for_hf_model(
        model,
        tokenizer,
        env.protocol,
        env.tools,
        EngineConfig(
            sampling=SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k),
            max_segment_tokens=r.max_new_tokens,
            max_episode_tokens=r.max_episode_tokens,
            max_turns=min(r.max_turns, r.t_max) if r.t_max else r.max_turns,
            seed=spec.seed,
            max_batch=r.max_batch,
        ),
    )
    return {"env": env, "model": model, "tokenizer": tokenizer, "engine": engine}
