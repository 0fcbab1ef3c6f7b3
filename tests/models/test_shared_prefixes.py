"""Shared prefixes forwarded once (issue 13): the packed trie gives the row-by-row log-probs, entropies, values and
gradients within 1e-5, and packs each shared prefix exactly once."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.models.heads import BoundaryValueHead
from agentcredit.models.packing import pack_shared_prefixes, shared_prefix_chunks
from agentcredit.models.scoring import score_tokens
from agentcredit.models.tiny import tiny_llama


def _tree_rows():
    """Five rows as a tree rollout gives them: one prompt, two forks after it, one fork deeper, a lone row."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 900, (9,), generator=g).tolist()
    step = torch.randint(5, 900, (4,), generator=g).tolist()

    def tail(n):
        return torch.randint(5, 900, (n,), generator=g).tolist()

    rows = [
        prompt + step + tail(5),
        prompt + step + tail(3),
        prompt + tail(6),
        prompt + step + tail(5)[:2],
        tail(7),
    ]
    T = max(map(len, rows))
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    attn = torch.zeros(len(rows), T, dtype=torch.bool)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r)
        attn[b, : len(r)] = True
    want = attn.clone()
    want[:, :9] = False  # the prompt is not trained
    return rows, ids, attn, want


def test_the_trie_holds_each_shared_prefix_once_with_row_positions_and_ancestor_attention():
    rows, ids, attn, _ = _tree_rows()
    packed = pack_shared_prefixes(ids, attn)
    # by hand: 9 prompt + 4 step + 5 + 3 (two forks after the step) + 6 (fork after the prompt) + 2 (row 3's tail
    # shares nothing with row 0's: a fresh draw) + 7 (the lone row)
    assert packed.tokens == 9 + 4 + 5 + 3 + 6 + 2 + 7 < sum(map(len, rows))
    for b, r in enumerate(rows):
        where = packed.index[b, : len(r)]
        assert packed.input_ids[0, where].tolist() == r
        assert packed.position_ids[0, where].tolist() == list(range(len(r)))
        # a token attends its own row's earlier tokens and itself, nothing else
        last = where[-1]
        assert set(packed.allowed[last].nonzero().flatten().tolist()) == set(where.tolist())
    assert torch.equal(packed.index[0, :13], packed.index[1, :13])  # the prompt and step are one copy
    assert (packed.allowed.sum(-1) == packed.position_ids[0] + 1).all()
    with pytest.raises(ValueError, match="right-padded"):
        pack_shared_prefixes(ids, attn.flip(-1))


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_shared_prefixes_score_and_backpropagate_as_rows_do(attention):
    rows, ids, attn, want = _tree_rows()
    model, _ = tiny_llama(seed=1)
    model.config._attn_implementation = attention
    head = BoundaryValueHead(model.config.hidden_size)
    grads = {}
    scores = {}
    for shared in (False, True):
        model.zero_grad(set_to_none=True)
        head.zero_grad(set_to_none=True)
        s = score_tokens(model, ids, attn, want, value_head=head, temperature=0.7, share_prefixes=shared)
        loss = -(s.logprobs * want).sum() + 0.1 * s.entropies.sum() + (s.values**2).sum()
        loss.backward()
        scores[shared] = s
        grads[shared] = {n: p.grad.clone() for n, p in [*model.named_parameters(), *head.named_parameters()]}
    for field in ("logprobs", "entropies", "values"):
        torch.testing.assert_close(
            getattr(scores[True], field), getattr(scores[False], field), atol=1e-5, rtol=1e-5
        )
    for name, g in grads[False].items():
        torch.testing.assert_close(grads[True][name], g, atol=1e-5, rtol=1e-5, msg=name)


def test_the_chunks_keep_shared_rows_together_within_the_packed_budget():
    rows, *_ = _tree_rows()
    chunks = shared_prefix_chunks(rows, max_tokens=40)
    assert sorted(i for c in chunks for i in c) == list(range(len(rows)))
    for chunk in chunks:
        ids = torch.zeros(len(chunk), max(len(rows[i]) for i in chunk), dtype=torch.long)
        attn = torch.zeros_like(ids, dtype=torch.bool)
        for k, i in enumerate(chunk):
            ids[k, : len(rows[i])] = torch.tensor(rows[i])
            attn[k, : len(rows[i])] = True
        assert pack_shared_prefixes(ids, attn).tokens <= 40
    # packed, all five rows take 36 tokens (29 for the four that share the prompt, 7 for the lone row), row by row 58
    assert [sorted(c) for c in chunks] == [[0, 1, 2, 3, 4]]
    assert len(shared_prefix_chunks(rows, max_tokens=35)) == 2


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=8), min_size=1, max_size=6),
    st.integers(1, 20),
)
def test_chunk_sizes_are_the_packed_sizes(rows, budget):
    """The chunker's running count (len - lcp with the sorted neighbour) is exactly the trie's size."""
    chunks = shared_prefix_chunks(rows, budget)
    assert sorted(i for c in chunks for i in c) == list(range(len(rows)))
    for chunk in chunks:
        T = max(len(rows[i]) for i in chunk)
        ids = torch.zeros(len(chunk), T, dtype=torch.long)
        attn = torch.zeros(len(chunk), T, dtype=torch.bool)
        for k, i in enumerate(chunk):
            ids[k, : len(rows[i])] = torch.tensor(rows[i])
            attn[k, : len(rows[i])] = True
        distinct_prefixes = {tuple(rows[i][: t + 1]) for i in chunk for t in range(len(rows[i]))}
        assert pack_shared_prefixes(ids, attn).tokens == len(distinct_prefixes)
        # never more than the larger of the budget and the longest row (row by row, a longer row goes alone)
        assert len(distinct_prefixes) <= max(budget, *map(len, rows))
