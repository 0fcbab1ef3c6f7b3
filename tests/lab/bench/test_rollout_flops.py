"""The rollout FLOP formulas of agentcredit.lab.bench.flops (issue 33), by hand on a tiny decoder shape."""

from __future__ import annotations

import pytest
import torch

from agentcredit.lab.bench.flops import (
    DecoderShape,
    amdahl_bound,
    attention_flops,
    context_pairs,
    forward_flops,
    linear_flops_per_token,
    lm_head_flops_per_row,
    matmul_flops,
)

# 2 layers, hidden 8, 4 heads of dim 2, 2 kv heads, MLP 16, vocab 10
TINY = DecoderShape(layers=2, hidden=8, heads=4, kv_heads=2, intermediate=16, vocab=10)


def test_linear_flops_by_hand():
    # per layer, multiply-adds: q 8x8 = 64, o 8x8 = 64, k 8x4 = 32, v 8x4 = 32, MLP 3 x 8 x 16 = 384 -> 576;
    # 2 layers -> 1,152 multiply-adds -> 2,304 FLOPs
    assert TINY.dim == 2
    assert linear_flops_per_token(TINY) == 2304


def test_lm_head_and_attention_flops_by_hand():
    assert lm_head_flops_per_row(TINY) == 2 * 8 * 10  # 160
    # one query-key pair: per layer and head q.k (2 multiply-adds) and the v sum (2): 4 x 4 heads x 2 layers = 32
    # multiply-adds = 64 FLOPs
    assert attention_flops(TINY, 1) == 64
    assert attention_flops(TINY, 10) == 640


def test_forward_flops_adds_the_three_parts():
    f = forward_flops(TINY, tokens=3, logit_rows=2, attention_pairs=6)
    assert f == {"linear": 3 * 2304, "lm_head": 2 * 160, "attention": 6 * 64, "total": 6912 + 320 + 384}


def test_context_pairs_by_hand():
    assert context_pairs(0, 3) == 1 + 2 + 3
    assert context_pairs(5, 2) == 6 + 7
    assert context_pairs(4, 0) == 0
    with pytest.raises(ValueError):
        context_pairs(-1, 2)


def test_amdahl_bound_by_hand():
    b = amdahl_bound(100.0, 2e12, 50e9)  # 2,000 GFLOP at 50 GFLOP per CPU-second: 40 s
    assert b["min_cpu_seconds"] == pytest.approx(40.0) and b["max_speedup"] == pytest.approx(2.5)
    with pytest.raises(ValueError):
        amdahl_bound(1.0, 1.0, 0.0)


def test_decoder_shape_from_a_transformers_config():
    from transformers import LlamaConfig

    config = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=16,
        vocab_size=10,
    )
    shape = DecoderShape.from_config(config)
    assert linear_flops_per_token(shape) == 2304 and lm_head_flops_per_row(shape) == 160


def test_matmul_flops_per_cpu_second():
    peak = matmul_flops(n=64, trials=2, min_seconds=0.01, clock="cpu")
    assert peak["best"] >= peak["median"] > 0
    with pytest.raises(ValueError, match="clock"):
        matmul_flops(n=8, clock="gpu")


def test_weight_bytes_and_weight_stream_bound_by_hand():
    from agentcredit.lab.bench.flops import weight_bytes_per_forward, weight_stream_bound

    # linear weights 1,152 (the multiply-adds per token above) + LM head 8 x 10 = 1,232 weights, 4 bytes each
    assert weight_bytes_per_forward(TINY, 4) == 4928
    # 100 forwards one after another, 1 GB each, at 20 GB per CPU-second: 5 s; a 30 s baseline: at most 6x
    b = weight_stream_bound(30.0, 100, 1e9, 20e9)
    assert b["min_cpu_seconds"] == pytest.approx(5.0) and b["max_speedup"] == pytest.approx(6.0)
    with pytest.raises(ValueError):
        weight_stream_bound(1.0, 1, 1.0, 0.0)


def test_matvec_bandwidth_measures_bytes_per_second():
    from agentcredit.lab.bench.flops import matvec_bandwidth

    rate = matvec_bandwidth(n=256, trials=2, min_seconds=0.01)
    assert rate["best"] >= rate["median"] > 0


