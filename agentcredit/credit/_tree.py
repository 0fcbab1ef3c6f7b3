"""The decision tree of a group of episodes: the one tree type of the credit layer (private module; the type is
public as :class:`agentcredit.credit.DecisionTree`).

The encoding is the one :attr:`agentcredit.rollout.tree.RolloutTree.parents` produces: ``parents[i]`` is the
parent of node ``i`` and ``-1`` marks the root, which must be node 0 (the prompt / question state). Every other
node is the state reached by one action (one step). Leaves are the non-root nodes without children.

:func:`parse_tree` checks the encoding once (a single root at index 0, parents in range, no cycle, at least one
action) and returns the tree with its derived structure (children, depths, a parents-first order, leaves,
root-to-leaf paths, leaves under each node), so the estimators never walk a malformed tree. A tree built
directly (the layout builders' ``DecisionTree(parents, fork_counts)``) runs the same checks the first time its
structure is read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch import Tensor

from agentcredit.credit._validate import as_int, finite_float, float_list

_Structure = tuple[
    tuple[tuple[int, ...], ...],  # children
    tuple[int, ...],  # depth
    tuple[int, ...],  # order: breadth-first from the root, every parent before its children
    tuple[int, ...],  # leaves, in node-id order
]


@dataclass(frozen=True)
class DecisionTree:
    """A group's steps as a tree: ``parents[i]`` is the parent of node i, -1 for node 0 (the prompt).

    Episodes that share a tree prefix share its nodes; independent episodes are chains under the prompt.
    ``fork_counts``: the times each node was forked (carl-critical's ``forked_parent`` rule), None when unknown.
    ``merged``: the sampled steps a node stands for where the rollout merged identical sibling steps into one
    node (PORTool's tree), for the nodes that stand for more than one; None when the rollout merged none.
    """

    parents: tuple[int, ...]
    fork_counts: Mapping[int, int] | None = None
    merged: Mapping[int, int] | None = None

    @property
    def _structure(self) -> _Structure:
        """Children, depths, order and leaves: checked and derived on the first read, then kept."""
        derived = self.__dict__.get("_derived")
        if derived is None:
            derived = _derive(_parent_list(self.parents, "parents"), "parents")
            object.__setattr__(self, "_derived", derived)  # a cache, not a field: frozen for its fields only
        return derived

    @property
    def children(self) -> tuple[tuple[int, ...], ...]:
        return self._structure[0]

    @property
    def depth(self) -> tuple[int, ...]:
        return self._structure[1]

    @property
    def order(self) -> tuple[int, ...]:
        """Breadth-first from the root: every parent before its children."""
        return self._structure[2]

    @property
    def leaves(self) -> tuple[int, ...]:
        """The non-root nodes without children, in node-id order."""
        return self._structure[3]

    def __len__(self) -> int:
        return len(self.parents)

    def path(self, node: int) -> list[int]:
        """Node ids from depth 1 down to ``node`` (the root excluded)."""
        out = []
        while node != 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def leaves_under(self) -> list[list[int]]:
        """For every node, the leaves of its subtree in node-id order (a leaf's list is itself)."""
        under: list[list[int]] = [[] for _ in self.parents]
        for leaf in self.leaves:
            under[leaf].append(leaf)
        for node in reversed(self.order):  # children before parents
            if node != 0:
                under[self.parents[node]].extend(under[node])
        for lst in under:
            lst.sort()
        return under


def parse_tree(parents: Sequence[int] | Tensor, name: str = "parents") -> DecisionTree:
    """Validate a parent-pointer array and derive the tree structure (ValueError naming ``name``)."""
    par = _parent_list(parents, name)
    structure = _derive(par, name)
    tree = DecisionTree(tuple(par))
    object.__setattr__(
        tree, "_derived", structure
    )  # checked under ``name``, so the tree need not check again
    return tree


def _parent_list(parents: Sequence[int] | Tensor, name: str) -> list[int]:
    if isinstance(parents, Tensor):
        if parents.dim() != 1 or parents.is_floating_point() or parents.dtype.is_complex:
            raise ValueError(
                f"{name} must be a 1-D integer sequence, got a tensor {parents.dtype} {tuple(parents.shape)}"
            )
        parents = parents.tolist()
    if isinstance(parents, str | bytes) or not isinstance(parents, Sequence):
        raise ValueError(f"{name} must be a sequence of ints, got {type(parents).__name__}")
    n = len(parents)
    if n < 2:
        raise ValueError(f"{name} must hold the root (node 0) and at least one action node, got {n} node(s)")
    return [as_int(p, f"{name}[{i}]") for i, p in enumerate(parents)]


def _derive(par: list[int], name: str) -> _Structure:
    n = len(par)
    if par[0] != -1:
        raise ValueError(f"{name}[0] must be -1: node 0 is the root (the prompt), got {par[0]}")
    roots = [i for i, p in enumerate(par) if p == -1]
    if len(roots) > 1:
        raise ValueError(
            f"{name} describes more than one root: nodes {roots} all have parent -1; only node 0 may"
        )
    children: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        p = par[i]
        if not 0 <= p < n:
            raise ValueError(f"{name}[{i}] = {p} is not a node id (valid ids are 0..{n - 1})")
        if p == i:
            raise ValueError(f"{name}[{i}] = {i}: a node cannot be its own parent (cycle)")
        children[p].append(i)
    depth = [-1] * n
    depth[0] = 0
    order = [0]
    for node in order:  # breadth-first; `order` grows while we walk it
        for child in children[node]:
            depth[child] = depth[node] + 1
            order.append(child)
    if len(order) != n:
        # Every node has one parent, so a node the root cannot reach walks up into a cycle; report that cycle.
        walk = [min(i for i in range(n) if depth[i] < 0)]
        while par[walk[-1]] not in walk:
            walk.append(par[walk[-1]])
        cycle = walk[walk.index(par[walk[-1]]) :]
        raise ValueError(
            f"{name} contains a cycle not connected to the root: "
            f"{' -> '.join(map(str, cycle + [cycle[0]]))} (each arrow points to the parent)"
        )
    leaves = tuple(i for i in range(1, n) if not children[i])
    return tuple(tuple(c) for c in children), tuple(depth), tuple(order), leaves


def leaf_values(tree: DecisionTree, values: Mapping[int, float], name: str) -> dict[int, float]:
    """Check that ``values`` maps exactly the leaves of ``tree`` to finite floats.

    A leaf without a value, or a value on a node that is not a leaf, is a ValueError: silently ignoring either
    would train on a different tree than the caller meant.
    """
    if not isinstance(values, Mapping):
        raise ValueError(f"{name} must be a mapping leaf id -> reward, got {type(values).__name__}")
    out: dict[int, float] = {}
    for key, value in values.items():
        node = as_int(key, f"a key of {name}")
        if not 0 <= node < len(tree):
            raise ValueError(f"{name}[{node}]: {node} is not a node id (valid ids are 0..{len(tree) - 1})")
        if tree.children[node] or node == 0:
            raise ValueError(f"{name}[{node}]: node {node} is not a leaf (it has children or is the root)")
        out[node] = finite_float(value, f"{name}[{node}]")
    missing = [leaf for leaf in tree.leaves if leaf not in out]
    if missing:
        raise ValueError(
            f"{name} has no value for leaf/leaves {missing}; every leaf needs its outcome reward"
        )
    return out


def node_floats(tree: DecisionTree, values: Sequence[float] | Tensor, name: str) -> list[float]:
    """One finite float per node (the root's entry is kept but not used by the estimators)."""
    out = float_list(values, name)
    if len(out) != len(tree):
        raise ValueError(
            f"{name} has {len(out)} entries but the tree has {len(tree)} nodes; give one per node"
        )
    return out
