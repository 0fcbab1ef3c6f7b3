"""Rows that share a prefix, forwarded once: a token trie packed into one sequence with a tree attention mask.

Tree rollouts (PORTool, carl-critical) and carl-segment's replacement views give training rows that begin with the
same tokens: the prompt, and every step before a fork. Forwarded row by row, each row recomputes that prefix.
Packed, the rows become a trie of tokens laid out as one sequence, each distinct prefix once:

* a token attends exactly the tokens of its own prefix (its ancestors in the trie, and itself);
* its position id is its depth, i.e. its position in its own row.

So every token's hidden state is the same function of the same inputs as in its own row: equal up to the order of
floating-point sums (the masked keys add exact zeros). A loss on the rows' tokens then back-propagates into the
shared tokens once, with the gradient of every continuation summed there, exactly as the row-by-row backward sums
it into the shared weights.

Rows that are lexicographically sorted share with their neighbour the longest prefix any other row gives them, so
the packed size of a sorted run of rows is ``sum(len_i - lcp(row_i, row_{i-1}))`` (:func:`shared_prefix_chunks`
budgets micro-batches that way).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

#: The attention implementations that take a custom 4D mask as is (transformers passes a 4D mask through); flash
#: attention and others need their own packed format, so rows are forwarded one by one there.
PACKABLE_ATTENTION = ("sdpa", "eager")


def packable(model: Any) -> str | None:
    """The model's attention implementation if its rows can be packed under a tree mask, else None.

    A custom 4D mask replaces every mask the model would build, so only plain causal full attention qualifies:
    not a sliding window (Mistral; Qwen2's sliding layers; any ``layer_types`` entry but full attention), not
    a non-causal model, and not attention dropout in training (one dropout sample would serve every row that
    shares the prefix, where row by row each row draws its own).
    """
    config = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in PACKABLE_ATTENTION or not getattr(config, "is_causal", True):
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(kind != "full_attention" for kind in layer_types):
        return None
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return None
    if getattr(model, "training", False) and getattr(config, "attention_dropout", 0.0):
        return None
    return implementation


@dataclass
class PackedRows:
    input_ids: torch.Tensor  # [1, P] the trie's tokens, every ancestor before its descendants
    position_ids: torch.Tensor  # [1, P] each token's position in its own row
    allowed: torch.Tensor  # [P, P] bool: query i may attend key j (j is i or an ancestor of i)
    index: torch.Tensor  # [B, T] long: where row b's token t sits in the packed sequence (0 on padding)

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def attention_mask(self, implementation: str, dtype: torch.dtype) -> torch.Tensor:
        """The ``[1, 1, P, P]`` mask ``implementation`` expects: boolean for SDPA, additive for eager."""
        if implementation == "sdpa":
            return self.allowed[None, None]
        if implementation == "eager":
            mask = torch.zeros(self.allowed.shape, dtype=dtype, device=self.allowed.device)
            return mask.masked_fill(~self.allowed, torch.finfo(dtype).min)[None, None]
        raise ValueError(f"packed rows need one of {PACKABLE_ATTENTION} attention, got {implementation!r}")


def _lengths(attention_mask: torch.Tensor) -> list[int]:
    lengths = attention_mask.sum(-1)
    expected = torch.arange(attention_mask.shape[1], device=attention_mask.device)[None] < lengths[:, None]
    if not torch.equal(attention_mask.bool(), expected):
        raise ValueError("pack_shared_prefixes: rows must be right-padded (attention_mask True, then False)")
    return lengths.tolist()


def pack_shared_prefixes(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PackedRows:
    """Pack right-padded rows ``[B, T]`` into one trie sequence (see the module docstring)."""
    lengths = _lengths(attention_mask)
    B, T = input_ids.shape
    rows = input_ids.tolist()
    node: dict[tuple[int, int], int] = {}  # (parent packed index or -1, token) -> packed index
    tokens: list[int] = []
    depth: list[int] = []
    parent: list[int] = []
    index = [[0] * T for _ in range(B)]
    for b in range(B):
        up = -1
        for t in range(lengths[b]):
            key = (up, rows[b][t])
            here = node.get(key)
            if here is None:
                here = node[key] = len(tokens)
                tokens.append(rows[b][t])
                depth.append(t)
                parent.append(up)
            index[b][t] = here
            up = here
    P = len(tokens)
    # a node attends what its parent attends, and itself (parents come first): O(P^2) row copies
    allowed = torch.zeros(P, P, dtype=torch.bool)
    for i, up in enumerate(parent):
        if up >= 0:
            allowed[i] = allowed[up]
        allowed[i, i] = True
    device = input_ids.device
    return PackedRows(
        input_ids=torch.tensor([tokens], dtype=input_ids.dtype, device=device),
        position_ids=torch.tensor([depth], dtype=torch.long, device=device),
        allowed=allowed.to(device),
        index=torch.tensor(index, dtype=torch.long, device=device),
    )


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def shared_prefix_chunks(rows: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
    """Micro-batches of row indices whose packed size (distinct prefix tokens) stays within the budget.

    The budget is ``max_tokens`` or, if longer, the longest row: row by row, a row longer than ``max_tokens`` is
    forwarded alone, so no packed forward is ever larger than the largest row-by-row one. Rows are sorted by their
    tokens, so rows that share a prefix are neighbours and fall into one chunk where the budget allows; a chunk's
    packed size is the sum over its rows of ``len - lcp(row, previous row)``.
    """
    budget = max([max_tokens, *map(len, rows)])
    order = sorted(range(len(rows)), key=lambda i: list(rows[i]))
    chunks: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in order:
        new = len(rows[i]) - (_common_prefix(rows[current[-1]], rows[i]) if current else 0)
        if current and size + new > budget:
            chunks.append(current)
            current, size = [], 0
            new = len(rows[i])
        current.append(i)
        size += new
    if current:
        chunks.append(current)
    return chunks


def padded_chunks(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group rows into microbatches whose padded size (rows x longest) stays within ``max_tokens``.

    Rows are sorted by length first so that similar lengths share a microbatch (little padding).
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    chunks: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) + 1) * max(lengths[i], 1) > max_tokens:
            chunks.append(current)
            current = []
        current.append(i)
    if current:
        chunks.append(current)
    return chunks
