"""Fixtures for the evaluation tests: the tiny random Llama (on SmolLM2's tokenizer) and a hand-built tree."""

from __future__ import annotations

import pytest

from agentcredit.rollout.tree import RolloutTree, Segment

# Overrides that keep a tiny-model episode short: a random model never stops by itself.
TINY = [
    "model.name=tiny",
    "rollout.max_new_tokens=8",
    "rollout.max_episode_tokens=16",
    "train.tensorboard=false",
]


@pytest.fixture(scope="session")
def tiny():
    from agentcredit.models.tiny import tiny_llama

    return tiny_llama(seed=0)


def _seg(tokenizer, text: str, role: str, kind: str = "", **kw) -> Segment:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if role == "policy":
        kw.setdefault("logprobs", [-1.0] * len(ids))
        kw.setdefault("entropies", [0.5] * len(ids))
    return Segment(ids, text, role=role, kind=kind, **kw)


def hand_tree(tokenizer) -> RolloutTree:
    """A group of two episodes: one calls the python tool (invoke, observation, commit), one answers directly."""
    tree = RolloutTree(_seg(tokenizer, "Question: what is 12*7?", "prompt", "prompt"))
    invoke = tree.add(
        _seg(
            tokenizer,
            "```python\nprint(12*7)\n```",
            "policy",
            "invoke",
            info={"calls": [{"code": "print(12*7)"}]},
        ),
        0,
    )
    obs = tree.add(_seg(tokenizer, "84\n", "observation", "observation"), invoke)
    commit = tree.add(_seg(tokenizer, "The answer is \\boxed{84}.", "policy", "commit"), obs)
    tree.nodes[commit].info["answer"] = "84"
    tree.set_reward(commit, 1.0)
    direct = tree.add(_seg(tokenizer, "It is \\boxed{86} <script>alert(1)</script>", "policy", "commit"), 0)
    tree.nodes[direct].info["answer"] = "86"
    tree.set_reward(direct, 0.0)
    return tree


@pytest.fixture()
def tree(tiny) -> RolloutTree:
    return hand_tree(tiny[1])


@pytest.fixture()
def tiny_overrides() -> list[str]:
    return list(TINY)
