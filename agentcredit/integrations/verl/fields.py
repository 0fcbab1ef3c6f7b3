"""The record the agent loop writes into ``extra_fields["agentcredit"]`` and the trainer reads back.

verl carries an agent loop's ``extra_fields`` through to the trainer untouched (a numpy object array in a
``DataProto``, a ``NonTensorStack`` in TransferQueue), so this record has to be plain JSON-able data. It is
one dict per *row*: an episode is one row, except in carl-segment's replacement mode, where the raw tool output
is removed from the context after the assimilate segment that read it, so no single token sequence is the
context of every policy token; the episode is then split into the rows of
:meth:`agentcredit.rollout.tree.RolloutTree.training_views` ("views"), each training the policy segments that
were generated under exactly its context.

Coordinates are indices into the row's ``responses`` (0 = first token after the prompt), end exclusive.
Episode-level fields (outcome, kinds, format rewards, potentials) are repeated in every view of the episode.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = ["TEACHER_FIELD", "RowRecord", "Span", "parse_records"]

#: GEAR's teacher log-probs, one per response token: the trainer moves them out of the record (Python floats inside
#: ``extra_fields``, which verl hands to every worker call) into this tensor field of TransferQueue.
TEACHER_FIELD = "agentcredit_teacher_log_probs"


class Span(BaseModel):
    """A run of response tokens that came from one segment of the episode."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    start: int = Field(ge=0, description="first response index of the segment")
    end: int = Field(gt=0, description="one past its last response index")
    role: Literal["policy", "observation"]
    kind: str = Field(
        description="protocol label: invoke / assimilate / commit / search / answer / step / ..."
    )
    trained: bool = Field(description="policy tokens trained in this row (response_mask == 1 here)")
    transient: bool = Field(
        False, description="an observation removed from the context after the next segment"
    )
    segment: int | None = Field(None, description="index of the policy segment in the episode (0 = first)")

    @model_validator(mode="after")
    def _check(self) -> Span:
        if self.end <= self.start:
            raise ValueError(f"span end {self.end} must be > start {self.start}")
        if self.role == "policy" and self.segment is None:
            raise ValueError("a policy span needs its episode segment index")
        if self.role == "observation" and self.trained:
            raise ValueError("an observation span is never trained")
        return self


