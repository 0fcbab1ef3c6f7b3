"""The hardware ceiling: measured matmul FLOP/s of this CPU, and the fraction of it each training phase achieves.

Peak: square ``n x n`` matmuls (2 n^3 FLOPs each) timed with torch on the threads torch uses, for fp32 and bf16;
the best of several trials is the ceiling (the machine may be shared, so the best trial is the least disturbed).

Achieved: the usual transformer estimate, FLOPs ~ 2 N per token for a forward pass and 6 N per token for forward
plus backward, with N the non-embedding parameters and the tokens counted by :class:`agentcredit.lab.bench.train.
PhaseTokens` (every position fed to a decoder). Rollout and signals are forward-only (2 N); the update runs
forward + backward (6 N). Attention's own FLOPs (~ 2 n_layer n_ctx d per token) and the LM head, applied only
where a log-prob is needed, are left out, so the fractions are slight underestimates.

Rollout FLOPs (``bench rollout --compare``, issue 33) are counted exactly from the decoder's shape instead
(:class:`DecoderShape`): linear layers per position fed, the LM head per row whose logits are kept, attention per
query-key pair; with the peak measured per CPU-second (``clock="cpu"``) and the matrix-vector streaming rate
(:func:`matvec_bandwidth`), they give a rollout's floors (:func:`amdahl_bound`, :func:`weight_stream_bound`); the
model's products timed at a decode batch give :func:`kernel_floor`, with each weight hot in cache
(:func:`linear_seconds`) or streamed from memory as in a decode step (:func:`streamed_linear_seconds`, with the
decode attention of :func:`decode_attention_seconds`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

FLOPS_PER_TOKEN = {"rollout": 2, "signals": 2, "update": 6}  # x N (non-embedding parameters)


def seconds_per_call(
    call: Callable[[], object], *, trials: int, min_seconds: float, now: Callable[[], float]
) -> list[float]:
    """Seconds per ``call()`` in each of ``trials`` trials, each repeating it until ``min_seconds`` have passed on
    the clock ``now`` (wall or this process's CPU seconds); the one timing loop of every kernel rate here."""
    out = []
    for _ in range(trials):
        reps, start = 0, now()
        while True:
            call()
            reps += 1
            elapsed = now() - start
            if elapsed >= min_seconds:
                break
        out.append(elapsed / reps)
    return out


def matmul_flops(
    dtype: torch.dtype = torch.float32,
    *,
    n: int = 1024,
    trials: int = 5,
    min_seconds: float = 0.3,
    clock: str = "wall",
) -> dict[str, float]:
    """FLOP/s of ``n x n @ n x n`` matmuls in ``dtype``: ``{"best", "median", "n", "threads"}``.

    ``clock="cpu"`` times them in CPU seconds of this process (``time.process_time``) instead of wall seconds:
    FLOP per CPU-second, the peak to set a CPU-second count against on a machine whose other processes take
    turns on the cores (with one torch thread, one CPU-second is one core busy for a second)."""
    if n < 1 or trials < 1:
        raise ValueError(f"matmul_flops: need n >= 1 and trials >= 1, got n={n}, trials={trials}")
    if clock not in ("wall", "cpu"):
        raise ValueError(f"matmul_flops: clock must be 'wall' or 'cpu', got {clock!r}")
    now = time.perf_counter if clock == "wall" else time.process_time
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(dtype)
    b = torch.randn(n, n, generator=gen).to(dtype)
    out = torch.empty(n, n, dtype=dtype)
    torch.matmul(a, b, out=out)  # warm-up: thread pool, caches
    rates = [
        2.0 * n**3 / t
        for t in seconds_per_call(
            lambda: torch.matmul(a, b, out=out), trials=trials, min_seconds=min_seconds, now=now
        )
    ]
    return {
        "best": max(rates),
        "median": statistics.median(rates),
        "n": float(n),
        "threads": float(torch.get_num_threads()),
    }


def phase_flops(tokens: dict[str, float], non_embedding_parameters: int) -> dict[str, float]:
    """FLOPs of each phase from its token count: factor (2 forward, 6 train) x N x tokens."""
    unknown = set(tokens) - set(FLOPS_PER_TOKEN)
    if unknown:
        raise ValueError(
            f"phase_flops: unknown phase(s) {sorted(unknown)}; phases are {sorted(FLOPS_PER_TOKEN)}"
        )
    return {p: FLOPS_PER_TOKEN[p] * non_embedding_parameters * float(t) for p, t in tokens.items()}


def phase_fractions(bench: dict[str, Any], peak_flops: float) -> dict[str, dict[str, dict[str, float]]]:
    """Per method and phase of a ``bench train`` result: FLOPs, achieved FLOP/s and fraction of ``peak_flops``."""
    if peak_flops <= 0:
        raise ValueError(f"peak FLOP/s must be positive, got {peak_flops}")
    n = int(bench["non_embedding_parameters"])
    out: dict[str, dict[str, dict[str, float]]] = {}
    for method, entry in bench["methods"].items():
        flops = phase_flops(entry["tokens_per_step"], n)
        out[method] = {}
        for phase, f in flops.items():
            seconds = entry[f"{phase}_seconds"]
            achieved = f / seconds if seconds > 0 else float("nan")
            out[method][phase] = {
                "tokens": float(entry["tokens_per_step"][phase]),
                "flops": f,
                "seconds": seconds,
                "flops_per_second": achieved,
                "fraction_of_peak": achieved / peak_flops,
            }
    return out


# ------------------------------------------------------------------------------------------------ rollout FLOPs
# A decoder's forward FLOPs counted from its shape (2 FLOPs per multiply-add), for ``bench rollout --compare``:
# the linear layers per token fed, the LM head per row whose logits are kept, attention per query-key pair.
# Norms, RoPE, activations, softmax and sampling are left out (each < 1% of a 135M model's linear FLOPs).


@dataclass(frozen=True)
class DecoderShape:
    """What a Llama-style decoder's FLOPs depend on (``from_config`` reads a transformers config)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    head_dim: int | None = None  # default hidden // heads

    @property
    def dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @classmethod
    def from_config(cls, config: Any) -> DecoderShape:
        c = config.get_text_config() if hasattr(config, "get_text_config") else config
        return cls(
            layers=int(c.num_hidden_layers),
            hidden=int(c.hidden_size),
            heads=int(c.num_attention_heads),
            kv_heads=int(getattr(c, "num_key_value_heads", None) or c.num_attention_heads),
            intermediate=int(c.intermediate_size),
            vocab=int(c.vocab_size),
            head_dim=getattr(c, "head_dim", None),
        )


def linear_flops_per_token(shape: DecoderShape) -> int:
    """FLOPs of every layer's projections for one token: q and o (hidden x heads*dim), k and v (hidden x
    kv_heads*dim), the gated MLP's gate, up and down (3 x hidden x intermediate); 2 per multiply-add."""
    attn = 2 * shape.hidden * shape.heads * shape.dim + 2 * shape.hidden * shape.kv_heads * shape.dim
    mlp = 3 * shape.hidden * shape.intermediate
    return 2 * shape.layers * (attn + mlp)


