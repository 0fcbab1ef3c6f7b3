"""What a method needs besides rewards, computed once per batch with the pre-update weights (no gradient):

* old log-probs and entropies of every policy token (the trainer recomputes them with its own forward pass, as verl
  does, so PPO ratios never mix the rollout's precision with the trainer's);
* critic values (per token, or at segment boundaries);
* reference log-probs for the KL term;
* TIPS teacher potentials Phi(S) = log sum_a p_teacher(answer a | S) at the start of every policy segment;
* GEAR ground-truth-conditioned teacher log-probs of the student's own tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import nn

from agentcredit.config import MICRO_BATCH_TOKENS
from agentcredit.credit import tips_potential
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
    potentials: list[list[float]] | None = None  # per trajectory: Phi at each policy segment's start state
    teacher_logp: torch.Tensor | None = None  # [N, L] GEAR ground-truth-conditioned teacher log-probs
    entropy: torch.Tensor | None = None  # [N, L] student entropies (GEAR)
    alpha: float | None = None  # TIPS shaping scale used for this batch
    potential_split: TipsPotentials | None = None  # TIPS: Phi's format / answer parts and the scope that ran
    extra: dict[str, Any] = field(default_factory=dict)  # every other registered signal, by name

    def _is_field(self, name: str) -> bool:
        return name != "extra" and name in {f.name for f in fields(self)}

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
        # the scores come back on the model's device; the batch's tensors stay on the host (issue 50)
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


def answer_token_span(
    encode: Callable[[str], list[int]], rendered: str, answer: str
) -> tuple[list[int], int, int]:
    """``rendered`` (an answer in the protocol's format, e.g. ``<answer>A</answer>``) tokenised as the teacher
    scores it, and the span ``[start, end)`` of its tokens that belong to the answer A; the rest are format tokens.

    The tokens are those of the whole string (as today's potential scores them). A token counts as format when it
    is in the longest common prefix with the text before A tokenised alone, or the longest common suffix with the
    text after it; a token that merges format and answer characters counts as answer.
    """
    ids = encode(rendered)
    if not ids:
        raise ValueError(f"the rendered answer {rendered!r} has no tokens")
    at = rendered.find(answer) if answer else -1
    if at < 0:  # the protocol does not show the answer verbatim: every token is the answer's
        return ids, 0, len(ids)
    before, after = encode(rendered[:at]), encode(rendered[at + len(answer) :])
    start = 0
    while start < min(len(ids), len(before)) and ids[start] == before[start]:
        start += 1
    end = len(ids)
    while (
        end > start
        and len(ids) - end < len(after)
        and ids[end - 1] == after[len(after) - (len(ids) - end) - 1]
    ):
        end -= 1
    return ids, start, end


@dataclass
class TipsPotentials:
    """Phi per trajectory and policy segment (:func:`tips_potential`), and its split (each alias's summed
    log-probs, averaged over aliases): ``format`` over the format tokens of the rendered answer (0.0 under
    ``answer_only``, which does not score them) and ``answer`` over the answer's own tokens."""

    potentials: list[list[float]]
    format: list[list[float]]
    answer: list[list[float]]
    scope: str


@torch.no_grad()
def tips_potential_terms(
    teacher: nn.Module,
    batch: TrainBatch,
    answers: Sequence[Sequence[str]],
    encode: Callable[[str], list[int]],
    render_answer: Callable[[str], str],
    *,
    reduce: str = "sum",
    scope: str = "answer_only",
    autocast: bool = False,
    max_tokens: int = MICRO_BATCH_TOKENS,
) -> TipsPotentials:
    """Phi at the start state of every policy segment of every trajectory (tips.md §2.7), and its split.

    The context is the exact token ids the segment was generated from (the canonical construction [R]: for
    segment 0 the prompt, later the state right after an observation); the continuation is each de-duplicated gold
    alias rendered in the protocol's answer format and tokenised alone. ``scope``:

    * ``"answer_only"`` (default, the paper: :class:`~agentcredit.credit.methods.tips.TipsSettings`'s
      ``potential_scope`` cites the lines): the format tokens before the answer are forced into the context and
      only the answer's own tokens are scored, as Eq. 15-16's p_teach(A | S) reads. A policy that always opens a
      turn with ``<think>`` gives ``<answer>`` a low probability right after the state, so scoring the tags would
      make Phi measure that format habit, not only what the state says about the answer (issues 31, 48);
    * ``"full"``: Phi scores every token of the rendered answer, the tags included (the released code's
      ``<answer>a</answer>``, tips.md §8 item 3).
    """
    if scope not in ("full", "answer_only"):
        raise ValueError(f"potential_scope must be 'full' or 'answer_only', got {scope!r}")
    if len(answers) != len(batch.trajectories):
        raise ValueError(f"{len(answers)} answer lists for {len(batch.trajectories)} trajectories")
    contexts, conts, answer_at, owners = [], [], [], []
    for j, (traj, golds) in enumerate(zip(batch.trajectories, answers, strict=True)):
        aliases = list(dict.fromkeys(g for g in golds if g))
        if not aliases:
            raise ValueError(
                f"trajectory {j} (tree {traj.tree}) has no gold answer to score a TIPS potential"
            )
        rendered = {a: answer_token_span(encode, render_answer(a), a) for a in aliases}
        for k, (r, first, _) in enumerate(segment_spans(batch, traj)):
            ctx = batch.input_ids[r, :first].tolist()
            for a in aliases:
                ids, start, end = rendered[a]
                if scope == "answer_only":  # the tag forced into the context, the answer scored alone
                    contexts.append(ctx + ids[:start])
                    conts.append(ids[start:end])
                    answer_at.append((0, end - start))
                else:
                    contexts.append(ctx)
                    conts.append(ids)
                    answer_at.append((start, end))
                owners.append((j, k))
    logprobs = score_continuations(teacher, contexts, conts, autocast=autocast, max_tokens=max_tokens)
    grouped: dict[tuple[int, int], list[list[float]]] = {}
    split: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for owner, lp, (start, end) in zip(owners, logprobs, answer_at, strict=True):
        grouped.setdefault(owner, []).append(lp)
        ans = math.fsum(lp[start:end])
        split.setdefault(owner, []).append((math.fsum(lp) - ans, ans))
    out = TipsPotentials([], [], [], scope)
    for j, traj in enumerate(batch.trajectories):
        keys = [(j, k) for k in range(len(traj.policy_nodes))]
        out.potentials.append([tips_potential(grouped[key], reduce=reduce) for key in keys])
        out.format.append([math.fsum(f for f, _ in split[key]) / len(split[key]) for key in keys])
        out.answer.append([math.fsum(a for _, a in split[key]) / len(split[key]) for key in keys])
    return out


def gear_ground_truth(protocol: Any, example: Any, reference: str | None = None) -> str:
    """What GEAR's teacher is shown as the ground truth of ``example``: the reference trajectory when given,
    else the gold answer in the protocol's answer format; either after ``info["solution"]`` when the example
    has a worked solution (gear.md §2.2: "the reference final answer, plus a reference solution")."""
    truth = reference if reference is not None else protocol.render_answer(example.answers[0])
    if example.info.get("solution"):
        truth = f"{example.info['solution']}\n{truth}"
    return truth


def gear_teacher_prompt(
    protocol: Any,
    tokenizer: Any,
    question: str,
    ground_truth: str,
    template: str,
    *,
    student_prompt: str | None = None,
) -> str:
    """GEAR's ground-truth-conditioned teacher prompt: the student's prompt with the ground truth inserted (gear.md §2.2).

    The student's prompt is built by the protocol (``protocol.prompt``; pass the rollout's own prompt text as
    ``student_prompt`` to reuse it), so the teacher's prompt is the same text with one span rewritten as
    ``template.format(user=span, ground_truth=...)``: the last user message when the prompt is a chat rendering
    of the protocol's messages (OPSD style: system prompt unchanged, privileged text appended to the last user
    message), or the question itself when the protocol writes a raw-text prompt with no chat template (tags
    ``asearcher``, whose "user message" is the whole prompt up to its ``Assistant:`` cue). Either way the
    teacher's prompt ends exactly like the student's (the same assistant header or cue), so the student's
    tokens continue it as they continued the student's prompt. (The trainer used to render every teacher
    prompt with the chat template, which for a raw-text protocol put the student's tokens after a chat header
    they were never sampled after.)
    """
    state = protocol.new_episode(question)
    prompt = protocol.prompt(state, tokenizer) if student_prompt is None else student_prompt
    messages = protocol.messages(state)
    if not messages or messages[-1].get("role") != "user":
        raise ValueError(
            f"{protocol.name}: the last prompt message is not a user message; GEAR cannot insert"
        )
    user = messages[-1]["content"]
    raw = prompt == user  # raw-text prompt: the "user message" is the whole prompt, assistant cue included
    anchor = question if raw else user
    at = prompt.rfind(anchor)
    if at < 0:
        raise ValueError(
            f"{protocol.name}: the student's prompt does not contain its {'question' if raw else 'user message'} "
            "verbatim, so GEAR's teacher prompt cannot be built from it"
        )
    inserted = template.format(user=anchor, ground_truth=ground_truth)
    return prompt[:at] + inserted + prompt[at + len(anchor) :]


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
    """GEAR: log pi(a_t | s_t*) of each row's policy tokens with the row's prompt replaced by a teacher prompt.

    ``prompt_lengths[r]`` is the length of row r's original prompt (the tree root), ``teacher_prompts[r]`` the
    ground-truth-conditioned prompt ids; the rest of the row (the student's own tokens and observations) is kept as is
    (gear.md §2.2: one teacher-forced pass, no generation, no tool re-runs).
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


def gear_teacher_logprobs(
    model: nn.Module,
    tokenizer: Any,
    protocol: Any,
    batch: TrainBatch,
    trees: Sequence[Any],
    examples: dict[int, Any],
    template: str,
    *,
    references: Mapping[int, str] | None = None,
    temperature: float = 1.0,
    autocast: bool = False,
    max_tokens: int = MICRO_BATCH_TOKENS,
) -> torch.Tensor:
    """GEAR's signal: the ground-truth-conditioned teacher's log-probs of every student token.

    The teacher is the same weights on the student's prompt (as the protocol built it, ``trees[t].segment(0)``)
    with the ground truth inserted (gear.md §2.2; :func:`gear_teacher_prompt`). ``examples[t]`` is the question
    of tree ``t``. The ground truth is :func:`gear_ground_truth`: the reference trajectory ``references[t]``
    when given (the paper's tau*, :class:`agentcredit.train.sft.ReferenceTrajectories`), else the rendered gold
    answer (``algorithm.gear.reference=answer``, a variant), after the worked solution when the example has one.
    """
    prompts: dict[int, list[int]] = {}
    for t, example in examples.items():
        truth = gear_ground_truth(protocol, example, None if references is None else references[t])
        text = gear_teacher_prompt(
            protocol, tokenizer, example.question, truth, template, student_prompt=trees[t].segment(0).text
        )
        prompts[t] = tokenizer(text, add_special_tokens=False)["input_ids"]
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
