"""Token sampling with the behaviour log-prob and entropy of every sampled token.

Which distribution is recorded (the same convention as verl, whose trainer recomputes exactly this):

* ``logprob`` = log softmax(logits / temperature)[token], and ``entropy`` = the Shannon entropy of
  softmax(logits / temperature), both taken **before** top-k / top-p truncation. Truncation only decides which
  tokens can be drawn; the trainer's teacher-forced forward pass (logits / temperature, no truncation) then
  reproduces the recorded numbers, so the PPO ratio is 1 at the first epoch up to numerics.
* Greedy decoding (``temperature == 0``) picks the argmax and records the temperature-1 distribution.

Sampling uses one uniform number per row, drawn from that row's own ``torch.Generator``, and inverts the
(truncated) CDF. So a row's tokens depend only on its own seed and logits, never on which other rows share
the batch: the same seed gives the same rollout however episodes are batched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn. Defaults are the papers' training settings (temperature 1, no truncation).

    Attributes:
        temperature: softmax temperature; 0 means greedy (argmax).
        top_p: nucleus sampling mass in (0, 1]; 1 disables it.
        top_k: keep the k most likely tokens; 0 disables it.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0 and self.temperature == self.temperature):
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be >= 0 (0 = off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def recorded_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax of the distribution whose log-probs and entropies are recorded (see module docstring)."""
    scale = 1.0 if temperature == 0.0 else temperature
    return torch.log_softmax(logits.float() / scale, dim=-1)


#: Top-p first looks at this many most likely tokens per row (a partial top-k, much cheaper than sorting the
#: vocabulary); rows whose nucleus is wider than that are sorted in full, so the result is exact either way.
_NUCLEUS_PROBE = 256


def _nucleus(values: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the probabilities (sorted descending) outside the smallest prefix whose mass reaches ``top_p``.

    A token is dropped when the mass before it already reaches ``top_p``; the most likely token is always kept.
    """
    probs = values.exp()
    before = torch.cumsum(probs, dim=-1) - probs
    return probs.masked_fill(before >= top_p, 0.0)


def _truncate(
    logprobs: torch.Tensor, probs: torch.Tensor, top_k: int, top_p: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Probabilities of the drawable tokens, and the vocabulary ids they belong to (None = all, in order).
    ``probs`` is ``logprobs.exp()``, already computed for the entropy."""
    vocab = logprobs.shape[-1]
    if top_k == 0 and top_p >= 1.0:
        return probs, None
    if top_p >= 1.0:
        values, ids = torch.topk(logprobs, min(top_k, vocab), dim=-1)
        return values.exp(), ids
    width = min(top_k or vocab, vocab)
    probe = min(width, _NUCLEUS_PROBE)
    values, ids = torch.topk(logprobs, probe, dim=-1)  # sorted, most likely first
    covered = values.exp().sum(dim=-1) >= top_p
    if probe == width or bool(covered.all()):
        return _nucleus(values, top_p), ids
    # some nucleus is wider than the probe: sort those rows fully (up to top_k)
    wide_values, wide_ids = torch.sort(logprobs[~covered], dim=-1, descending=True)
    wide_values, wide_ids = wide_values[:, :width], wide_ids[:, :width]
    probs = torch.zeros((logprobs.shape[0], width), dtype=logprobs.dtype, device=logprobs.device)
    out_ids = torch.zeros((logprobs.shape[0], width), dtype=torch.long, device=logprobs.device)
    probs[covered, :probe], out_ids[covered, :probe] = _nucleus(values[covered], top_p), ids[covered]
    probs[~covered], out_ids[~covered] = _nucleus(wide_values, top_p), wide_ids
    return probs, out_ids


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draw one token per row of ``logits`` ([rows, vocab]).

    ``uniforms`` ([rows], values in [0, 1)) drive the draw by CDF inversion; required unless greedy.
    Returns ``(tokens, logprobs, entropies)`` as int64 / float32 / float32 tensors of shape [rows], with the
    log-prob and entropy of the recorded distribution defined in the module docstring.
    """
    if logits.ndim != 2:
        raise ValueError(f"sample_tokens: logits must be [rows, vocab], got shape {tuple(logits.shape)}")
    logprobs = recorded_logprobs(logits, params.temperature)
    probs = logprobs.exp()  # once: the entropy and the untruncated draw both read it
    entropies = -(probs * logprobs).sum(dim=-1)
    if params.greedy:
        tokens = torch.argmax(logits, dim=-1)
    else:
        if uniforms is None or uniforms.shape != (logits.shape[0],):
            raise ValueError("sample_tokens: pass one uniform number per row when sampling (temperature > 0)")
        probs, ids = _truncate(logprobs, probs, params.top_k, params.top_p)
        cdf = torch.cumsum(probs.double(), dim=-1)  # float64: no drift over a 50k-token vocabulary
        # the uniforms come from the episodes' CPU generators (the same draws on every device)
        target = (uniforms.to(cdf.device).double().clamp(0.0, 1.0) * cdf[:, -1]).unsqueeze(-1)
        index = torch.searchsorted(cdf, target, right=True).squeeze(-1)
        # u < 1, so the index is past the end only through float rounding; stay on a drawable token then.
        last_drawable = (probs > 0).sum(dim=-1) - 1 if ids is not None else cdf.shape[-1] - 1
        index = torch.minimum(index, torch.as_tensor(last_drawable, device=index.device))
        tokens = index if ids is None else ids.gather(-1, index.unsqueeze(-1)).squeeze(-1)
    chosen = logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens, chosen, entropies


def draw_uniforms(generators: Sequence[torch.Generator]) -> torch.Tensor:
    """One uniform number in [0, 1) per generator (one generator per episode), as a float64 tensor."""
    return torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in generators])
