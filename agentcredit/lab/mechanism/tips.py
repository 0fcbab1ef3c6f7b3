"""``agentcredit probe`` kind ``tips``: is TIPS's turn reward larger on the turns that bring the evidence?

TIPS's claim (seed ``tips.txt``): the turn reward Delta_k = alpha [Phi(S_k) - Phi(S_{k-1})] (line 67; Eq. 17, line
695), with Phi(S) the teacher's log-likelihood of any gold answer given the state (lines 63-65; Eqs. 15-16, lines
685-689), is "positive when turn k shifts probability mass toward valid answers" (line 69): "a turn that retrieves a
highly relevant passage will make the teacher much more confident in some answer [...], whereas a redundant or
off-topic query leaves its belief nearly unchanged or even shifts probability mass toward incorrect answers" (line
54; "Turns that raise the likelihood receive positive credit; turns that do not help (or mislead) receive small or
negative credit", line 28). The probe checks this mechanism, not an outcome: no RL, only scripted rollouts and the
teacher's potentials.

Design (pre-registered in the study file, ``studies/tips-mechanism.yaml``): kb-multihop two-hop training questions
(none used for the kb-multihop start's SFT, none used by the pilot); for each, scripted students in TIPS's tool-call
format (the ``tips-kb-multihop`` preset's protocol) that search the chain's entities (``direct``: hop 1, hop 2,
answer) or insert an off-topic search (``detour_first`` before hop 1, ``detour_middle`` between the hops): an entity
of the subject's kind whose results hold no gold passage and name neither the bridge entity nor the answer. Phi is computed by :func:`agentcredit.credit.methods.tips.tips_potential_terms`, the function TIPS training calls,
at the preset's settings (answer tokens only, summed, logsumexp over aliases), with the model as its own teacher
(TIPS's teacher is a frozen copy of the policy, line 54). A tool turn is *informative* when its results hold a gold
passage (a chain entity's, ``supporting_titles``) the context did not hold yet; every other tool turn (the
distractor's search, or a search whose gold passage an earlier turn already brought: "redundant", line 54) is not.
Two paired, within-trajectory statistics in nats (alpha = 1: alpha > 0 is one constant per batch, so it scales
both and changes no sign):

* ``delta_gap``: mean Delta on the informative turns minus mean Delta on the other turns of the same episode;
* ``delta_informative``: mean Delta on the informative turns (the claim of line 69: positive).

The unit is the question (its episodes averaged); power, verdicts and Holm's levels are
:mod:`agentcredit.lab.mechanism.core`'s.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, ClassVar, Literal

from pydantic import Field

from agentcredit.lab.mechanism import core
from agentcredit.lab.mechanism.core import MechanismSpec, Part, load_model, training_questions

__all__ = [
    "EPISODES",
    "TipsProbe",
    "episode_statistics",
    "informative_turns",
    "open_context",
    "questions",
    "score_question",
    "summarise",
    "turn_summary",
]

EPISODES = ("direct", "detour_first", "detour_middle")


class TipsProbe(MechanismSpec):
    statistic_names: ClassVar[tuple[str, ...]] = ("delta_gap", "delta_informative")

    kind: Literal["tips"] = "tips"
    preset: str = "tips-kb-multihop"
    episodes: list[Literal["direct", "detour_first", "detour_middle"]] = Field(
        default_factory=lambda: list(EPISODES)
    )


# --- statistics (pure) -----------------------------------------------------------------------------------------


def informative_turns(observations: Sequence[str], gold_titles: Sequence[str]) -> list[bool]:
    """For each tool turn's observation: does it hold a gold passage (``(Title: t)`` for a gold title ``t``) that
    no earlier observation held? A search that brings only passages already in the context is redundant."""
    seen: set[str] = set()
    out = []
    for text in observations:
        new = {t for t in gold_titles if f"(Title: {t})" in text} - seen
        out.append(bool(new))
        seen |= new
    return out


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def episode_statistics(potentials: Sequence[float], informative: Sequence[bool]) -> dict:
    """``delta_gap`` and ``delta_informative`` of one episode from ``[Phi(S_0), ..., Phi(S_M)]`` (M tool turns)
    and each tool turn's class. Delta_k = Phi(S_k) - Phi(S_{k-1}) (alpha = 1); a statistic an episode cannot
    define (no informative turn, or no other turn) is None."""
    if len(potentials) != len(informative) + 1:
        raise ValueError(f"{len(potentials)} potentials for {len(informative)} tool turns (needs M + 1)")
    deltas = [potentials[k] - potentials[k - 1] for k in range(1, len(potentials))]
    on = _mean([d for d, i in zip(deltas, informative, strict=True) if i])
    off = _mean([d for d, i in zip(deltas, informative, strict=True) if not i])
    return {
        "deltas": deltas,
        "delta_informative": on,
        "delta_other": off,
        "delta_gap": on - off if on is not None and off is not None else None,
    }


def turn_summary(records: Sequence[dict]) -> dict:
    """The tool turns' mean |Delta| (the scale the preset's alpha normalises: ``batch_target`` sets alpha so that
    the mean |alpha Delta| over a batch's tool turns is 0.2, paper line 209) and the mean Delta per turn role
    (hop 1, hop 2, distractor), class (informative or not) and whether the turn's results name the answer, with
    counts: descriptive, not tested."""
    deltas = [d for r in records for d in r["deltas"]]
    by: dict[str, list[float]] = {}
    for r in records:
        for role, informative, answer, d in zip(
            r["roles"], r["informative"], r["answer_in_results"], r["deltas"], strict=True
        ):
            key = (
                f"{role} {'informative' if informative else 'other'}{', answer in results' if answer else ''}"
            )
            by.setdefault(key, []).append(d)
    return {
        "tool_turns": len(deltas),
        "mean_abs_delta": _mean([abs(d) for d in deltas]),
        "by_role": {k: {"turns": len(v), "mean_delta": _mean(v)} for k, v in sorted(by.items())},
    }


def summarise(spec: MechanismSpec, records: Sequence[dict], part: str) -> dict:
    """:func:`agentcredit.lab.mechanism.core.summarise`, plus the turns' description (:func:`turn_summary`)."""
    return {**core.summarise(spec, records, part), "turns": turn_summary(records)}