def lm_head_flops_per_row(shape: DecoderShape) -> int:
    """FLOPs of the LM head for one position whose logits are computed (hidden x vocab)."""
    return 2 * shape.hidden * shape.vocab


def attention_flops(shape: DecoderShape, pairs: int) -> int:
    """FLOPs of attention over ``pairs`` query-key pairs (one query position against one cached position): per
    layer and head, ``q . k`` and the weighted sum of ``v`` are ``dim`` multiply-adds each."""
    return 2 * 2 * shape.layers * shape.heads * shape.dim * int(pairs)


def forward_flops(
    shape: DecoderShape, *, tokens: int, logit_rows: int, attention_pairs: int
) -> dict[str, int]:
    """FLOPs of forwards that fed ``tokens`` positions, kept ``logit_rows`` positions' logits and computed
    ``attention_pairs`` query-key pairs: ``{"linear", "lm_head", "attention", "total"}``."""
    out = {
        "linear": linear_flops_per_token(shape) * int(tokens),
        "lm_head": lm_head_flops_per_row(shape) * int(logit_rows),
        "attention": attention_flops(shape, attention_pairs),
    }
    out["total"] = sum(out.values())
    return out


def context_pairs(start: int, n: int) -> int:
    """Query-key pairs of ``n`` tokens fed at positions ``start .. start + n - 1`` of a causal sequence (the token at
    position p attends to positions 0..p: p + 1 pairs)."""
    if start < 0 or n < 0:
        raise ValueError(f"context_pairs: need start >= 0 and n >= 0, got start={start}, n={n}")
    return n * (start + 1) + n * (n - 1) // 2


