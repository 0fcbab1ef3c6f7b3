"""Teacher-forced scoring: log-probs, entropies and values of chosen token positions in one forward pass.

The LM head is applied only where a log-prob is wanted (policy tokens), never to the prompt or tool observations,
and in chunks, so a batch never materialises a full ``[B, T, vocab]`` logits tensor (49k vocab x 1k tokens x 4 bytes
= 200 MB per sequence); under autograd each chunk is checkpointed, so backward keeps no vocab-sized tensor either.
Values are read from the same hidden states.

Alignment convention used everywhere in agentcredit: ``logprobs[b, t]`` is log pi(token t | tokens < t), and
``values[b, t]`` is V of the state *before* token t (the hidden state at position t - 1). So the value of a segment
boundary b_k (carl-segment: the last token of the context the segment was generated from) is ``values`` at the
segment's first token.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from agentcredit.models.device import model_device
from agentcredit.models.packing import pack_shared_prefixes, packable, padded_chunks, shared_prefix_chunks


@dataclass
class TokenScores:
    logprobs: torch.Tensor  # [B, T] float32, 0 where not requested
    entropies: torch.Tensor | None  # [B, T] float32, 0 where not requested
    values: torch.Tensor | None  # [B, T] float32, 0 where not requested
    forwarded: int = 0  # positions fed to the decoder (padding included; each shared prefix once when packed)


def _decoder_and_head(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    decoder = model.get_decoder()
    head = model.get_output_embeddings()
    if decoder is None or head is None:
        raise ValueError(f"{type(model).__name__} does not expose get_decoder()/get_output_embeddings()")
    return decoder, head


def autocast_context(model: nn.Module, enabled: bool):
    """bf16 autocast on the device type the model's weights live on (``cuda``, ``cpu``, ...), or a no-op.

    The device type must be the model's: ``torch.autocast("cpu")`` around a CUDA model changes nothing.
    """
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(model_device(model).type, dtype=torch.bfloat16)


def hidden_states(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, autocast: bool = False
):
    """Final-layer hidden states ``[B, T, d]`` (after the final norm). Right padding is assumed.

    ``autocast``: run the decoder under bf16 autocast on the model's device type (:func:`autocast_context`).
    The inputs go to the model's device (a no-op where they are already there); so do the hidden states.
    """
    decoder, _ = _decoder_and_head(model)
    device = model_device(model)
    with autocast_context(model, autocast):
        out = decoder(
            input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), use_cache=False
        )
    return out.last_hidden_state


def _shared_hidden_states(model: nn.Module, input_ids, attention_mask, *, autocast: bool):
    """:func:`hidden_states` with the rows packed into one sequence, each shared prefix once and no padding
    (:mod:`agentcredit.models.packing`), and the positions fed; None where the model cannot be packed."""
    implementation = packable(model)
    if implementation is None or input_ids.shape[0] < 2:
        return None
    packed = pack_shared_prefixes(input_ids, attention_mask)
    decoder, _ = _decoder_and_head(model)
    with autocast_context(model, autocast):
        mask = packed.attention_mask(implementation, next(model.parameters()).dtype)
        out = decoder(
            input_ids=packed.input_ids, attention_mask=mask, position_ids=packed.position_ids, use_cache=False
        )
    # [B, T, d]; padding reads position 0 and is never used
    return out.last_hidden_state[0][packed.index], packed.tokens


def _head_scores(
    head: nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    softcap: float | None,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of ``targets`` and (optionally) the entropy under softmax(head(hidden) / temperature), in fp32."""
    logits = head(hidden.to(head.weight.dtype)).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    logp_all = torch.log_softmax(logits / temperature, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return logp, entropy


def score_tokens(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    want: torch.Tensor,
    *,
    value_head: nn.Module | None = None,
    value_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    with_entropy: bool = True,
    autocast: bool = False,
    chunk: int = 256,
    backbone_grad: bool = True,
    share_prefixes: bool = False,
) -> TokenScores:
    """Score the tokens at positions ``want`` (bool ``[B, T]``) under ``model``; optionally values at ``value_mask``.

    Log-probs and entropies are of softmax(logits / temperature) in fp32 — the distribution the rollout engine
    samples from before top-p/top-k truncation, so PPO ratios compare like with like (as verl does).
    Gradients flow when called outside ``torch.no_grad()``; with ``backbone_grad=False`` only into the value head
    (the backbone's forward keeps no graph).

    ``share_prefixes``: pack the rows into one sequence, each prefix several rows share once and no padding (a
    tree attention mask over the rows' token trie, :mod:`agentcredit.models.packing`); the scores equal the
    row-by-row ones up to float rounding, and so do their gradients. Models that cannot be packed
    (:func:`agentcredit.models.packing.packable`) are forwarded as padded rows; :func:`micro_batches` gives
    chunks that fit the token budget either way.
    """
    if input_ids.shape != attention_mask.shape or input_ids.shape != want.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)}, attention_mask {tuple(attention_mask.shape)} and want "
            f"{tuple(want.shape)} must have the same shape"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for scoring, got {temperature}")
    # every tensor follows the model's device (the batch's bookkeeping stays on the host): the scores come back
    # there too, and callers that keep them on the host move them
    device = model_device(model)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    if value_mask is not None:
        value_mask = value_mask.to(device)
    want = want.to(device).bool().clone()
    want[:, 0] = False  # the first token has no prefix inside this sequence
    with torch.set_grad_enabled(backbone_grad and torch.is_grad_enabled()):
        shared = (
            _shared_hidden_states(model, input_ids, attention_mask, autocast=autocast)
            if share_prefixes
            else None
        )
        if shared is None:
            hidden = hidden_states(model, input_ids, attention_mask, autocast=autocast)
            forwarded = input_ids.numel()
        else:
            hidden, forwarded = shared
    _, head = _decoder_and_head(model)
    B, T = input_ids.shape
    logprobs = torch.zeros(B, T, dtype=torch.float32, device=input_ids.device)
    entropies = torch.zeros_like(logprobs) if with_entropy else None

    rows, cols = want.nonzero(as_tuple=True)
    softcap = getattr(getattr(model, "config", None), "final_logit_softcapping", None)
    # Under autograd each chunk is checkpointed: only its hidden rows are kept for backward, and its [chunk, vocab]
    # logits / log-softmax (50 MB each at 256 rows x 49k vocab) are recomputed there, one chunk at a time, instead
    # of every chunk's being held until the whole micro-batch has been backpropagated.
    checkpointed = torch.is_grad_enabled() and hidden.requires_grad
    lp_parts, ent_parts = [], []
    for start in range(0, rows.numel(), chunk):
        r, c = rows[start : start + chunk], cols[start : start + chunk]
        args = (head, hidden[r, c - 1], input_ids[r, c], temperature, softcap, with_entropy)
        if checkpointed:
            lp, ent = checkpoint(_head_scores, *args, use_reentrant=False)
        else:
            lp, ent = _head_scores(*args)
        lp_parts.append(lp)
        if with_entropy:
            ent_parts.append(ent)
    if lp_parts:
        logprobs = logprobs.index_put((rows, cols), torch.cat(lp_parts))
        if with_entropy:
            entropies = entropies.index_put((rows, cols), torch.cat(ent_parts))

    values = None
    if value_head is not None:
        vmask = (value_mask if value_mask is not None else want).bool().clone()
        vmask[:, 0] = False
        vr, vc = vmask.nonzero(as_tuple=True)
        values = torch.zeros(B, T, dtype=torch.float32, device=input_ids.device)
        if vr.numel():
            values = values.index_put((vr, vc), value_head(hidden[vr, vc - 1]).float())
    return TokenScores(logprobs, entropies, values, forwarded)


def micro_batches(model: nn.Module, rows: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
    """Micro-batches of ``rows`` (token lists) for :func:`score_tokens` with ``share_prefixes``, each within
    ``max_tokens`` positions fed to the decoder: distinct tokens where the model packs
    (:func:`agentcredit.models.packing.shared_prefix_chunks`), rows x padded width where it cannot."""
    if packable(model) is not None:
        return shared_prefix_chunks(rows, max_tokens)
    return padded_chunks([len(r) for r in rows], max_tokens)