def test_layer_shapes_and_kernel_floor_by_hand():
    from agentcredit.lab.bench.flops import kernel_floor, layer_shapes, linear_seconds

    # q 8->8, k and v 8->4, o 8->8, gate and up 8->16, down 16->8: 64 + 32 + 32 + 64 + 128 + 128 + 128 = 576
    # multiply-adds, one layer of the 1,152 above
    shapes = layer_shapes(TINY)
    assert shapes == [(8, 8), (8, 4), (8, 4), (8, 8), (8, 16), (8, 16), (16, 8)]
    assert 2 * TINY.layers * sum(k * n for k, n in shapes) == linear_flops_per_token(TINY)
    # 10 sampled tokens x 2 layers x 0.5 s + 4 logit rows x 1 s + 100 FLOPs at 50 per second = 10 + 4 + 2 = 16 s
    work = dict(
        sampled_positions=10,
        logit_rows=4,
        other_flops=100.0,
        layer_seconds_per_row=0.5,
        layers=2,
        head_seconds_per_row=1.0,
        peak_flops_per_cpu_second=50.0,
    )
    f = kernel_floor(32.0, **work)
    assert (f["decode_seconds"], f["head_seconds"], f["other_seconds"]) == (10.0, 4.0, 2.0)
    assert f["min_cpu_seconds"] == 16.0 and f["max_speedup"] == 2.0 and f["attention_seconds"] == 0.0
    # the same with 60 decode query-key pairs at 0.1 s each (all layers): + 6 s = 22 s
    f = kernel_floor(44.0, **work, decode_attention_pairs=60, attention_seconds_per_pair=0.1)
    assert f["attention_seconds"] == pytest.approx(6.0)
    assert f["min_cpu_seconds"] == pytest.approx(22.0) and f["max_speedup"] == pytest.approx(2.0)
    assert linear_seconds(shapes, 4, trials=1, min_seconds=0.01) > 0
    with pytest.raises(ValueError):
        linear_seconds(shapes, 0)


def test_streamed_weights_are_the_models_distinct_weights_in_forward_order():
    from agentcredit.lab.bench.flops import layer_shapes, streamed_weights, weight_bytes_per_forward

    weights = streamed_weights(TINY)
    # 2 layers x (q, k, v, o, gate, up, down) + the LM head = 15 tensors, stored [out, in] as nn.Linear does
    assert [tuple(w.shape) for w in weights] == [(n, k) for k, n in layer_shapes(TINY)] * 2 + [(10, 8)]
    assert len({w.data_ptr() for w in weights}) == 15  # distinct tensors, not one weight reused
    assert sum(w.numel() for w in weights) * 4 == weight_bytes_per_forward(TINY, 4) == 4928
    assert all(w.dtype == torch.float32 for w in weights)


def test_streamed_linear_seconds_visits_every_weight_once_per_pass():
    from agentcredit.lab.bench.flops import streamed_linear_seconds, streamed_weights

    weights = streamed_weights(TINY)
    seen: list[tuple[int, tuple[int, ...]]] = []

    def counting_linear(x, w):
        seen.append((w.data_ptr(), tuple(x.shape)))
        return torch.nn.functional.linear(x, w)

    t = streamed_linear_seconds(TINY, 3, passes=2, weights=weights, linear=counting_linear)
    assert set(t) == {"layers", "head"} and t["layers"] >= 0 and t["head"] >= 0
    # a warm-up pass and 2 timed passes, each through all 15 weights once, in a forward's order, on 3 rows
    one_pass = [(w.data_ptr(), (3, w.shape[1])) for w in weights]
    assert seen == one_pass * 3
    # the default weights are built from the shape; the real product takes time
    assert streamed_linear_seconds(TINY, 4, passes=1)["layers"] >= 0
    with pytest.raises(ValueError):
        streamed_linear_seconds(TINY, 0)
    with pytest.raises(ValueError):
        streamed_linear_seconds(TINY, 2, weights=weights[:-1])


def test_decode_attention_seconds_reads_each_layers_cache_once_per_pass():
    from agentcredit.lab.bench.flops import decode_attention_seconds

    seen: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []

    def counting_attend(q, k, v):
        seen.append((k.data_ptr(), tuple(q.shape), tuple(k.shape)))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    t = decode_attention_seconds(TINY, 3, 5, passes=2, attend=counting_attend)
    assert t >= 0
    # a warm-up pass and 2 timed passes, each through the 2 layers' own caches: q [3 rows, 4 heads, 1, dim 2]
    # against k [3 rows, 2 kv heads, 5 positions, dim 2]
    assert [(q, k) for _, q, k in seen] == [((3, 4, 1, 2), (3, 2, 5, 2))] * 6
    layer_caches = [p for p, _, _ in seen[:2]]
    assert len(set(layer_caches)) == 2 and [p for p, _, _ in seen] == layer_caches * 3
    assert decode_attention_seconds(TINY, 2, 3, passes=1) >= 0
    with pytest.raises(ValueError):
        decode_attention_seconds(TINY, 2, 0)
