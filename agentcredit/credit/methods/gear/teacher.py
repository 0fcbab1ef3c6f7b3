"""GEAR's signal: the ground-truth-conditioned teacher's log-probs of the student's own tokens (gear.md §2.2).

The teacher is the policy's own weights on the student's prompt with the ground truth inserted
(:func:`gear_teacher_prompt`); the ground truth is the task's reference trajectory tau* (paper §3.3), played once
per example, or the rendered gold answer (``reference: answer``, a variant) (:func:`gear_ground_truth`).
:class:`TeacherLogprobs` computes it every batch with the trainer's scoring
(:class:`~agentcredit.credit.signals.ProviderContext`), and :func:`signal_stats` logs its mean reverse KL.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import Tensor

from agentcredit.credit.signals import NoReference, PromptScorer, ProviderContext, SignalProvider

__all__ = [
    "TeacherLogprobs",
    "gear_ground_truth",
    "gear_teacher_logprobs",
    "gear_teacher_prompt",
    "reference_trajectories",
    "signal_stats",
]


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


def gear_teacher_logprobs(
    score: PromptScorer,
    tokenizer: Any,
    protocol: Any,
    batch: Any,
    trees: Sequence[Any],
    examples: Mapping[int, Any],
    template: str,
    *,
    references: Mapping[int, str] | None = None,
) -> Tensor:
    """GEAR's signal: the ground-truth-conditioned teacher's log-probs of every student token, ``[N, L]``.

    The teacher is the same weights on the student's prompt (as the protocol built it, ``trees[t].segment(0)``)
    with the ground truth inserted (gear.md §2.2; :func:`gear_teacher_prompt`); ``score(batch, trees, prompts)``
    scores the batch's policy tokens after those prompts (the native trainer's
    :meth:`~agentcredit.credit.signals.ProviderContext.logprobs_under_prompts` with the policy bound).
    ``examples[t]`` is the question of tree ``t``. The ground truth is :func:`gear_ground_truth`: the reference
    trajectory ``references[t]`` when given (the paper's tau*, :func:`reference_trajectories`), else the rendered
    gold answer (``algorithm.gear.reference=answer``, a variant), after the worked solution when the example has one.
    """
    prompts: dict[int, list[int]] = {}
    for t, example in examples.items():
        truth = gear_ground_truth(protocol, example, None if references is None else references[t])
        text = gear_teacher_prompt(
            protocol, tokenizer, example.question, truth, template, student_prompt=trees[t].segment(0).text
        )
        prompts[t] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return score(batch, trees, prompts)


def reference_trajectories(make: Callable[[], Callable[[Any], str]]) -> Callable[[Any], str]:
    """The reference trajectories tau* that ``make()`` builds (a trainer's
    :meth:`~agentcredit.credit.signals.ProviderContext.reference_trajectories`: the task's scripted demonstration
    played through the protocol and tools); one line naming the variant when the task has none."""
    try:
        return make()
    except NoReference as exc:
        raise ValueError(
            f"GEAR's reference trajectory is the task's scripted demonstration, and there is none: {exc}. "
            "Set algorithm.gear.reference=answer to condition the teacher on the answer alone (a variant)"
        ) from None


class TeacherLogprobs(SignalProvider):
    """``teacher_logp``: :func:`gear_teacher_logprobs` under the live policy, conditioned on the reference
    trajectory played once per example (paper §3.3) or on the answer (``reference: answer``)."""

    provides = frozenset({"teacher_logp"})

    def __init__(self, run: ProviderContext, settings: Any) -> None:
        super().__init__(run, settings)
        self.references: Callable[[Any], str] | None = None  # tau* per example, built on first use

    @staticmethod
    def teacher_prompt(
        protocol: Any,
        tokenizer: Any,
        example: Any,
        template: str,
        *,
        reference: str | None = None,
        student_prompt: str | None = None,
    ) -> str:
        """The teacher's prompt text for ``example`` as :meth:`fill` builds it: the student's prompt with the
        ground truth (``reference``, tau*, when given, else the rendered gold answer; after the example's worked
        solution when it has one) inserted by ``template``. verl's agent loop builds it on its workers with this."""
        truth = gear_ground_truth(protocol, example, reference)
        return gear_teacher_prompt(
            protocol, tokenizer, example.question, truth, template, student_prompt=student_prompt
        )

    def fill(self, signals, batch, trees, examples, *, temperature, autocast) -> None:
        g, run = self.settings, self.run
        references = None
        if g.reference == "trajectory":  # tau*, played once per example (§3.3)
            if self.references is None:
                self.references = reference_trajectories(run.reference_trajectories)
            references = {t: self.references(ex) for t, ex in examples.items()}
        signals["teacher_logp"] = gear_teacher_logprobs(
            lambda b, t, prompts: run.logprobs_under_prompts(
                run.model, b, t, prompts, temperature=temperature, autocast=autocast
            ),
            run.tokenizer,
            run.env.protocol,
            batch,
            trees,
            dict(examples),
            g.template,
            references=references,
        )


def signal_stats(batch: Any, signals: Any) -> dict[str, float]:
    """The native trainer's per-step log of GEAR's signal: ``gear/rkl_mean``, the mean over the policy tokens of
    the student's log-prob minus the teacher's."""
    mask = batch.policy_mask
    teacher = signals["teacher_logp"]
    if teacher is not None and mask.any():
        return {"gear/rkl_mean": float((batch.old_logp - teacher)[mask].mean())}
    return {}
