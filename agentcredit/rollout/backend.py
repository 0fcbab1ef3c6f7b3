"""Policy backends for the rollout engine: the interface, and a PyTorch / Hugging Face backend.

The engine (``engine.py``) thinks in *sequences*: token contexts it can extend, copy, truncate and drop. A
backend owns their key/value caches and runs the model:

* :meth:`Backend.extend` feeds new tokens to any subset of sequences (a one-token decode step, an observation
  prefill, a prompt) and returns the next-token logits of each;
* :meth:`Backend.fork` copies a sequence (a tree branch reuses the whole prefix: nothing is recomputed);
* :meth:`Backend.truncate` forgets the tail of a sequence (carl-segment's replacement: back to the end of the
  invoke segment, then the ``<context>`` extraction is fed again at its new place);
* :meth:`Backend.export_block` / :meth:`Backend.sequence_from_blocks` copy the cache entries of a token span
  out and back in, so an entropy-guided fork can start from any old state of the tree.

How :class:`HFBackend` lays out its cache (written by hand: Hugging Face's caches hold one common length for
the whole batch and no per-row offsets, and its continuous-batching cache has no fork or truncate):

* One slab per layer, ``[rows, kv_heads, width, head_dim]`` for keys and for values, preallocated and grown
  geometrically (no ``torch.cat`` per step). Row r holds its sequence's tokens at columns ``0..len_r-1``
  with no holes, so a token's column is also its position id (RoPE is applied before caching, so a column
  copied to another row keeps its meaning).
* A forward step feeds ``n_r`` tokens to each participating row, right-aligned in a ``[batch, q]`` input
  (``q = max n_r``) so that the last real token of every row sits at index ``q - 1`` and ``logits_to_keep=1``
  returns exactly the logits needed. Real token k of row r is written to column ``len_r + k``; the left
  padding of a short row is written to scratch columns ``len_r + n_r ..`` past its end (overwritten later).
  A 4-D additive mask lets a real token see the columns up to its own and a padding token only itself, so
  no row ever attends to another row's padding and no softmax row is empty.
* Decode steps that involve most rows run over the whole slab as a view (rows with nothing to feed get one
  masked dummy token); smaller groups gather their rows' cache (a copy) for the step. Prefill groups are
  run separately from decode groups so one long observation never pads every decoding row to its length.
* Released rows are filled by moving the last row into their slot, so live rows stay contiguous.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

try:  # the Cache base class the model's attention layers call ``update`` on
    from transformers.cache_utils import Cache
except ImportError as exc:  # pragma: no cover - transformers is a hard dependency
    raise ImportError("agentcredit.rollout.backend needs transformers (the Cache API)") from exc


@dataclass
class BackendStats:
    """What a backend computed: forward calls, tokens fed (real), and tokens computed (real + padding).

    ``decode_*`` count the steps that fed one token to every participating sequence (decoding), apart from the
    prefills (prompts, observations, forks), so a benchmark can set each kind of step against its own ceiling.
    """

    forward_calls: int = 0
    tokens_fed: int = 0
    tokens_computed: int = 0
    forward_seconds: float = 0.0
    decode_steps: int = 0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    rows_copied: int = 0
    # what the forwards computed, for a FLOP count (agentcredit.lab.bench.flops.rollout_flops): rows whose logits
    # were computed (one per row per forward: ``logits_to_keep=1``), query-key pairs the attention computed
    # (every fed position, padding included, against the step's whole width: the mask hides, it does not skip)
    # and those a real token needs (its own context length)
    rows_computed: int = 0
    attention_pairs_computed: int = 0
    attention_pairs_real: int = 0
    # CPU seconds of this process spent in the forwards (``time.process_time``; on a loaded machine the wall
    # seconds above also hold the time spent waiting for a core)
    forward_cpu_seconds: float = 0.0
    decode_cpu_seconds: float = 0.0
    # the one-token steps' share of tokens_computed (one per row, idle rows included) and attention_pairs_computed
    decode_tokens_computed: int = 0
    decode_attention_pairs_computed: int = 0
    extra: dict[str, float] = field(default_factory=dict)


class Backend(ABC):
    """A policy that extends, copies and truncates token sequences held in its own KV cache."""

    stats: BackendStats

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @property
    @abstractmethod
    def max_positions(self) -> int:
        """Longest context the model supports (position ids must stay below this)."""

    @abstractmethod
    def new_sequence(self) -> int:
        """An empty sequence; returns its id."""

    def reserve(self, sequences: int) -> None:  # noqa: B027 - optional hint, no-op by default
        """Capacity hint: about ``sequences`` sequences will be held at once (a backend may allocate for them now)."""

    @abstractmethod
    def extend(self, feeds: Mapping[int, Sequence[int]]) -> dict[int, torch.Tensor]:
        """Append ``feeds[seq]`` (non-empty) to each sequence; return each one's next-token logits (float32 [V])."""

    @abstractmethod
    def fork(self, seq: int) -> int:
        """A copy of ``seq`` (same tokens, same cache); returns the new id."""

    @abstractmethod
    def truncate(self, seq: int, length: int) -> None:
        """Keep only the first ``length`` tokens of ``seq``."""

    @abstractmethod
    def length(self, seq: int) -> int: ...

    @abstractmethod
    def release(self, seq: int) -> None:
        """Forget ``seq`` and free its cache."""

    @abstractmethod
    def export_block(self, seq: int, start: int, end: int) -> Any:
        """A copy of the cache entries of tokens ``start..end-1`` of ``seq`` (see :meth:`sequence_from_blocks`)."""

    @abstractmethod
    def sequence_from_blocks(self, blocks: Sequence[Any]) -> int:
        """A new sequence whose cache is the concatenation of exported blocks (positions must be contiguous)."""


