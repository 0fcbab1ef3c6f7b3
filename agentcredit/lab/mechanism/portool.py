"""``agentcredit probe`` kind ``portool``: in a tree that holds a success, does Eq. 2's decayed step reward rank
answering now above one more search, where gamma = 1 does not?

PORTool's claim (portool.txt l. 440-448): the step reward R(s) = G({gamma^(T_k - t) R_out(tau_k) + R_fm(s)}), with
"gamma in [0, 1] ... a decay factor ensuring that steps closer to the final result have greater influence, thereby
favoring trajectories that solve the task with fewer steps" (l. 442-443); and l. 679-681: "gamma = 1 demands more
tool-call steps to reach a correct answer because the step-wise reward fails to discriminate which step efficiently
resolves a query". The first kb-jsoncall-portool round collapsed through the same term read on failing trees
(R_out = -1: the decay credits searching on). The probe checks the mechanism on success-holding trees, no RL.

Design (pre-registered in ``studies/portool-mechanism.yaml``): kb-multihop training questions (none from the
start's SFT set, none of the pilot's in the main part). Per question, trees built with
:func:`agentcredit.rollout.replay.replay` in PORTool's format (the ``jsoncall`` protocol, its formatting rubric) from
the start's SFT demonstrations (:func:`agentcredit.train.demos.jsoncall_policy`: one ``knowledge_search`` per hop,
then ``response_gen``), every tool call run against the world's real ``knowledge_search``, every leaf scored by the
preset's judge. After tau*'s last search the tree forks (f = 2): one branch answers now; the other searches once
more (the first title in the last result that tau* did not search: a distractor, as the study's start searched on;
where the result names no other title, the answer's own passage) and then answers. Shapes (``FORKS``):

* ``clean``: the search branch then answers right (+1): both branches succeed, one step apart;
* ``mixed``: the search branch forks again (f = 2): right (+1) or wrong (-1: the distractor's name, or the
  question's subject where there is no distractor);
* ``failing`` (recorded, in no statistic): both branches answer wrong (-1): the first round's regime.

Each tree goes through the repo's own path: :func:`agentcredit.train.batch.build_batch`, the training layout
(:func:`agentcredit.train.advantages.episode_batch`), and PORTool's estimate (its Eq. 2 step rewards from
:func:`agentcredit.credit.methods.portool.group_terms`, its advantages from the method's estimate) at the preset's
settings, once at the preset's gamma and once at gamma = 1. Two paired statistics per success-holding fork:

* ``rank_gain``: 1[R_gamma(answer) > R_gamma(search)] - 1[R_1(answer) > R_1(search)] (beyond the tie tolerance of
  the G rule, 1e-6): the forks the decay ranks answering first that gamma = 1 does not;
* ``push_gain``: the mean token advantage (Eq. 3, what the loss sees) of the answering step minus that of the
  searching step, at gamma minus at gamma = 1.

The unit is the question (its success-holding forks averaged). The trees are scripted, so the probe checks what the
formula and the repo's pipeline do on realistic trees (real tool results, the protocol's real formatting rewards,
the judge's real outcomes), not what the model samples; the pilot part also samples the preset's trees from the
model (``sampled_questions``) to measure how often a tree holds a success at all.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field

from agentcredit.lab.mechanism.core import (
    MechanismSpec,
    Part,
    load_model,
    planned_questions,
    question_values,
    training_questions,
)
from agentcredit.lab.mechanism.core import summarise as core_summarise

__all__ = [
    "FORKS",
    "PortoolProbe",
    "fork_statistics",
    "open_context",
    "questions",
    "score_question",
    "summarise",
]

FORKS = ("clean", "mixed", "failing")
SUCCESS_FORKS = ("clean", "mixed")
TIE = 1e-6  # the G rule's tie tolerance (agentcredit.credit.portool, tie_atol)


class PortoolProbe(MechanismSpec):
    statistic_names: ClassVar[tuple[str, ...]] = ("rank_gain", "push_gain")

    kind: Literal["portool"] = "portool"
    preset: str = "portool-kb-multihop"
    forks: list[Literal["clean", "mixed", "failing"]] = Field(default_factory=lambda: list(FORKS))
    gamma_control: float = Field(1.0, ge=0.0, le=1.0, description="the paired control's gamma (the claim: 1)")
    sampled_questions: int = Field(
        0, ge=0, description="pilot only: of its questions, how many also get a tree sampled by the model"
    )


# --- statistics (pure) -----------------------------------------------------------------------------------------


def fork_statistics(
    reward: dict[str, tuple[float, float]], advantage: dict[str, tuple[float, float]], tie: float = TIE
) -> dict:
    """``rank_gain`` and ``push_gain`` of one fork from its two steps' step rewards and mean token advantages,
    each keyed ``"gamma"`` (the preset's) and ``"control"`` (gamma = 1) as ``(answer step, search step)``."""

    def first(pair: tuple[float, float]) -> int:  # the answering step ranked strictly first
        return int(pair[0] - pair[1] > tie)

    def gap(pair: tuple[float, float]) -> float:
        return pair[0] - pair[1]

    return {
        "answer_first_gamma": first(reward["gamma"]),
        "answer_first_control": first(reward["control"]),
        "search_first_gamma": int(reward["gamma"][1] - reward["gamma"][0] > tie),
        "search_first_control": int(reward["control"][1] - reward["control"][0] > tie),
        "reward_gap_gamma": gap(reward["gamma"]),
        "reward_gap_control": gap(reward["control"]),
        "rank_gain": first(reward["gamma"]) - first(reward["control"]),
        "push_gamma": gap(advantage["gamma"]),
        "push_control": gap(advantage["control"]),
        "push_gain": gap(advantage["gamma"]) - gap(advantage["control"]),
    }


def summarise(spec: MechanismSpec, records: Sequence[dict], part: str) -> dict:
    """The core's summary; a pilot statistic with no spread over questions (every question gives the same value,
    as a deterministic ranking on scripted trees may) plans no questions of its own (a t plan needs an SD > 0)
    and says so, where the core's planner would divide by zero. The main part's verdicts are the core's (a zero
    SD gives the point interval: reproduced iff the value is > 0)."""
    kept = [r for r in records if "question" in r]
    if part != "pilot":
        return core_summarise(spec, kept, part)
    out: dict[str, Any] = {
        "part": part,
        "questions": len({r["question"] for r in kept}),
        "records": len(kept),
        "planning": {},
    }
    k = len(spec.statistics)
    for s in spec.statistics:
        v = question_values(kept, s.name)
        n = len(v)
        mean = math.fsum(v) / n
        sd = math.sqrt(math.fsum((x - mean) ** 2 for x in v) / (n - 1)) if n > 1 else 0.0
        if sd > 0:
            q, sd_up = planned_questions(s.effect, sd, n, spec.alpha / k, spec.power)
            out["planning"][s.name] = {"n": n, "mean": mean, "sd": sd, "sd_upper_80": sd_up, "questions": q}
        else:
            out["planning"][s.name] = {
                "n": n,
                "mean": mean,
                "sd": 0.0,
                "sd_upper_80": 0.0,
                "questions": 2,
                "note": "no spread over the pilot's questions: a t plan needs an SD > 0; any n >= 2 decides a "
                "value that stays the same, and a main part whose values spread is judged by its own SD",
            }
    return out


# --- the trees -------------------------------------------------------------------------------------------------


def questions(spec: MechanismSpec, part: Part) -> list[Any]:
    """The part's kb-multihop training questions (none from the start's SFT set; the main part none from the
    pilot), every hop count."""
    return training_questions(spec, part)


def _titles(observation: str | None) -> list[str]:
    return re.findall(r"Title: ([^\\\n]+?)\\n", observation or "") or re.findall(
        r"Title: ([^\n]+)", observation or ""
    )


def _policy(example: Any, extra: bool, answer: str | None) -> Any:
    """tau*'s searches (the SFT demonstration), then (``extra``) one more search of the last result's first title
    that tau* did not search, then ``response_gen`` with ``answer`` (None: the gold answer)."""
    from agentcredit.train.demos import jsoncall_policy

    hops = len(example.info["chain"])
    searched = {hop[0] for hop in example.info["chain"]}
    gold = example.answers[0]

    def next_text(turn: int, observation: str | None) -> str:
        if turn < hops:
            return jsoncall_policy(example, turn, observation)
        if extra and turn == hops:
            titles = [t for t in _titles(observation) if t not in searched and t != gold]
            query = titles[0] if titles else gold  # no other title: a search that re-reads the answer
            call = [{"name": "knowledge_search", "arguments": {"query": query}}]
            return (
                f"<think>I need information about {query}.</think>\n<tool_call>{json.dumps(call)}</tool_call>"
            )
        final = jsoncall_policy(example, hops, observation)  # the demonstration's answer step
        return final if answer is None else final.replace(json_str(gold), json_str(answer))

    return next_text


def json_str(text: str) -> str:
    return json.dumps(text)


def distractor(env: Any, tokenizer: Any, example: Any) -> str:
    """The wrong answer of the failing branches: the title the extra search follows (the last tau* result's first
    title tau* did not search); where that result names no other title and the extra search re-reads the answer,
    the question's own subject (never its answer)."""
    from agentcredit.rollout.replay import replay

    tree = replay(env.protocol, tokenizer, env.tools, example.question, _policy(example, True, None))
    step = [n for n in range(len(tree)) if tree.segment(n).role == "policy"][len(example.info["chain"])]
    query = tree.segment(step).info["calls"][0]["arguments"]["query"]
    wrong = query if query != example.answers[0] else example.info["chain"][0][0]
    if env.reward(example, wrong) >= 1.0:
        raise RuntimeError(f"{example.id}: no wrong answer to script ({wrong!r} scores as right)")
    return wrong


def merge_paths(paths: Sequence[Any]) -> tuple[Any, list[int]]:
    """One tree from single-path trees that share a prefix: identical segments (same role and token ids) under
    the same node become one node, as the tree rollout merges identical siblings. Returns the tree and each
    path's leaf in it."""
    tree = paths[0]
    leaves = [tree.leaves()[0]]
    for other in paths[1:]:
        node = 0
        for n in other.path(other.leaves()[0])[1:]:
            seg = other.segment(n)
            same = [
                c
                for c in tree.children(node)
                if tree.segment(c).role == seg.role and tree.segment(c).token_ids == seg.token_ids
            ]
            node = same[0] if same else tree.add(seg, node)
        leaf = other.leaves()[0]
        tree.set_reward(node, other.rewards()[leaf])
        tree.nodes[node].info.update(other.nodes[leaf].info)
        leaves.append(node)
    return tree, leaves


def build_fork(ctx: dict, example: Any, shape: str) -> tuple[Any, int, int]:
    """The question's tree of ``shape`` and its fork's two steps: (tree, answering step, searching step) as
    rollout-tree nodes."""
    from agentcredit.rollout.replay import replay

    env, tokenizer = ctx["env"], ctx["tokenizer"]
    wrong = distractor(env, tokenizer, example)
    plans = {
        "clean": [(False, None), (True, None)],
        "mixed": [(False, None), (True, None), (True, wrong)],
        "failing": [(False, wrong), (True, wrong)],
    }[shape]
    paths = [
        replay(
            env.protocol,
            tokenizer,
            env.tools,
            example.question,
            _policy(example, extra, answer),
            reward_fn=lambda a: env.reward(example, a),
        )
        for extra, answer in plans
    ]
    tree, leaves = merge_paths(paths)
    expected = {"clean": [1.0, 1.0], "mixed": [-1.0, 1.0, 1.0], "failing": [-1.0, -1.0]}[shape]
    if sorted(tree.rewards().values()) != expected:  # a tree of another shape would be read as this one
        raise RuntimeError(f"{example.id}: the {shape} tree's outcomes are {sorted(tree.rewards().values())}")
    policy = lambda leaf: [n for n in tree.path(leaf) if tree.segment(n).role == "policy"]  # noqa: E731
    hops = len(example.info["chain"])
    answer_step, search_step = policy(leaves[0])[hops], policy(leaves[1])[hops]
    if tree.parent(tree.parent(answer_step)) != tree.parent(tree.parent(search_step)):
        raise RuntimeError(f"{example.id}: the two branches do not fork at tau*'s last search")
    return tree, answer_step, search_step


def _credit(ctx: dict, tree: Any, gamma: float, steps: tuple[int, int]) -> dict:
    """PORTool's Eq. 2 step rewards and Eq. 3 advantages of the tree at ``gamma`` (the preset's other settings),
    read for the rollout-tree nodes ``steps``."""
    from agentcredit.credit.estimators import episode_groups
    from agentcredit.credit.methods.portool import estimate, group_terms
    from agentcredit.train.advantages import decision_tree, episode_batch
    from agentcredit.train.batch import build_batch
    from agentcredit.train.signals import Signals

    settings = ctx["settings"].model_copy(update={"gamma": gamma})
    algorithm = ctx["algorithm"]
    batch = build_batch([tree], pad_id=ctx["tokenizer"].pad_token_id)
    layout = episode_batch(algorithm, batch, [tree], Signals())
    (group, members), *_ = episode_groups(layout).items()
    terms, outcomes = group_terms(layout, group, members, settings)
    adv = estimate(layout, settings).advantages
    _, step_of = decision_tree(tree)
    rewards, advantages, fm = {}, {}, {}
    for node in steps:
        d = step_of[node]
        rewards[node] = terms.step_rewards[d]
        fm[node] = float(tree.segment(node).info.get("format_reward", 0.0))
        # the step's tokens in every trajectory through it (one sequence each: seq-mean-token-mean)
        vals = [
            float(adv[s.row, s.start : s.end].mean())
            for j in members
            for s in layout.episodes[j].steps
            if s.node == d
        ]
        advantages[node] = math.fsum(vals) / len(vals)
    return {
        "rewards": rewards,
        "advantages": advantages,
        "format": fm,
        "G": terms.aggregation[step_of[tree.parent(steps[0])]],  # the G rule of the fork's siblings
        "fork_adv": {n: terms.fork_advantages[step_of[n]] for n in steps},
        "outcomes": sorted(outcomes.values()),
    }


def score_question(ctx: dict, spec: PortoolProbe, example: Any) -> list[dict]:
    """The question's scripted fork trees, credited at the preset's gamma and at gamma = 1: one record per tree
    (and, in the pilot, one for its sampled tree)."""
    out = []
    for shape in spec.forks:
        tree, a, s = build_fork(ctx, example, shape)
        at_gamma = _credit(ctx, tree, ctx["settings"].gamma, (a, s))
        at_control = _credit(ctx, tree, spec.gamma_control, (a, s))
        stats = fork_statistics(
            {
                "gamma": (at_gamma["rewards"][a], at_gamma["rewards"][s]),
                "control": (at_control["rewards"][a], at_control["rewards"][s]),
            },
            {
                "gamma": (at_gamma["advantages"][a], at_gamma["advantages"][s]),
                "control": (at_control["advantages"][a], at_control["advantages"][s]),
            },
        )
        if shape not in SUCCESS_FORKS:  # recorded, in no statistic
            stats["rank_gain"] = stats["push_gain"] = None
        out.append(
            {
                "question": example.id,
                "hops": len(example.info["chain"]),
                "fork": shape,
                "outcomes": at_gamma["outcomes"],
                "format_answer": at_gamma["format"][a],
                "format_search": at_gamma["format"][s],
                "G_gamma": at_gamma["G"],
                "G_control": at_control["G"],
                "reward_answer_gamma": at_gamma["rewards"][a],
                "reward_search_gamma": at_gamma["rewards"][s],
                "reward_answer_control": at_control["rewards"][a],
                "reward_search_control": at_control["rewards"][s],
                "fork_adv_answer_gamma": at_gamma["fork_adv"][a],
                "fork_adv_answer_control": at_control["fork_adv"][a],
                "advantage_answer_gamma": at_gamma["advantages"][a],
                "advantage_search_gamma": at_gamma["advantages"][s],
                "advantage_answer_control": at_control["advantages"][a],
                "advantage_search_control": at_control["advantages"][s],
                **stats,
            }
        )
    if example.question in ctx["sample_questions"]:
        out.append(sampled_record(ctx, example))
    return out


# --- the model's own trees (the pilot's feasibility check) -------------------------------------------------------


def _step_kind(text: str) -> str:
    return "answer" if "response_gen" in text else "search" if "knowledge_search" in text else "other"


def sampled_record(ctx: dict, example: Any) -> dict:
    """One tree sampled by the model with the preset's tree rollout on ``example``: does it hold a success, and
    how many of its forks have an answering and a searching child (the forks the statistics read)? A record
    without ``question``: no statistic reads it."""
    if ctx.get("trainer") is None:
        from agentcredit.train.trainer import Trainer

        model, tokenizer = load_model(ctx["spec"])
        ctx["trainer"] = Trainer(
            ctx["config"], model=model, tokenizer=tokenizer, log=False, examples=[example]
        )
    (tree,), _ = ctx["trainer"].rollout([example])
    rewards = tree.rewards()
    policy = [n for n in range(1, len(tree)) if tree.segment(n).role == "policy"]
    kind = {n: _step_kind(tree.segment(n).text) for n in policy}

    def next_steps(n: int) -> list[int]:  # a step's children are steps under its observation
        return [c for o in tree.children(n) for c in ([o] if o in kind else tree.children(o)) if c in kind]

    forks = sum(1 for n in policy if {"answer", "search"} <= {kind[c] for c in next_steps(n)})
    return {
        "sampled": example.id,
        "hops": len(example.info["chain"]),
        "trajectories": len(rewards),
        "correct": sum(1 for r in rewards.values() if r >= 1.0),
        "answered": sum(1 for leaf in rewards if kind.get(leaf) == "answer"),
        "holds_success": any(r >= 1.0 for r in rewards.values()),
        "answer_search_forks": forks,
        "policy_steps": len(policy),
        "step_kinds": {k: sum(1 for v in kind.values() if v == k) for k in ("answer", "search", "other")},
    }


def open_context(spec: PortoolProbe) -> dict:
    from agentcredit.credit.methods.portool import PortoolSettings
    from agentcredit.environment import build_environment
    from agentcredit.models.embedded import load_tokenizer

    config = spec.config()
    env = build_environment(config)
    parts = config.algorithm.credit_method.settings_from(config.algorithm)
    settings = next(v for v in parts.values() if isinstance(v, PortoolSettings))
    # the pilot's first questions are also sampled, known by their text: ids restart with every draw (the main
    # part's first id is the pilot's), while the main part holds none of the pilot's question texts
    sample_questions = (
        {e.question for e in questions(spec, "pilot")[: spec.sampled_questions]}
        if spec.sampled_questions
        else set()
    )
    ctx: dict[str, Any] = {
        "tokenizer": load_tokenizer() if spec.model == "embedded" else load_model(spec)[1],
        "settings": settings,
        "algorithm": config.algorithm,
        "config": config,
        "sample_questions": sample_questions,
        "trainer": None,
        "spec": spec,
    }
    ctx["env"] = _Closing(env, ctx)  # the run closes ctx["env"]: the sampling trainer too
    return ctx


class _Closing:
    """The environment, whose ``close`` also closes the sampling trainer (if one was started)."""

    def __init__(self, env: Any, ctx: dict):
        self._env, self._ctx = env, ctx

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def close(self) -> None:
        self._env.close()
        if self._ctx.get("trainer") is not None:
            self._ctx["trainer"].close()
