"""HFBackend: every logits vector it returns equals a plain forward pass over the sequence's whole context."""

import random

import pytest
import torch

from agentcredit.rollout.backend import HFBackend


def reference(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1].float()


def check(model, out: dict[int, torch.Tensor], contexts: dict[int, list[int]]) -> None:
    for seq, logits in out.items():
        assert torch.allclose(logits, reference(model, contexts[seq]), atol=2e-5), seq


def test_prefill_decode_fork_truncate_release_blocks(tiny):
    model, _ = tiny
    backend = HFBackend(model)
    rng = random.Random(0)
    ctx: dict[int, list[int]] = {}
    fed = []

    def feed(feeds):
        fed.append(sum(len(t) for t in feeds.values()))
        out = backend.extend(feeds)
        for seq, toks in feeds.items():
            ctx[seq] = ctx.get(seq, []) + list(toks)
        assert set(out) == set(feeds)
        check(model, out, ctx)

    seqs = [backend.new_sequence() for _ in range(3)]
    feed(
        {s: [rng.randrange(1000) for _ in range(n)] for s, n in zip(seqs, (5, 9, 1), strict=True)}
    )  # mixed-length prefill
    feed({seqs[0]: [7]})  # one decoding row of three: gathered
    feed({s: [rng.randrange(1000)] for s in seqs})  # all rows decode: the dense view path
    fork = backend.fork(seqs[0])
    ctx[fork] = list(ctx[seqs[0]])
    assert backend.length(fork) == backend.length(seqs[0]) == len(ctx[fork])
    backend.truncate(seqs[1], 4)
    ctx[seqs[1]] = ctx[seqs[1]][:4]
    feed({fork: [3, 4], seqs[1]: [5], seqs[2]: [1, 2, 3, 4]})  # prefill and decode groups in one call
    head = backend.export_block(seqs[2], 0, 3)
    tail = backend.export_block(seqs[2], 3, backend.length(seqs[2]))
    backend.release(seqs[0])  # the last row moves into its slot
    del ctx[seqs[0]]
    rebuilt = backend.sequence_from_blocks([head, tail])
    ctx[rebuilt] = list(ctx[seqs[2]])
    feed({rebuilt: [9], seqs[2]: [9], fork: [11], seqs[1]: [12, 13]})
    assert backend.n_sequences == 4
    assert backend.stats.tokens_fed == sum(fed)  # forks and rebuilt sequences computed nothing again


def test_growth_beyond_the_initial_slab(tiny):
    model, _ = tiny
    backend = HFBackend(model)
    seqs = [backend.new_sequence() for _ in range(10)]  # more rows than the initial 8
    ctx = {s: [(17 * s + i) % 3000 for i in range(40 + 30 * s)] for s in seqs}  # up to 310 > 256 columns
    out = backend.extend(ctx)
    check(model, out, ctx)
    assert backend.slab.row_cap >= 10 and backend.slab.width_cap >= 311


@pytest.mark.parametrize("dense_fraction", [0.0, 1.1])
def test_dense_and_gathered_decode_agree(tiny, dense_fraction):
    model, _ = tiny
    backend = HFBackend(model, dense_fraction=dense_fraction)
    a, b, c = (backend.new_sequence() for _ in range(3))
    ctx = {a: [1, 2, 3], b: [4, 5], c: [6, 7, 8, 9]}
    backend.extend(ctx)
    for step in range(3):
        feeds = {a: [10 + step], c: [20 + step]}  # b idles (a masked dummy token in the dense path)
        for seq, toks in feeds.items():
            ctx[seq] += toks
        check(model, backend.extend(feeds), ctx)
    assert backend.length(b) == 2


def test_errors_name_the_problem(tiny):
    model, _ = tiny
    backend = HFBackend(model)
    seq = backend.new_sequence()
    with pytest.raises(ValueError, match="does not exist"):
        backend.extend({seq + 5: [1]})
    with pytest.raises(ValueError, match="no tokens"):
        backend.extend({seq: []})
    backend.extend({seq: [1, 2]})
    with pytest.raises(ValueError, match="outside"):
        backend.truncate(seq, 3)
    with pytest.raises(ValueError, match="outside"):
        backend.export_block(seq, 1, 5)
    backend.release(seq)
    with pytest.raises(ValueError, match="does not exist"):
        backend.length(seq)


def test_refuses_sliding_window_models():
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        sliding_window=8,
    )
    with pytest.raises(ValueError, match="sliding-window"):
        HFBackend(MistralForCausalLM(config))


def test_slab_cache_accepts_every_transformers_update_signature():
    """transformers 5.24 calls ``cache.update(k, v, layer, kwargs=...)``; older releases pass ``cache_kwargs``."""
    from agentcredit.rollout.backend import _SlabCache

    calls = []

    class Slab:
        def write_and_read(self, layer, key, value):
            calls.append(layer)
            return key, value

    cache = _SlabCache(Slab())
    k = v = torch.zeros(1, 1, 1, 2)
    assert cache.update(k, v, 0) == (k, v)
    assert cache.update(k, v, 1, {"cache_position": None}) == (k, v)
    assert cache.update(k, v, 2, kwargs={"position_ids": None}) == (k, v)
    assert calls == [0, 1, 2]


def test_the_cache_goes_in_under_the_name_the_model_takes(tiny):
    """transformers 5.2x renamed ``past_key_values`` to ``cache`` and warns on the old name (gone in 5.40)."""
    import inspect
    import warnings

    model = tiny[0] if isinstance(tiny, tuple) else tiny
    backend = HFBackend(model)
    expected = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    assert backend._cache_arg == expected
    seq = backend.new_sequence()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        backend.extend({seq: [1, 2, 3]})
