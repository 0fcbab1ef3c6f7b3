"""Shared prefixes forwarded once (issue 13): the packed trie gives the row-by-row log-probs, entropies, values and
gradients within 1e-5, and packs each shared prefix exactly once."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.models.heads import BoundaryValueHead
from agentcredit.models.packing import pack_shared_prefixes, packable, shared_prefix_chunks
from agentcredit.models.scoring import micro_batches, score_tokens
from agentcredit.models.tiny import tiny_llama
from agentcredit.train.signals import pad_rows


def _padded(rows):
    return pad_rows(rows, range(len(rows)), pad_id=0)


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
    ids, attn = _padded(rows)
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
        assert pack_shared_prefixes(*_padded([rows[i] for i in chunk])).tokens <= 40
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
        ids, attn = _padded([rows[i] for i in chunk])
        distinct_prefixes = {tuple(rows[i][: t + 1]) for i in chunk for t in range(len(rows[i]))}
        assert pack_shared_prefixes(ids, attn).tokens == len(distinct_prefixes)
        # never more than the larger of the budget and the longest row (row by row, a longer row goes alone)
        assert len(distinct_prefixes) <= max(budget, *map(len, rows))


def test_duplicate_rows_and_a_row_that_is_another_rows_prefix_pack_exactly():
    # a duplicate row shares every node (its gradient adds up there, as row by row); a strict prefix ends inside
    # another row's path
    p, t = list(range(40, 52)), list(range(300, 306))
    rows = [p + t, p + t, p + t[:3], p, p + t[:1] + [7, 8]]
    ids, attn = _padded(rows)
    assert pack_shared_prefixes(ids, attn).tokens == 12 + 6 + 2
    model, _ = tiny_llama(seed=4)
    grads, lps = {}, {}
    for shared in (False, True):
        model.zero_grad(set_to_none=True)
        s = score_tokens(model, ids, attn, attn, share_prefixes=shared)
        (-(s.logprobs * attn).sum() - s.entropies.sum()).backward()
        lps[shared] = s.logprobs
        grads[shared] = torch.cat([q.grad.flatten() for q in model.parameters()])
    torch.testing.assert_close(lps[True], lps[False], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[True], grads[False], atol=1e-5, rtol=1e-5)


def _mistral(**changes):
    from transformers import MistralConfig, MistralForCausalLM

    kw = dict(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return MistralForCausalLM(MistralConfig(**{**kw, **changes})).eval()


def test_a_sliding_window_model_is_not_packed():
    """A custom 4D mask replaces the model's own masks, sliding windows included: such a model is forwarded as
    rows (packed, a 4-token window gave log-probs 0.12 off)."""
    rows = [list(range(10, 30)), list(range(10, 25)) + [3, 4, 5, 6, 7, 8]]
    ids, attn = _padded(rows)
    windowed = _mistral(sliding_window=4)
    assert packable(windowed) is None
    plain = score_tokens(windowed, ids, attn, attn, share_prefixes=False)
    shared = score_tokens(windowed, ids, attn, attn, share_prefixes=True)
    assert torch.equal(plain.logprobs, shared.logprobs) and shared.forwarded == ids.numel()
    full = _mistral(sliding_window=None)
    assert packable(full) == "sdpa"
    torch.testing.assert_close(
        score_tokens(full, ids, attn, attn, share_prefixes=True).logprobs,
        score_tokens(full, ids, attn, attn, share_prefixes=False).logprobs,
        atol=1e-5,
        rtol=1e-5,
    )


def test_micro_batches_fit_the_budget_in_positions_fed_packed_or_not():
    """Packed, a chunk's positions are its distinct tokens; a model that cannot be packed is fed padded rows, so
    its chunks are budgeted by rows x width (one 900-token row beside short rows would otherwise feed 11,700)."""
    rows = [list(range(900))] + [[1000 + 10 * i + j for j in range(10)] for i in range(12)]
    model, _ = tiny_llama()
    packed = micro_batches(model, rows, 1024)
    assert len(packed) == 1  # 1,020 distinct tokens
    model.config._attn_implementation = "flash_attention_2"
    padded = micro_batches(model, rows, 1024)
    assert all(len(c) * max(len(rows[i]) for i in c) <= max(1024, 900) for c in padded)