class RowRecord(BaseModel):
    """What the credit methods need to know about one row of the batch."""

    model_config = ConfigDict(extra="forbid")

    episode_id: str = Field(min_length=1, description="shared by every view of one episode")
    view: int = Field(0, ge=0, description="index of this row among the episode's views")
    n_views: int = Field(1, ge=1, description="rows the episode was split into (1 without replacement)")
    spans: list[Span] = Field(description="segments of this row's response, in order")
    outcome: float = Field(description="the episode's outcome reward (the same in every view)")
    answer: str | None = Field(None, description="the extracted final answer, if any")
    segment_kinds: list[str] = Field(description="kind of every policy segment of the episode, in order")
    tool_turns: list[int] = Field(
        default_factory=list, description="policy segments followed by an observation (TIPS's turns k = 1..M)"
    )
    format_rewards: list[float | None] = Field(
        default_factory=list, description="per policy segment: the protocol's formatting reward (portool)"
    )
    env_rewards: list[float] = Field(
        default_factory=list,
        description="per policy segment: the step reward of a per-episode environment (tools.environment); "
        "outcome already includes their sum",
    )
    tree_id: str | None = Field(
        None, description="the rollout tree the episode is a leaf of (agentcredit.tree; None = independent)"
    )
    step_nodes: list[int] = Field(
        default_factory=list,
        description="per policy segment: its node in that tree (episodes of one tree share their common steps)",
    )
    fork_counts: dict[int, int] = Field(
        default_factory=dict,
        description="entropy-guided trees: times each state was forked, keyed by the tree node of the action "
        "before it (0 = the prompt); the same in every record of the tree (carl-critical's forked_parent rule)",
    )
    potentials: list[float] | None = Field(
        None, description="TIPS: teacher potentials Phi(S_0), ..., Phi(S_M), one more than tool_turns"
    )
    teacher_logprobs: list[float] | None = Field(
        None, description="GEAR: log p(a_t | answer-conditioned context) per response token of this row"
    )
    signals: dict[str, Any] = Field(
        default_factory=dict,
        description="per episode, the value of each signal a user's scorer computed on the worker "
        "(agentcredit.integrations.verl.signals.register_signal_scorer), by the signal's name",
    )
    teacher_calls: dict[str, int] = Field(
        default_factory=dict,
        description="the episode's teacher scoring calls (TIPS, GEAR; view 0 only): requests sent, and resent = "
        "vLLM calls whose prefix-cache hit reached the scored tokens and were sent again on the whole-sequence "
        "path (agentcredit.integrations.verl.scoring); logged as agentcredit/teacher_* so a cache path that "
        "keeps falling back is visible",
    )
    infra_failures: list[str] = Field(
        default_factory=list,
        description='tool calls that could not run ("tool: output"): the episode ended there, its tokens are not '
        "trained (no span is trained, response_mask is 0) and the credit leaves it out, as a failed session",
    )

    @model_validator(mode="after")
    def _check(self) -> RowRecord:
        if self.view >= self.n_views:
            raise ValueError(f"view {self.view} is out of range for n_views = {self.n_views}")
        previous_end = 0
        n_segments = len(self.segment_kinds)
        for i, span in enumerate(self.spans):
            if span.start < previous_end:
                raise ValueError(
                    f"spans[{i}] starts at {span.start}, before the previous span ends ({previous_end})"
                )
            previous_end = span.end
            if span.segment is not None and not 0 <= span.segment < n_segments:
                raise ValueError(
                    f"spans[{i}].segment = {span.segment} but the episode has {n_segments} segments"
                )
        for k in self.tool_turns:
            if not 0 <= k < n_segments:
                raise ValueError(f"tool_turns holds {k} but the episode has {n_segments} policy segments")
        if self.format_rewards and len(self.format_rewards) != n_segments:
            raise ValueError(
                f"format_rewards has {len(self.format_rewards)} entries for {n_segments} policy segments"
            )
        if (self.tree_id is None) != (not self.step_nodes) or (
            self.step_nodes and len(self.step_nodes) != n_segments
        ):
            raise ValueError(
                f"tree_id and step_nodes come together, one node per policy segment ({n_segments}); got tree_id="
                f"{self.tree_id!r} and {len(self.step_nodes)} step_nodes"
            )
        if self.env_rewards and len(self.env_rewards) != n_segments:
            raise ValueError(
                f"env_rewards has {len(self.env_rewards)} entries for {n_segments} policy segments"
            )
        if self.potentials is not None and len(self.potentials) != len(self.tool_turns) + 1:
            raise ValueError(
                f"potentials has {len(self.potentials)} values; it needs Phi(S_0..S_M) = "
                f"{len(self.tool_turns) + 1} for {len(self.tool_turns)} tool turns"
            )
        return self

    @property
    def response_length(self) -> int:
        return self.spans[-1].end if self.spans else 0

    def trained_spans(self) -> list[Span]:
        return [s for s in self.spans if s.trained]


def parse_records(raw: object, n_rows: int, *, where: str = "extra_fields['agentcredit']") -> list[RowRecord]:
    """Validate the per-row records of a batch; errors name the row and the field."""
    if raw is None:
        raise ValueError(
            f"{where} is missing from the batch: the rows were not produced by the agentcredit agent loop "
            "(set actor_rollout_ref.rollout.agent.default_agent_loop=agentcredit_agent)"
        )
    rows = list(raw)  # numpy object array, NonTensorStack or list
    if len(rows) != n_rows:
        raise ValueError(f"{where} has {len(rows)} entries for a batch of {n_rows} rows")
    out = []
    for i, row in enumerate(rows):
        if isinstance(row, RowRecord):
            out.append(row)
            continue
        if row is None:
            raise ValueError(f"{where}[{i}] is None: row {i} was not produced by the agentcredit agent loop")
        try:
            out.append(RowRecord.model_validate(row))
        except ValidationError as err:
            raise ValueError(f"{where}[{i}] is malformed: {err}") from None
    return out