def amdahl_bound(baseline_cpu_seconds: float, needed_flops: float, peak_flops_per_cpu_second: float) -> dict:
    """The fewest CPU seconds the ``needed_flops`` can take at ``peak_flops_per_cpu_second`` (the measured matmul
    peak: no fp32 engine on this CPU computes faster), and the largest speed-up over ``baseline_cpu_seconds`` any
    engine that computes at least those FLOPs could reach: ``{"min_cpu_seconds", "max_speedup"}``."""
    if peak_flops_per_cpu_second <= 0:
        raise ValueError(f"amdahl_bound: peak must be positive, got {peak_flops_per_cpu_second}")
    seconds = float(needed_flops) / peak_flops_per_cpu_second
    return {
        "min_cpu_seconds": seconds,
        "max_speedup": baseline_cpu_seconds / seconds if seconds > 0 else float("inf"),
    }


def weight_bytes_per_forward(shape: DecoderShape, element_size: int) -> int:
    """Bytes of weights one forward reads, whatever its batch: every linear layer's weights and the LM head's
    (hidden x vocab; the input embedding only gathers rows, left out), ``element_size`` bytes each (fp32: 4)."""
    return (linear_flops_per_token(shape) // 2 + shape.hidden * shape.vocab) * int(element_size)


def matvec_bandwidth(
    dtype: torch.dtype = torch.float32,
    *,
    n: int = 8192,
    trials: int = 5,
    min_seconds: float = 0.3,
    clock: str = "cpu",
) -> dict[str, float]:
    """Bytes of matrix this CPU streams per second through a matrix-vector product (``[1, n] @ [n, n]`` in
    ``dtype``: the shape of a batch-1 decode step, bound by memory, not arithmetic), timed per CPU-second of this
    process (``clock="cpu"``) or wall second: ``{"best", "median", "n"}`` in bytes per second. The matrix
    (n = 8192: 256 MiB in fp32) is far larger than any cache, so each product reads it from memory."""
    if n < 1 or trials < 1:
        raise ValueError(f"matvec_bandwidth: need n >= 1 and trials >= 1, got n={n}, trials={trials}")
    if clock not in ("wall", "cpu"):
        raise ValueError(f"matvec_bandwidth: clock must be 'wall' or 'cpu', got {clock!r}")
    now = time.perf_counter if clock == "wall" else time.process_time
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(n, n, generator=gen).to(dtype)
    x = torch.randn(1, n, generator=gen).to(dtype)
    out = torch.empty(1, n, dtype=dtype)
    torch.matmul(x, w, out=out)
    size = w.numel() * w.element_size()
    rates = [
        size / t
        for t in seconds_per_call(
            lambda: torch.matmul(x, w, out=out), trials=trials, min_seconds=min_seconds, now=now
        )
    ]
    return {"best": max(rates), "median": statistics.median(rates), "n": float(n)}


def weight_stream_bound(
    baseline_cpu_seconds: float, steps: int, bytes_per_step: float, bytes_per_cpu_second: float
) -> dict[str, float]:
    """The other floor of a rollout's CPU seconds: its episodes sample token after token, so it needs at least
    ``steps`` forwards one after another (the longest episode's sampled tokens), and each forward reads all the
    weights (``bytes_per_step``) whatever its batch. At the measured streaming rate that takes ``min_cpu_seconds``;
    ``max_speedup`` over ``baseline_cpu_seconds`` follows."""
    if bytes_per_cpu_second <= 0:
        raise ValueError(f"weight_stream_bound: bandwidth must be positive, got {bytes_per_cpu_second}")
    seconds = float(steps) * float(bytes_per_step) / bytes_per_cpu_second
    return {
        "min_cpu_seconds": seconds,
        "max_speedup": baseline_cpu_seconds / seconds if seconds > 0 else float("inf"),
    }


def layer_shapes(shape: DecoderShape) -> list[tuple[int, int]]:
    """``(in, out)`` of each linear layer of one decoder layer: q, k, v, o, gate, up, down."""
    q, kv = shape.heads * shape.dim, shape.kv_heads * shape.dim
    h, i = shape.hidden, shape.intermediate
    return [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]


def linear_seconds(
    shapes: list[tuple[int, int]], rows: int, *, trials: int = 3, min_seconds: float = 0.1
) -> float:
    """CPU seconds (``time.process_time``) of ``F.linear`` on ``rows`` rows through each fp32 ``(in, out)`` weight of
    ``shapes`` once, best of ``trials``: what one forward of ``rows`` positions costs in these products."""
    if rows < 1:
        raise ValueError(f"linear_seconds: need rows >= 1, got {rows}")
    gen = torch.Generator().manual_seed(0)
    total = 0.0
    for k, n in shapes:
        w = torch.randn(n, k, generator=gen)
        x = torch.randn(rows, k, generator=gen)
        torch.nn.functional.linear(x, w)
        total += min(
            seconds_per_call(
                lambda x=x, w=w: torch.nn.functional.linear(x, w),
                trials=trials,
                min_seconds=min_seconds,
                now=time.process_time,
            )
        )
    return total


def streamed_weights(shape: DecoderShape, *, seed: int = 0) -> list[torch.Tensor]:
    """A decoder's distinct fp32 linear weights in the order a forward reads them, as ``nn.Linear`` stores them
    (``[out, in]``): every layer's q, k, v, o, gate, up, down (:func:`layer_shapes`), then the LM head
    (``[vocab, hidden]``). Random values, the model's sizes: ``weight_bytes_per_forward(shape, 4)`` bytes in all
    (513 MiB for SmolLM2-135M)."""
    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(n, k, generator=gen) for _ in range(shape.layers) for k, n in layer_shapes(shape)]
    weights.append(torch.randn(shape.vocab, shape.hidden, generator=gen))
    return weights