# --- the rollouts and teacher passes ---------------------------------------------------------------------------


def questions(spec: MechanismSpec, part: Part) -> list[Any]:
    """The part's two-hop training questions (none from the start's SFT set; the main part none from the pilot)."""
    return training_questions(spec, part, keep=lambda e: e.info.get("hops") == 2)


def _search(subject: str) -> str:
    # the tips-style turn of the scripted demonstrations (agentcredit.train.demos.tags_policy)
    call = json.dumps({"name": "search", "arguments": {"query_list": [subject]}})
    return f"<think>I need information about {subject}.</think>\n<tool_call>\n{call}\n</tool_call>"


def _student(queries: Sequence[str], answer: str) -> Callable[[int, str | None], str]:
    def next_text(turn: int, observation: str | None) -> str:
        if turn < len(queries):
            return _search(queries[turn])
        return f"<think>I have found the answer.</think>\n<answer>{answer}</answer>"

    return next_text


def _queries(kind: str, chain: Sequence[Sequence[str]], distractor: str) -> list[str]:
    hops = [chain[0][0], chain[1][0]]
    if kind == "direct":
        return hops
    if kind == "detour_first":
        return [distractor, *hops]
    return [hops[0], distractor, hops[1]]


def _off_topic(results: str, example: Any) -> bool:
    """A search result that holds no gold passage, no passage of the answer, and names neither the bridge entity
    nor the answer: it tells the teacher nothing about the chain beyond the question's own subject."""
    chain = example.info["chain"]
    titles = [*example.info["supporting_titles"], *example.answers]
    if any(f"(Title: {t})" in results for t in titles):
        return False
    return not any(name in results for name in (chain[0][2], *example.answers))


