"""What a method needs besides rewards, computed once per batch with the pre-update weights (no gradient):

* old log-probs and entropies of every policy token (the trainer recomputes them with its own forward pass, as verl
  does, so PPO ratios never mix the rollout's precision with the trainer's);
* critic values (per token, or at segment boundaries);
* reference log-probs for the KL term;
* the scoring a method's signal providers ask for (:class:`agentcredit.train.providers.RunContext`): log-probs of
  continuations after given contexts (:func:`score_continuations`), and of a batch's own policy tokens after other
  prompts (:func:`logprobs_under_prompts`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import nn

from agentcredit.config import MICRO_BATCH_TOKENS
from agentcredit.models.scoring import micro_batches, score_tokens
from agentcredit.train.batch import TrainBatch, segment_spans


@dataclass
class Signals:
    """Per-batch quantities computed with the pre-update weights (no gradient) that the advantages need beyond the
    batch's own old log-probs, entropies and reference log-probs; produced by the functions below and the signal
    providers (:mod:`agentcredit.train.providers`).

    The built-in signals are fields; any other registered signal (:func:`agentcredit.credit.register_signal`) is
    kept in ``extra`` by name. ``signals[name]`` reads and ``signals[name] = value`` writes either kind, so a
    provider of a new signal needs no field here."""

    values: torch.Tensor | None = None  # [N, L] critic: V of the state before each token
    potentials: list[list[float]] | None = None  # per trajectory: a potential at each policy segment's start
    teacher_logp: torch.Tensor | None = None  # [N, L] a teacher's log-probs of the student's own tokens
    entropy: torch.Tensor | None = None  # [N, L] student entropies
    alpha: float | None = None  # the batch's shaping scale
    extra: dict[str, Any] = field(default_factory=dict)  # every other registered signal, by name
    #: what a provider computed besides its signals, by name, for its method's statistics only (never an input of
    #: the advantages): a potential's parts, say
    details: dict[str, Any] = field(default_factory=dict)

    def _is_field(self, name: str) -> bool:
        return name not in ("extra", "details") and name in {f.name for f in fields(self)}

    def __getitem__(self, name: str) -> Any:
        """The signal ``name`` (None when no one computed it)."""
        return getattr(self, name) if self._is_field(name) else self.extra.get(name)

    def __setitem__(self, name: str, value: Any) -> None:
        if self._is_field(name):
            setattr(self, name, value)
        else:
            self.extra[name] = value


def row_tokens(batch: TrainBatch, rows: Sequence[int] | None = None) -> list[list[int]]:
    """The real tokens (no padding) of ``rows`` (default: every row) of ``batch``."""
    rows = range(batch.num_rows) if rows is None else rows
    lengths = batch.attention_mask.sum(-1).tolist()
    return [batch.input_ids[r, : lengths[r]].tolist() for r in rows]


def trained_row_chunks(
    model: nn.Module,
    seqs: Sequence[Sequence[int]],
    loss_mask: torch.Tensor,
    value_weights: torch.Tensor | None = None,
    *,
    max_tokens: int,
) -> list[list[int]]:
    """Micro-batches (:func:`agentcredit.models.scoring.micro_batches` for ``model``: rows that share a prefix
    together, each chunk within ``max_tokens`` positions fed) of the rows that carry a loss term: a policy-loss token
    (``loss_mask``) or, for a critic, a value-loss position (``value_weights != 0``). ``seqs[r]`` is row r's tokens.

    Rows with neither add nothing to any term (KL and entropy use the policy-loss mask too), and a microbatch of
    only such rows would give a loss with no graph to back-propagate through. They arise whenever the update set
    is smaller than the policy tokens: carl-critical trains each selected action once, in the first row that
    holds it, so a row whose actions are all unselected or already counted has an all-false loss mask (every
    unforked phase-1 episode under ``forked_parent`` with n0 > 1; a view of a multi-row trajectory in
    replacement mode that holds only such actions).
    """
    live = loss_mask.bool().any(-1)
    if value_weights is not None:
        live = live | (value_weights != 0).any(-1)
    rows = live.nonzero(as_tuple=True)[0].tolist()
    return [[rows[i] for i in chunk] for chunk in micro_batches(model, [seqs[r] for r in rows], max_tokens)]


def pad_rows(
    seqs: Sequence[Sequence[int]], rows: Sequence[int], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``seqs[r]`` for r in ``rows``, right-padded: ``(input_ids, attention_mask)``."""
    width = max(len(seqs[r]) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros(len(rows), width, dtype=torch.bool)
    for k, r in enumerate(rows):
        ids[k, : len(seqs[r])] = torch.as_tensor(list(seqs[r]), dtype=torch.long)
        attn[k, : len(seqs[r])] = True
    return ids, attn


@torch.no_grad()
def score_batch(
    model: nn.Module,
    batch: TrainBatch,
    *,
    value_head: nn.Module | None = None,
    value_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    autocast: bool = False,
    with_entropy: bool = True,
    max_tokens: int = MICRO_BATCH_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Log-probs (and entropies, values) of the batch's policy tokens, in microbatches; ``[N, L]`` each."""
    N, L = batch.input_ids.shape
    logp = torch.zeros(N, L)
    entropy = torch.zeros(N, L) if with_entropy else None
    values = torch.zeros(N, L) if value_head is not None else None
    for rows in micro_batches(model, row_tokens(batch), max_tokens):
        sub = batch.select(rows)
        vmask = value_mask[rows][:, : sub.input_ids.shape[1]] if value_mask is not None else None
        scores = score_tokens(
            model,
            sub.input_ids,
            sub.attention_mask,
            sub.policy_mask,
            value_head=value_head,
            value_mask=vmask,
            temperature=temperature,
            with_entropy=with_entropy,
            autocast=autocast,
            share_prefixes=True,
        )
        width = sub.input_ids.shape[1]
        # the scores come back on the model's device; the batch's tensors stay on the host
        logp[rows, :width] = scores.logprobs.to(logp.device)
        if entropy is not None:
            entropy[rows, :width] = scores.entropies.to(entropy.device)
        if values is not None:
            values[rows, :width] = scores.values.to(values.device)
    return logp, entropy, values


def critic_values(
    critic: nn.Module,
    value_head: nn.Module,
    batch: TrainBatch,
    value_mask: torch.Tensor,
    *,
    autocast: bool = False,
    max_tokens: int = MICRO_BATCH_TOKENS,
) -> torch.Tensor:
    """V at ``value_mask`` from a separate critic model (``algorithm.critic_model='separate'``), ``[N, L]``."""
    N, L = batch.input_ids.shape
    values = torch.zeros(N, L)
    for rows in micro_batches(critic, row_tokens(batch), max_tokens):
        sub = batch.select(rows)
        width = sub.input_ids.shape[1]
        scores = score_tokens(
            critic,
            sub.input_ids,
            sub.attention_mask,
            torch.zeros_like(sub.policy_mask),
            value_head=value_head,
            value_mask=value_mask[rows][:, :width],
            with_entropy=False,
            autocast=autocast,
            share_prefixes=True,
        )
        values[rows, :width] = scores.values.to(values.device)
    return values


def _logprobs(model, ids, attn, want, temperature, autocast) -> torch.Tensor:
    """Log-probs of the ``want`` positions of padded rows, shared prefixes forwarded once."""
    return score_tokens(
        model,
        ids,
        attn,
        want,
        temperature=temperature,
        with_entropy=False,
        autocast=autocast,
        share_prefixes=True,
    ).logprobs


@torch.no_grad()
def score_continuations(
    model: nn.Module,
    contexts: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    *,
    temperature: float = 1.0,
    autocast: bool = False,
    max_tokens: int = MICRO_BATCH_TOKENS,
    pad_id: int = 0,
) -> list[list[float]]:
    """log p(continuation token j | context, continuation < j) for each (context, continuation) pair."""
    if len(contexts) != len(continuations):
        raise ValueError(f"{len(contexts)} contexts but {len(continuations)} continuations")
    seqs = [list(c) + list(x) for c, x in zip(contexts, continuations, strict=True)]
    out: list[list[float]] = [[] for _ in seqs]
    for rows in micro_batches(model, seqs, max_tokens):
        ids, attn = pad_rows(seqs, rows, pad_id)
        want = torch.zeros_like(attn)
        for k, i in enumerate(rows):
            want[k, len(contexts[i]) : len(seqs[i])] = True
        logprobs = _logprobs(model, ids, attn, want, temperature, autocast)
        for k, i in enumerate(rows):
            out[i] = logprobs[k, len(contexts[i]) : len(seqs[i])].tolist()
    return out


@torch.no_grad()
def teacher_logprobs(
    model: nn.Module,
    batch: TrainBatch,
    prompt_lengths: Sequence[int],
    teacher_prompts: Sequence[Sequence[int]],
    *,
    temperature: float = 1.0,
    autocast: bool = False,
    max_tokens: int = MICRO_BATCH_TOKENS,
    pad_id: int = 0,
) -> torch.Tensor:
    """log pi(a_t | s_t*) of each row's policy tokens with the row's prompt replaced by a teacher prompt.

    ``prompt_lengths[r]`` is the length of row r's original prompt (the tree root), ``teacher_prompts[r]`` the
    teacher's prompt ids (one that holds privileged information, say); the rest of the row (the student's own tokens
    and observations) is kept as is: one teacher-forced pass, no generation, no tool re-runs.
    """
    N, L = batch.input_ids.shape
    out = torch.zeros(N, L)
    seqs, shifts = [], []
    for r in range(N):
        length = int(batch.attention_mask[r].sum())
        p = prompt_lengths[r]
        seqs.append(list(teacher_prompts[r]) + batch.input_ids[r, p:length].tolist())
        shifts.append(len(teacher_prompts[r]) - p)
    for rows in micro_batches(model, seqs, max_tokens):
        ids, attn = pad_rows(seqs, rows, pad_id)
        want = torch.zeros_like(attn)
        for k, r in enumerate(rows):
            cols = batch.policy_mask[r].nonzero(as_tuple=True)[0]
            want[k, cols + shifts[r]] = True
        logprobs = _logprobs(model, ids, attn, want, temperature, autocast).to(out.device)
        for k, r in enumerate(rows):
            cols = batch.policy_mask[r].nonzero(as_tuple=True)[0]
            out[r, cols] = logprobs[k, cols + shifts[r]]
    return out


def logprobs_under_prompts(
    model: nn.Module,
    batch: TrainBatch,
    trees: Sequence[Any],
    prompts: Mapping[int, Sequence[int]],
    *,
    temperature: float = 1.0,
    autocast: bool = False,
    max_tokens: int = MICRO_BATCH_TOKENS,
) -> torch.Tensor:
    """:func:`teacher_logprobs` with each row's prompt (its tree's root, ``trees[t].segment(0)``) replaced by the
    token ids ``prompts[t]`` of its tree ``t``."""
    row_tree = [batch.trajectories[int(j)].tree for j in batch.row_traj]
    return teacher_logprobs(
        model,
        batch,
        [len(trees[t].segment(0)) for t in row_tree],
        [prompts[t] for t in row_tree],
        temperature=temperature,
        autocast=autocast,
        max_tokens=max_tokens,
    )


def segment_contexts(batch: TrainBatch) -> list[list[list[int]]]:
    """Per trajectory of ``batch``, the exact token ids each of its policy segments was generated from: for segment
    0 the prompt, later the state right after an observation."""
    return [
        [batch.input_ids[r, :first].tolist() for r, first, _ in segment_spans(batch, traj)]
        for traj in batch.trajectories
    ]


def values_at(
    model: nn.Module,
    value_head: nn.Module,
    batch: TrainBatch,
    positions: dict[int, list[int]],
    *,
    autocast: bool = False,
    max_tokens: int = MICRO_BATCH_TOKENS,
) -> dict[tuple[int, int], torch.Tensor]:
    """V at chosen ``(row, col)`` positions (``positions[row] = [cols]``), with gradient outside ``no_grad``.

    Only the rows that hold a position are run (the carl-segment warm-up and the critic evaluation read a few
    boundaries out of many rows).
    """
    out: dict[tuple[int, int], torch.Tensor] = {}
    rows = sorted(positions)
    for chunk in micro_batches(model, row_tokens(batch, rows), max_tokens):
        chunk_rows = [rows[i] for i in chunk]
        sub = batch.select(chunk_rows)
        vmask = torch.zeros_like(sub.attention_mask)
        for k, r in enumerate(chunk_rows):
            vmask[k, sorted(set(positions[r]))] = True
        scores = score_tokens(
            model,
            sub.input_ids,
            sub.attention_mask,
            torch.zeros_like(vmask),
            value_head=value_head,
            value_mask=vmask,
            with_entropy=False,
            autocast=autocast,
            share_prefixes=True,
        )
        for k, r in enumerate(chunk_rows):
            for c in positions[r]:
                out[(r, c)] = scores.values[k, c]
    return out