def streamed_linear_seconds(
    shape: DecoderShape,
    rows: int,
    *,
    passes: int = 5,
    weights: list[torch.Tensor] | None = None,
    linear: Callable[[torch.Tensor, torch.Tensor], object] = torch.nn.functional.linear,
) -> dict[str, float]:
    """CPU seconds (``time.process_time``) of one forward's products on ``rows`` rows with the weights streamed as in
    a decode step: ``linear(x[rows, in], w)`` once through each of ``weights`` (default :func:`streamed_weights`:
    every layer's own seven weights, then the LM head), in that order, pass after pass. Each weight is read once a
    pass, so it comes from memory, not from a cache it stayed hot in (:func:`linear_seconds` repeats one weight,
    which the last-level cache then holds whole, as a forward through all the weights does not). The best of
    ``passes`` passes (after one warm-up pass): ``{"layers", "head"}``, the seconds of all ``shape.layers``
    layers' products and of the LM head's."""
    if rows < 1 or passes < 1:
        raise ValueError(f"streamed_linear_seconds: need rows >= 1 and passes >= 1, got {rows}, {passes}")
    if weights is None:
        weights = streamed_weights(shape)
    if len(weights) != 7 * shape.layers + 1:
        raise ValueError(
            f"streamed_linear_seconds: need {7 * shape.layers + 1} weights (7 per layer + the LM head), "
            f"got {len(weights)}"
        )
    gen = torch.Generator().manual_seed(0)
    xs = {k: torch.randn(rows, k, generator=gen) for k in {int(w.shape[1]) for w in weights}}
    *body, head = weights

    def one_pass() -> tuple[float, float]:
        start = time.process_time()
        for w in body:
            linear(xs[int(w.shape[1])], w)
        mid = time.process_time()
        linear(xs[int(head.shape[1])], head)
        return mid - start, time.process_time() - mid

    one_pass()
    times = [one_pass() for _ in range(passes)]
    return {"layers": min(t[0] for t in times), "head": min(t[1] for t in times)}


