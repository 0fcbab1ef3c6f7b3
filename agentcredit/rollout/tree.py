"""The trajectory data model: segments and rollout trees.

A :class:`RolloutTree` holds everything sampled for one prompt. Node 0 is the root and holds the prompt;
every other node holds one :class:`Segment` (a run of policy tokens, or an observation the environment
appended) and points to its parent. Leaves carry the outcome reward.

* A linear episode is a tree with one path.
* A GRPO group of n episodes is a tree whose root has n children.
* Tree rollouts (carl-critical, portool) share prefixes: a fork is a second child of an existing node.

Contexts are token-id lists built by appending segments; nothing here re-tokenises text. The only
exception to "the context is the concatenation of the path" is a *transient* observation (carl-segment's
replacement mode, spec Eqs. 8-9): it is visible to the policy segment right after it and then removed
from the context. :func:`training_views` turns such a path into the token sequences that the policy
actually conditioned on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["prompt", "policy", "observation"]
ROLES: tuple[str, ...] = ("prompt", "policy", "observation")


@dataclass
class Segment:
    """A contiguous run of tokens produced by one party.

    Attributes:
        token_ids: the tokens, exactly as they entered the context.
        text: their decoded text (for display, parsing and logging; never re-tokenised).
        role: ``"prompt"`` (the root), ``"policy"`` (sampled by the model, trained) or ``"observation"``
            (written by the environment, never trained).
        kind: what the segment is in its protocol: invoke / assimilate / commit (carl-segment), search /
            read / answer (tags), step (portool), observation, prompt, ...
        logprobs: behaviour-policy log-prob of each sampled token (policy segments only).
        entropies: entropy of the sampling distribution at each sampled token (policy segments only).
        transient: for observations only: visible to the next policy segment, then removed from the context
            (carl-segment's replacement of raw tool output by its ``<context>`` extraction).
        info: protocol extras (tool calls, format reward, finish reason, ...). Plain JSON-able values.
    """

    token_ids: list[int]
    text: str = ""
    role: Role = "policy"
    kind: str = ""
    logprobs: list[float] | None = None
    entropies: list[float] | None = None
    transient: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Segment.role must be one of {ROLES}, got {self.role!r}")
        self.token_ids = list(self.token_ids)
        for name in ("logprobs", "entropies"):
            values = getattr(self, name)
            if values is None:
                continue
            if self.role != "policy":
                raise ValueError(f"Segment.{name} is only recorded for policy segments, not {self.role!r}")
            if len(values) != len(self.token_ids):
                raise ValueError(
                    f"Segment.{name} has {len(values)} values for {len(self.token_ids)} tokens; "
                    "record one per sampled token"
                )
            setattr(self, name, [float(v) for v in values])
        if self.transient and self.role != "observation":
            raise ValueError("Segment.transient applies to observations only")

    @property
    def is_policy(self) -> bool:
        return self.role == "policy"

    def __len__(self) -> int:
        return len(self.token_ids)

    def to_dict(self) -> dict[str, Any]:
        return {
            "token_ids": self.token_ids,
            "text": self.text,
            "role": self.role,
            "kind": self.kind,
            "logprobs": self.logprobs,
            "entropies": self.entropies,
            "transient": self.transient,
            "info": self.info,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Segment:
        return cls(**data)


@dataclass
class Node:
    """One node of a rollout tree: a segment, its parent (-1 for the root) and, on leaves, the reward."""

    segment: Segment
    parent: int
    reward: float | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class FlatSequence:
    """A root-to-node path laid out as one token sequence.

    ``policy_mask[t]`` is True on the tokens that are trained (policy tokens; in a training view only those
    generated under exactly this context). ``segment_index[t]`` is the tree node id that token t came from.
    ``logprobs`` / ``entropies`` hold the behaviour values on policy tokens and 0.0 elsewhere.
    """

    token_ids: list[int]
    policy_mask: list[bool]
    segment_index: list[int]
    logprobs: list[float]
    entropies: list[float]

    def __len__(self) -> int:
        return len(self.token_ids)


class RolloutTree:
    """All segments sampled for one prompt, as a tree rooted at the prompt (node 0)."""

    def __init__(self, prompt: Segment, *, prompt_id: str | int | None = None, info: dict | None = None):
        if prompt.role != "prompt":
            prompt = Segment(prompt.token_ids, prompt.text, role="prompt", kind=prompt.kind or "prompt")
        self.nodes: list[Node] = [Node(prompt, parent=-1)]
        self._children: list[list[int]] = [[]]
        self.prompt_id = prompt_id
        self.info: dict[str, Any] = dict(info or {})

    # ------------------------------------------------------------------ building
    def add(self, segment: Segment, parent: int, *, info: dict | None = None) -> int:
        """Append ``segment`` as a child of node ``parent``; return the new node id."""
        if not 0 <= parent < len(self.nodes):
            raise ValueError(f"parent {parent} is not a node of this tree (it has {len(self.nodes)} nodes)")
        if segment.role == "prompt":
            raise ValueError("only the root holds the prompt; add policy or observation segments below it")
        if self.nodes[parent].reward is not None:
            raise ValueError(
                f"node {parent} already carries a reward (it is a finished leaf); cannot extend it"
            )
        node_id = len(self.nodes)
        self.nodes.append(Node(segment, parent=parent, info=dict(info or {})))
        self._children.append([])
        self._children[parent].append(node_id)
        return node_id

    def add_path(self, segments: Iterable[Segment], parent: int = 0) -> int:
        """Append segments as a chain below ``parent``; return the id of the last one."""
        node = parent
        for segment in segments:
            node = self.add(segment, node)
        return node

    def set_reward(self, leaf: int, reward: float) -> None:
        self._check(leaf)
        if self._children[leaf]:
            raise ValueError(f"node {leaf} has children; only leaves carry the outcome reward")
        reward = float(reward)
        if not math.isfinite(reward):
            raise ValueError(f"reward for leaf {leaf} must be finite, got {reward}")
        self.nodes[leaf].reward = reward

    # ------------------------------------------------------------------ structure
    def __len__(self) -> int:
        return len(self.nodes)

    def _check(self, node: int) -> None:
        if not 0 <= node < len(self.nodes):
            raise ValueError(f"node {node} is not in this tree (ids 0..{len(self.nodes) - 1})")

    @property
    def root(self) -> Node:
        return self.nodes[0]

    def segment(self, node: int) -> Segment:
        self._check(node)
        return self.nodes[node].segment

    def parent(self, node: int) -> int:
        self._check(node)
        return self.nodes[node].parent

    @property
    def parents(self) -> list[int]:
        """``parents[i]`` = parent of node i (-1 for the root): the encoding the credit functions take."""
        return [n.parent for n in self.nodes]

    def children(self, node: int) -> list[int]:
        self._check(node)
        return list(self._children[node])

    def is_leaf(self, node: int) -> bool:
        self._check(node)
        return node != 0 and not self._children[node]

    def depth(self, node: int) -> int:
        """Number of edges from the root (root = 0)."""
        self._check(node)
        d = 0
        while node != 0:
            node = self.nodes[node].parent
            d += 1
        return d

    def leaves(self) -> list[int]:
        return [i for i in range(1, len(self.nodes)) if not self._children[i]]

    def leaves_under(self, node: int) -> list[int]:
        """Leaves in the subtree of ``node`` (itself if it is a leaf), in node-id order."""
        self._check(node)
        out: list[int] = []
        stack = [node]
        while stack:
            u = stack.pop()
            kids = self._children[u]
            if not kids and u != 0:
                out.append(u)
            stack.extend(kids)
        return sorted(out)

    def path(self, node: int) -> list[int]:
        """Node ids from the root (0) down to ``node`` inclusive."""
        self._check(node)
        out = [node]
        while node != 0:
            node = self.nodes[node].parent
            out.append(node)
        return out[::-1]

    def paths(self) -> list[list[int]]:
        """Every root-to-leaf path, leaves in node-id order."""
        return [self.path(leaf) for leaf in self.leaves()]

    def rewards(self) -> dict[int, float]:
        """Leaf -> reward. Raises if a leaf has none."""
        out = {}
        for leaf in self.leaves():
            reward = self.nodes[leaf].reward
            if reward is None:
                raise ValueError(f"leaf {leaf} has no reward; call set_reward() when its episode ends")
            out[leaf] = reward
        return out

    def outcomes(self) -> dict[int, float]:
        """Leaf -> outcome reward: the reward without a per-episode environment's step rewards (``info
        ["outcome_reward"]``, set when there are any), what "was the answer right" is judged on."""
        return {leaf: self.nodes[leaf].info.get("outcome_reward", r) for leaf, r in self.rewards().items()}

    # ------------------------------------------------------------------ pruning
    def prune(self, keep_leaves: Iterable[int]) -> tuple[RolloutTree, dict[int, int]]:
        """A new tree without the nodes that have no surviving leaf below them.

        ``keep_leaves`` are the surviving leaves (e.g. PORTool's selected trajectories). Returns the pruned
        tree and the map old id -> new id for the nodes kept. Node order (hence sibling order) is preserved.
        """
        keep = set(keep_leaves)
        for leaf in keep:
            if not self.is_leaf(leaf):
                raise ValueError(f"keep_leaves: node {leaf} is not a leaf")
        alive = set()
        for leaf in keep:
            alive.update(self.path(leaf))
        alive.add(0)
        new = RolloutTree(self.nodes[0].segment, prompt_id=self.prompt_id, info=self.info)
        mapping = {0: 0}
        for old in range(1, len(self.nodes)):  # parents always precede children
            if old not in alive:
                continue
            node = self.nodes[old]
            new_id = new.add(node.segment, mapping[node.parent], info=node.info)
            new.nodes[new_id].reward = node.reward
            mapping[old] = new_id
        return new, mapping

    # ------------------------------------------------------------------ flattening
    def flatten(self, node: int) -> FlatSequence:
        """The root-to-``node`` path as one token sequence.

        Valid when the path has no transient observation (then the sequence is exactly the context every
        policy token was sampled under). For paths with transient observations use :func:`training_views`.
        """
        path = self.path(node)
        if any(self.nodes[i].segment.transient for i in path):
            raise ValueError(
                f"the path to node {node} contains a transient observation, so no single token sequence is "
                "the context of all its policy tokens; use training_views()"
            )
        return _concat(self, path, trained=set(path))

    def training_views(self, node: int) -> list[FlatSequence]:
        """Token sequences that reproduce the exact context of every policy token on the path to ``node``.

        Without transient observations this is ``[flatten(node)]``. With them, each transient observation
        closes a view after the policy segment that read it; the next view drops that observation (it was
        replaced) and trains the policy segments generated after it.
        """
        path = self.path(node)
        views: list[FlatSequence] = []
        visible: list[int] = []  # nodes in the current context
        trained: set[int] = set()
        pending_transient: int | None = None
        for i in path:
            seg = self.nodes[i].segment
            visible.append(i)
            if seg.role == "policy":
                trained.add(i)
                if pending_transient is not None:
                    views.append(_concat(self, visible, trained))
                    visible.remove(pending_transient)
                    trained = set()
                    pending_transient = None
            elif seg.transient:
                pending_transient = i
        if trained or not views:
            views.append(_concat(self, visible, trained))
        return views

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_id": self.prompt_id,
            "info": self.info,
            "nodes": [
                {"parent": n.parent, "reward": n.reward, "info": n.info, "segment": n.segment.to_dict()}
                for n in self.nodes
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutTree:
        nodes = data["nodes"]
        tree = cls(
            Segment.from_dict(nodes[0]["segment"]), prompt_id=data.get("prompt_id"), info=data.get("info")
        )
        for i, n in enumerate(nodes[1:], start=1):
            if n["parent"] >= i:
                raise ValueError(f"node {i}: parent {n['parent']} must come before its child")
            tree.add(Segment.from_dict(n["segment"]), n["parent"], info=n.get("info"))
            tree.nodes[i].reward = n.get("reward")
        return tree


def _concat(tree: RolloutTree, nodes: Sequence[int], trained: set[int]) -> FlatSequence:
    ids: list[int] = []
    mask: list[bool] = []
    index: list[int] = []
    logprobs: list[float] = []
    entropies: list[float] = []
    for i in nodes:
        seg = tree.nodes[i].segment
        n = len(seg.token_ids)
        train = seg.role == "policy" and i in trained
        ids.extend(seg.token_ids)
        mask.extend([train] * n)
        index.extend([i] * n)
        logprobs.extend(seg.logprobs if (train and seg.logprobs is not None) else [0.0] * n)
        entropies.extend(seg.entropies if (train and seg.entropies is not None) else [0.0] * n)
    return FlatSequence(ids, mask, index, logprobs, entropies)


def segment_step_reward(tree: RolloutTree, node: int) -> dict[str, float]:
    """``{"env_reward": r}`` for a policy step that a per-episode environment rewarded (``environment.step()``'s
    reward, recorded on the step whose calls it answered), else nothing: episodes.jsonl and ``agentcredit view``
    show step rewards where they were given."""
    reward = tree.segment(node).info.get("env_reward")
    return {"env_reward": float(reward)} if reward is not None else {}


def step_reward_fields(tree: RolloutTree, leaf: int) -> dict[str, Any]:
    """An episode's reward split, when an environment gave step rewards: ``outcome_reward`` (task.reward or the
    task's scorer) and ``step_rewards`` (one per rewarded step, in order); ``reward`` is their sum."""
    steps = [segment_step_reward(tree, n) for n in tree.path(leaf)]
    rewards = [s["env_reward"] for s in steps if s]
    outcome = tree.nodes[leaf].info.get("outcome_reward")
    if not rewards and outcome is None:
        return {}
    return {"outcome_reward": outcome, "step_rewards": rewards}