def _distractor(tools: Any, search_tool: str, example: Any, world: Any) -> str:
    """An off-topic entity for ``example``: one of the same kind and region as the question's subject (a search a
    policy could plausibly make), none of the chain's, whose own search is off-topic (:func:`_off_topic`). The
    candidates are the world's entities of that kind in creation order, from a place fixed by the question's id
    (a stable hash, so questions get different distractors and a rerun the same); the first that qualifies."""
    from agentcredit.tools.base import ToolCall

    chain = example.info["chain"]
    subject = world.entities[chain[0][0]]
    exclude = {chain[0][0], chain[1][0], chain[1][2], *example.answers}
    pool = [e.name for e in world.of(subject.kind, subject.region) if e.name not in exclude]
    start = zlib.crc32(example.id.encode()) % len(pool) if pool else 0
    for name in pool[start:] + pool[:start]:
        if _off_topic(tools.run([ToolCall(search_tool, {"query": name})])[0].output, example):
            return name
    raise ValueError(f"{example.id}: no off-topic {subject.kind} in the world to search instead")


def _observations(tree: Any) -> list[str]:
    path = tree.path(tree.leaves()[0])
    return [tree.segment(i).text for i in path if tree.segment(i).role == "observation"]


def score_question(ctx: dict, spec: TipsProbe, example: Any) -> list[dict]:
    """The question's scripted episodes and their potentials Phi(S_0..S_M): one record per episode."""
    from agentcredit.credit.methods.tips import tips_potential_terms
    from agentcredit.rollout.replay import replay
    from agentcredit.train import signals
    from agentcredit.train.batch import build_batch

    env, model, tokenizer, settings = ctx["env"], ctx["model"], ctx["tokenizer"], ctx["settings"]
    chain, answer = example.info["chain"], example.answers[0]
    distractor = _distractor(env.tools, env.protocol.search_tool, example, ctx["world"])
    trees = []
    for kind in spec.episodes:
        tree = replay(
            env.protocol,
            tokenizer,
            env.tools,
            example.question,
            _student(_queries(kind, chain, distractor), answer),
        )
        trees.append(tree)
    batch = build_batch(trees, pad_id=tokenizer.pad_token_id)
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    # the call TIPS training makes (agentcredit.credit.methods.tips.TeacherPotentials.fill), at the preset's settings
    terms = tips_potential_terms(
        partial(signals.score_continuations, model),
        signals.segment_contexts(batch),
        [example.answers for _ in batch.trajectories],
        encode,
        env.protocol.render_answer,
        reduce=settings.reduce,
        scope=settings.potential_scope,
    )
    out = []
    for kind, tree, traj, phi in zip(spec.episodes, trees, batch.trajectories, terms.potentials, strict=True):
        observations = _observations(tree)
        queries = _queries(kind, chain, distractor)
        if len(observations) != len(queries) or len(phi) != len(queries) + 1:
            raise ValueError(
                f"{example.id} {kind}: {len(observations)} observations and {len(phi)} potentials for "
                f"{len(queries)} searches"
            )
        informative = informative_turns(observations, example.info["supporting_titles"])
        stats = episode_statistics(phi, informative)
        roles = {chain[0][0]: "hop1", chain[1][0]: "hop2", distractor: "distractor"}
        out.append(
            {
                "question": example.id,
                "kind": kind,
                "distractor": distractor,
                "roles": [roles[q] for q in queries],
                "informative": informative,
                "potentials": list(phi),
                "answer_in_results": [answer in o for o in observations],
                "tokens": int(batch.attention_mask[traj.rows[0]].sum()) if traj.rows else None,
                **stats,
            }
        )
    return out


def open_context(spec: TipsProbe) -> dict:
    from agentcredit.credit.methods.tips import TipsSettings
    from agentcredit.environment import build_environment
    from agentcredit.tasks.kb import build_world

    config = spec.config()
    model, tokenizer = load_model(spec)
    env = build_environment(config)
    # the method object reads its own section (as both trainers do), so no code here names it
    parts = config.algorithm.credit_method.settings_from(config.algorithm)
    settings = next(v for v in parts.values() if isinstance(v, TipsSettings))
    # the world the questions and the search index come from, for the distractors
    world = build_world(config.task.seed)
    return {"env": env, "model": model, "tokenizer": tokenizer, "settings": settings, "world": world}