def decode_attention_seconds(
    shape: DecoderShape,
    rows: int,
    context: int,
    *,
    passes: int = 5,
    attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object] | None = None,
) -> float:
    """CPU seconds (``time.process_time``) of one decode step's attention on ``rows`` rows, each one new query
    against ``context`` cached positions: ``scaled_dot_product_attention`` (``attend``, with grouped-query heads)
    once through each layer's own key/value cache (``[rows, kv_heads, context, dim]`` each), in a forward's order,
    so each layer's cache comes from memory as in a step. ``rows x context`` query-key pairs per layer; the best
    of ``passes`` passes after one warm-up pass."""
    if rows < 1 or context < 1 or passes < 1:
        raise ValueError(
            f"decode_attention_seconds: need rows, context, passes >= 1, got {rows}, {context}, {passes}"
        )
    if attend is None:

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(rows, shape.heads, 1, shape.dim, generator=gen)
    caches = [
        (
            torch.randn(rows, shape.kv_heads, context, shape.dim, generator=gen),
            torch.randn(rows, shape.kv_heads, context, shape.dim, generator=gen),
        )
        for _ in range(shape.layers)
    ]

    def one_pass() -> float:
        start = time.process_time()
        for k, v in caches:
            attend(q, k, v)
        return time.process_time() - start

    one_pass()
    return min(one_pass() for _ in range(passes))


def kernel_floor(
    baseline_cpu_seconds: float,
    *,
    sampled_positions: int,
    logit_rows: int,
    other_flops: float,
    layer_seconds_per_row: float,
    layers: int,
    head_seconds_per_row: float,
    peak_flops_per_cpu_second: float,
    decode_attention_pairs: int = 0,
    attention_seconds_per_pair: float = 0.0,
) -> dict[str, float]:
    """A floor for an engine built on this CPU's fp32 products at a given decode batch: the sampled tokens fed back
    pass every layer's products at the measured cost per row of that batch (``layer_seconds_per_row`` for one
    layer), each logit row the LM head's (``head_seconds_per_row``), the sampled tokens' query-key pairs
    (``decode_attention_pairs``) cost ``attention_seconds_per_pair`` each through all layers (0: counted in
    ``other_flops`` instead), and the rest of the work (prompts, observations, attention: ``other_flops``) runs at
    the peak. ``{"min_cpu_seconds", "max_speedup", "decode_seconds", "head_seconds", "attention_seconds",
    "other_seconds"}``."""
    if peak_flops_per_cpu_second <= 0:
        raise ValueError(f"kernel_floor: peak must be positive, got {peak_flops_per_cpu_second}")
    decode = sampled_positions * layers * layer_seconds_per_row
    head = logit_rows * head_seconds_per_row
    attention = decode_attention_pairs * attention_seconds_per_pair
    other = other_flops / peak_flops_per_cpu_second
    seconds = decode + head + attention + other
    return {
        "min_cpu_seconds": seconds,
        "max_speedup": baseline_cpu_seconds / seconds if seconds > 0 else float("inf"),
        "decode_seconds": decode,
        "head_seconds": head,
        "attention_seconds": attention,
        "other_seconds": other,
    }