class _SlabCache(Cache):
    """The object handed to the model as ``past_key_values``: each attention layer writes and reads the slab."""

    def __init__(self, slab: _KVSlab):
        try:
            super().__init__(layers=[])  # transformers >= 5: a Cache is a list of layer caches; we have none
        except TypeError:  # older transformers: Cache() takes no arguments
            super().__init__()
        self._slab = slab

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):  # noqa: D102 - HF signature
        # Extra arguments differ across transformers releases (``cache_kwargs`` before 5.2x, ``kwargs=`` in
        # 5.24); the slab needs none of them, so accept whatever the attention layer passes.
        return self._slab.write_and_read(layer_idx, key_states, value_states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        # Only used by models when no position_ids are given; the backend always passes them.
        return 0


class _KVSlab:
    """Per-layer key/value slabs ``[rows, kv_heads, width, head_dim]`` and each row's length."""

    def __init__(self, n_layers: int):
        self.n_layers = n_layers
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers
        self.lengths: list[int] = []
        self.row_cap = 8
        self.width_cap = 256
        # set by HFBackend before each forward
        self.step_rows: torch.Tensor | None = None  # None: rows 0..batch-1 as a view
        self.step_batch = 0
        self.step_cols: torch.Tensor | None = None  # [batch, q] column of each fed token
        self.step_width = 0

    @property
    def n_rows(self) -> int:
        return len(self.lengths)

    def allocated(self) -> bool:
        return self.keys[0] is not None

    def _resize(self, rows: int, width: int) -> None:
        for store in (self.keys, self.values):
            for layer, old in enumerate(store):
                if old is None:
                    continue
                new = old.new_zeros((rows, old.shape[1], width, old.shape[3]))
                n, w = min(self.n_rows, old.shape[0]), min(old.shape[2], width)
                new[:n, :, :w] = old[:n, :, :w]
                store[layer] = new
        self.row_cap, self.width_cap = rows, width

    def ensure(self, rows: int, width: int) -> None:
        """Capacity for ``rows`` rows and ``width`` columns (grown by 1.5x, width rounded up to 64)."""
        if rows <= self.row_cap and width <= self.width_cap:
            return
        new_rows = self.row_cap if rows <= self.row_cap else max(rows, int(self.row_cap * 1.5) + 1)
        new_width = self.width_cap
        if width > self.width_cap:
            new_width = max(width, int(self.width_cap * 1.5))
            new_width = (new_width + 63) // 64 * 64
        self._resize(new_rows, new_width)

    def write_and_read(self, layer: int, key: torch.Tensor, value: torch.Tensor):
        if self.keys[layer] is None:
            shape = (self.row_cap, key.shape[1], self.width_cap, key.shape[3])
            self.keys[layer] = key.new_zeros(shape)
            self.values[layer] = value.new_zeros(shape)
        kslab, vslab = self.keys[layer], self.values[layer]
        cols = self.step_cols
        rows = self.step_rows
        row_index = (
            torch.arange(self.step_batch, device=key.device) if rows is None else rows.to(key.device)
        ).unsqueeze(1)
        # slab[r, :, c] with r [B, 1] and c [B, q] indexes as [B, q, kv_heads, head_dim]
        kslab[row_index, :, cols] = key.transpose(1, 2)
        vslab[row_index, :, cols] = value.transpose(1, 2)
        width = self.step_width
        if rows is None:
            return kslab[: self.step_batch, :, :width], vslab[: self.step_batch, :, :width]
        return kslab[:, :, :width].index_select(0, rows), vslab[:, :, :width].index_select(0, rows)

    def copy_row(self, src: int, dst: int, length: int) -> None:
        if length == 0 or not self.allocated():
            return
        for store in (self.keys, self.values):
            for slab in store:
                slab[dst, :, :length] = slab[src, :, :length]

    def export(self, row: int, start: int, end: int) -> torch.Tensor:
        """``[layers, 2, kv_heads, end - start, head_dim]`` copy of one row's columns."""
        return torch.stack(
            [
                torch.stack((k[row, :, start:end], v[row, :, start:end]))
                for k, v in zip(self.keys, self.values, strict=True)
            ]
        ).clone()

    def load(self, row: int, block: torch.Tensor, start: int) -> None:
        n = block.shape[3]
        for layer in range(self.n_layers):
            self.keys[layer][row, :, start : start + n] = block[layer, 0]
            self.values[layer][row, :, start : start + n] = block[layer, 1]


class HFBackend(Backend):
    """A Hugging Face causal LM behind the :class:`Backend` interface (CPU or one GPU), with its own KV slab.

    Args:
        model: a ``*ForCausalLM`` whose attention layers call ``past_key_values.update`` (Llama, Qwen2,
            Mistral, SmolLM2, ... with the ``sdpa`` or ``eager`` attention implementation) and whose forward
            accepts ``logits_to_keep``. Sliding-window / hybrid-attention models are refused.
        dense_fraction: a decode step runs over the whole slab (as a view, with masked dummy tokens for idle
            rows) when at least this fraction of the rows decode; otherwise their cache rows are gathered.
        pad_token_id: id fed as padding (any valid id: padding is masked).
    """

    def __init__(self, model: Any, *, dense_fraction: float = 0.5, pad_token_id: int = 0):
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
            raise ValueError(
                f"HFBackend: {type(model).__name__} uses sliding-window attention (config.sliding_window="
                f"{config.sliding_window}); the KV slab assumes full attention in every layer"
            )
        layer_types = getattr(config, "layer_types", None)
        if layer_types and any(t != "full_attention" for t in layer_types):
            raise ValueError(
                f"HFBackend: mixed attention layer types {sorted(set(layer_types))} are not supported"
            )
        self.model = model
        self.config = config
        self.dense_fraction = dense_fraction
        self.pad_token_id = pad_token_id
        self.slab = _KVSlab(config.num_hidden_layers)
        self._cache = _SlabCache(self.slab)
        self._row_of: dict[int, int] = {}
        self._seq_at: list[int] = []
        self._next_id = 0
        self.stats = BackendStats()
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        # transformers 5.2x renamed the forward's ``past_key_values`` to ``cache`` (the old name warns and goes in
        # 5.40); older releases only know ``past_key_values``
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wraps the forward
        takes_cache = "cache" in inspect.signature(base.forward).parameters
        self._cache_arg = "cache" if takes_cache else "past_key_values"

    # ------------------------------------------------------------------ properties
    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def max_positions(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 1 << 30))

    @property
    def n_sequences(self) -> int:
        return self.slab.n_rows

    def length(self, seq: int) -> int:
        return self.slab.lengths[self._row(seq)]

    def _row(self, seq: int) -> int:
        try:
            return self._row_of[seq]
        except KeyError:
            raise ValueError(
                f"HFBackend: sequence {seq} does not exist (released or never created)"
            ) from None

    # ------------------------------------------------------------------ sequence management
    def reserve(self, sequences: int) -> None:
        # Rows for every sequence the engine admitted, in one allocation: growing the slab one sequence at a time
        # reallocated and copied it 5 times on the way to 64 rows (8.8 of 112 s in a profiled rollout, mostly
        # first-touch page faults of the new slabs). Before the first forward this only sets the capacity.
        self.slab.ensure(sequences, self.slab.width_cap)

    def new_sequence(self) -> int:
        row = self.slab.n_rows
        self.slab.ensure(row + 1, 1)
        self.slab.lengths.append(0)
        seq = self._next_id
        self._next_id += 1
        self._row_of[seq] = row
        self._seq_at.append(seq)
        return seq

    def fork(self, seq: int) -> int:
        src = self._row(seq)
        new = self.new_sequence()
        dst = self._row_of[new]
        length = self.slab.lengths[src]
        self.slab.copy_row(src, dst, length)
        self.slab.lengths[dst] = length
        self.stats.rows_copied += 1
        return new

    def truncate(self, seq: int, length: int) -> None:
        row = self._row(seq)
        if not 0 <= length <= self.slab.lengths[row]:
            raise ValueError(f"HFBackend.truncate: length {length} outside 0..{self.slab.lengths[row]}")
        self.slab.lengths[row] = length

    def release(self, seq: int) -> None:
        row = self._row(seq)
        last = self.slab.n_rows - 1
        if row != last:
            moved = self._seq_at[last]
            self.slab.copy_row(last, row, self.slab.lengths[last])
            self.slab.lengths[row] = self.slab.lengths[last]
            self._seq_at[row] = moved
            self._row_of[moved] = row
        self.slab.lengths.pop()
        self._seq_at.pop()
        del self._row_of[seq]

    def export_block(self, seq: int, start: int, end: int) -> torch.Tensor:
        row = self._row(seq)
        if not 0 <= start <= end <= self.slab.lengths[row]:
            raise ValueError(
                f"HFBackend.export_block: span {start}..{end} outside 0..{self.slab.lengths[row]}"
            )
        if not self.slab.allocated():
            raise ValueError("HFBackend.export_block: nothing has been computed yet")
        return self.slab.export(row, start, end)

    def sequence_from_blocks(self, blocks: Sequence[torch.Tensor]) -> int:
        seq = self.new_sequence()
        row = self._row_of[seq]
        total = sum(int(b.shape[3]) for b in blocks)
        self.slab.ensure(self.slab.n_rows, total + 1)
        start = 0
        for block in blocks:
            self.slab.load(row, block, start)
            start += int(block.shape[3])
        self.slab.lengths[row] = total
        return seq

    # ------------------------------------------------------------------ forward
    def extend(self, feeds: Mapping[int, Sequence[int]]) -> dict[int, torch.Tensor]:
        for seq, tokens in feeds.items():
            self._row(seq)  # raises for an unknown sequence
            if len(tokens) == 0:
                raise ValueError(f"HFBackend.extend: sequence {seq} was fed no tokens; feed at least one")
        decode = {s: list(t) for s, t in feeds.items() if len(t) == 1}
        prefill = {s: list(t) for s, t in feeds.items() if len(t) > 1}
        out: dict[int, torch.Tensor] = {}
        if prefill:
            out.update(self._step(prefill, dense=False))
        if decode:
            dense = len(decode) >= self.dense_fraction * self.slab.n_rows
            out.update(self._step(decode, dense=dense))
        return out

    @torch.no_grad()  # not inference_mode: the slab is also written by row copies outside the forward
    def _step(self, feeds: dict[int, list[int]], *, dense: bool) -> dict[int, torch.Tensor]:
        import time

        start_time, start_cpu = time.perf_counter(), time.process_time()
        slab = self.slab
        if dense:
            rows = list(range(slab.n_rows))
            tokens = [feeds.get(self._seq_at[r], []) for r in rows]
        else:
            seqs = list(feeds)
            rows = [self._row(s) for s in seqs]
            tokens = [feeds[s] for s in seqs]
        batch, q = len(rows), max(len(t) for t in tokens)
        lengths = torch.tensor([slab.lengths[r] for r in rows], dtype=torch.long)
        n_real = torch.tensor([len(t) for t in tokens], dtype=torch.long)
        width = int((lengths + q).max())
        if width > self.max_positions:
            raise ValueError(
                f"HFBackend: a sequence would reach {width} tokens > max_positions {self.max_positions}"
            )
        slab.ensure(slab.n_rows, width)

        ids = torch.full((batch, q), self.pad_token_id, dtype=torch.long)
        for b, toks in enumerate(tokens):
            if toks:
                ids[b, q - len(toks) :] = torch.tensor(toks, dtype=torch.long)
        i = torch.arange(q)
        n_pad = (q - n_real).unsqueeze(1)
        real = i.unsqueeze(0) >= n_pad  # [B, q]
        cols = torch.where(
            real, lengths.unsqueeze(1) + i - n_pad, lengths.unsqueeze(1) + n_real.unsqueeze(1) + i
        )
        j = torch.arange(width)
        visible = torch.where(
            real.unsqueeze(-1), j.view(1, 1, -1) <= cols.unsqueeze(-1), j.view(1, 1, -1) == cols.unsqueeze(-1)
        )
        mask = torch.zeros(visible.shape, dtype=self.dtype).masked_fill_(
            ~visible, torch.finfo(self.dtype).min
        )

        slab.step_rows = None if dense else torch.tensor(rows, dtype=torch.long, device=self.device)
        slab.step_batch = batch
        slab.step_cols = cols.to(self.device)
        slab.step_width = width
        output = self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask.unsqueeze(1).to(self.device),
            position_ids=cols.to(self.device),
            **{self._cache_arg: self._cache},
            use_cache=True,
            logits_to_keep=1,
        )
        logits = output.logits[:, -1, :].float()
        for b, r in enumerate(rows):
            slab.lengths[r] += len(tokens[b])
        self.stats.forward_calls += 1
        self.stats.tokens_fed += int(n_real.sum())
        self.stats.tokens_computed += batch * q
        self.stats.rows_computed += batch
        self.stats.attention_pairs_computed += batch * q * width
        # real token k of a row sits at column lengths + k and attends to columns 0..lengths + k
        self.stats.attention_pairs_real += int((n_real * (lengths + 1) + n_real * (n_real - 1) // 2).sum())
        seconds = time.perf_counter() - start_time
        cpu = time.process_time() - start_cpu
        self.stats.forward_seconds += seconds
        self.stats.forward_cpu_seconds += cpu
        if q == 1:
            self.stats.decode_steps += 1
            self.stats.decode_tokens += int(n_real.sum())
            self.stats.decode_seconds += seconds
            self.stats.decode_cpu_seconds += cpu
            self.stats.decode_tokens_computed += batch
            self.stats.decode_attention_pairs_computed += batch * width
        return {self._seq_at[r]: logits[b] for b, r in enumerate(rows) if tokens[b]}


# ---------------------------------------------------------------------------------------------------------------
# Backends that generate whole segments (vLLM): the engine's one other kind of backend


@dataclass(frozen=True)
class SegmentRequest:
    """Generate one policy segment (or the rest of one) after ``prompt``, the sequence's full token prefix.

    ``max_tokens``: the segment's remaining budget (already capped by the context limit); ``stop``: the protocol's
    candidate stop strings (:meth:`~agentcredit.protocols.base.Protocol.stop_strings`; the engine confirms each
    hit with ``segment_ends``); ``seed``: the request's own seed, so a sampled segment does not depend on the
    other requests it is batched with.
    """

    prompt: list[int]
    max_tokens: int
    stop: tuple[str, ...] = ()
    seed: int = 0


@dataclass
class SegmentOutput:
    """The tokens a :class:`SegmentRequest` produced and the behaviour log-prob of each (the engine's convention,
    :mod:`agentcredit.rollout.sampling`: log softmax(logits / temperature) before top-k / top-p)."""

    token_ids: list[int]
    logprobs: list[float]


class SegmentBackend(Backend):
    """A backend that samples whole segments itself (an inference server such as vLLM) instead of returning
    next-token logits: the engine keeps protocols, tools, trees and budgets, and asks :meth:`generate` for the
    tokens of each policy segment (:meth:`RolloutEngine._generate <agentcredit.rollout.engine.RolloutEngine>`).

    Its sequences are token lists (the server keeps the KV cache and reuses prefixes through its own prefix
    cache): :meth:`extend` appends and returns no logits, :meth:`fork` copies the list, an exported block is a
    token span. No per-token entropy is available, so segments it generates record ``entropies=None``.
    """

    def __init__(self) -> None:
        self._tokens: dict[int, list[int]] = {}
        self._next_id = 0
        self.stats = BackendStats()

    @abstractmethod
    def generate(
        self, requests: Sequence[SegmentRequest], sampling: Any, stop_token_ids: Sequence[int]
    ) -> list[SegmentOutput]:
        """One :class:`SegmentOutput` per request (at least one token each), sampled with ``sampling`` (a
        :class:`~agentcredit.rollout.sampling.SamplingParams`), each stopping at a ``stop_token_ids`` token (kept
        as its last token), a stop string (kept), or ``max_tokens``."""

    def tokens(self, seq: int) -> list[int]:
        return list(self._seq(seq))

    def _seq(self, seq: int) -> list[int]:
        try:
            return self._tokens[seq]
        except KeyError:
            raise ValueError(
                f"{type(self).__name__}: sequence {seq} does not exist (released or never created)"
            ) from None

    def new_sequence(self) -> int:
        seq, self._next_id = self._next_id, self._next_id + 1
        self._tokens[seq] = []
        return seq

    def extend(self, feeds: Mapping[int, Sequence[int]]) -> dict[int, torch.Tensor]:
        for seq, tokens in feeds.items():
            if len(tokens) == 0:
                raise ValueError(f"{type(self).__name__}.extend: sequence {seq} was fed no tokens")
            self._seq(seq).extend(int(t) for t in tokens)
        return {}

    def fork(self, seq: int) -> int:
        new = self.new_sequence()
        self._tokens[new] = list(self._seq(seq))
        return new

    def truncate(self, seq: int, length: int) -> None:
        tokens = self._seq(seq)
        if not 0 <= length <= len(tokens):
            raise ValueError(f"{type(self).__name__}.truncate: length {length} outside 0..{len(tokens)}")
        del tokens[length:]

    def length(self, seq: int) -> int:
        return len(self._seq(seq))

    def release(self, seq: int) -> None:
        self._seq(seq)
        del self._tokens[seq]

    def export_block(self, seq: int, start: int, end: int) -> list[int]:
        tokens = self._seq(seq)
        if not 0 <= start <= end <= len(tokens):
            raise ValueError(
                f"{type(self).__name__}.export_block: span {start}..{end} outside 0..{len(tokens)}"
            )
        return tokens[start:end]

    def sequence_from_blocks(self, blocks: Sequence[Any]) -> int:
        seq = self.new_sequence()
        for block in blocks:
            self._tokens[seq].extend(block)
        return seq
