"""PORTool's JSON tool-call protocol: ``<think>...</think><tool_call>[{"name": ..., "arguments": {...}}]</tool_call>``.

One step = one assistant turn (portool.md 2.1-2.3): a think block, then a JSON array of calls that run
concurrently. Their results come back as one user turn (spec 2.9: "a user message wrapped in
``<response> ... </response>``", as in the paper's Fig. 1), written as plain text with the chat template's role
markers so the context stays a list of appended token ids. ``response_gen`` ends the episode and its
``response`` argument is the final answer. A step without both blocks gets the paper's exact
``ERROR: Invalid output format...`` observation and runs nothing; the episode goes on (Figs. 9 and 11). At most
6 steps (spec 2.6 [R]).

Every step gets the formatting reward of spec 3.2 in ``turn.info["format_reward"]`` (rescaled R_fm in
[-0.25, 0.25], what the credit function takes) and ``turn.info["format_reward_raw"]`` (the [0, 1] rubric). The
cascade itself is the pure function :func:`format_reward_raw`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import jsonschema
from jsonschema.exceptions import best_match

from agentcredit.protocols._text import tail_contains
from agentcredit.protocols.base import EpisodeState, FinishReason, Observation, Protocol, Turn, check_results
from agentcredit.protocols.chat import CHATML, ChatMarkers
from agentcredit.tools.base import ToolCall, ToolResult

#: PORTool's system prompt, portool.md 2.4, verbatim (paper App. C.2, with the spec's OCR fixes "response_gen" and
#: "{tool_json}"; the line breaks are the PDF's, kept as the spec gives them). The paper's PDF text shows curly
#: quotes (user’s, “name”) where the spec has ASCII ones: we read those as typesetting of the same ASCII
#: characters, not a different prompt, and tests/protocols/test_jsoncall.py checks the two agree up to that.
JSONCALL_SYSTEM_PROMPT_TEMPLATE = """\
You are a helpful dialogue assistant that solves user tasks exclusively by invoking the appropriate tools. Do not answer from
your own knowledge, and you must strictly follow the provided tool descriptions. You have no internal factual knowledge
about games, events, locations, coordinates, dates, capitals, monuments, historical places, or time, and you never perform
mathematical operations, computations, comparisons, or sorting on your own. All such information or operations must
come from the correct tool. Some tools already have access to the user's location, so you must not request it explicitly.
When entities appear in a query, ensure they are correctly preserved and passed into the final tool call, since the tool output
determines the user-facing result. Once you have decomposed the query and gathered the necessary tool outputs, you must
always invoke the "response_gen" tool with the final answer and never produce a direct answer

Available tools:
{tool_json}

Output Format:

<think> Your thoughts and reasoning in one or two sentences </think>
<tool_call>
[
{"name": "Tool name", "arguments": {"argument name": "argument content", "...": "..."}},
{"name": "...", "arguments": {"...": "...", "...": "..."}}
]
</tool_call>

Important Notes:

1. Every output must include both: (i) one <think> ... </think> block outlining your thoughts and reasoning in one
or two sentences; and (ii) one <tool_call> ... </tool_call> block containing at least one tool call, enclosed in a
JSON array.

2. You may invoke multiple tool calls simultaneously inside the JSON array. Each tool call must be a JSON object with a
"name" field and an "arguments" field containing a dictionary of arguments.

3. Refer to the previous dialogue records in the history, including the user's queries, previous tool calls and responses.

4. When the user's task is fully resolved, you must invoke the response_gen tool in the <tool_call> ... </tool_call>
block with the required format. In this case, only response_gen should be invoked and no other tools. If other tools
are still required, do not invoke response_gen until the task is completed."""
TOOL_JSON_PLACEHOLDER = "{tool_json}"

#: The observation for a step without both blocks, verbatim (portool.md 2.3; paper Figs. 9 and 11).
FORMAT_ERROR = (
    "ERROR: Invalid output format. A valid output must include both: (i) the <think>...</think> field; and (ii) "
    "the <tool_call>...</tool_call> field."
)
#: The terminal tool and its schema (portool.md 2.5.2, paper App. D); added to the tool list when missing,
#: since the protocol cannot end an episode without it.
RESPONSE_GEN = "response_gen"
RESPONSE_GEN_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": RESPONSE_GEN,
        "description": "Response generation.",
        "parameters": {
            "type": "object",
            "properties": {
                "response": {"type": "string", "description": "Response to be generated."},
                "query": {"type": "string", "description": "User query or rewritten query."},
                "context": {"type": "string", "description": "Context for response generation."},
                "items": {
                    "type": "array",
                    "items": {"type": "object"},
                    "description": "Items with entities and facts.",
                },
            },
            "required": ["response"],
        },
    },
}
#: Step cap: 6 generations, response_gen included (portool.md 2.6 [R], 8.2).
MAX_STEPS = 6

# --- Formatting reward: portool.md 3.2 --------------------------------------------------------------------------
#: Rubric weights of the cascade: think, tool_call block, JSON, fields, tool success (they sum to 1).
W_THINK, W_TOOL_CALL, W_JSON, W_FIELDS, W_SUCCESS = 0.20, 0.10, 0.10, 0.05, 0.55
#: R_fm range: Gamma^T_max / 2 = 0.9^5 / 2 = 0.295, rounded down by the paper to 0.25.
FORMAT_REWARD_BOUND = 0.25


@dataclass(frozen=True)
class StepFormat:
    """What the formatting rubric looks at in one step (portool.md 3.2, 9.2 ``FormatCheck``)."""

    has_think: bool = False
    has_tool_call: bool = False
    json_ok: bool = False
    fields_ok: bool = False  # every call has name: str and arguments: dict, and there is at least one
    n_calls: int = 0
    n_success: int = 0

    def __post_init__(self) -> None:
        if self.n_calls < 0 or not 0 <= self.n_success <= self.n_calls:
            raise ValueError(
                f"StepFormat: need 0 <= n_success <= n_calls, got n_success={self.n_success}, n_calls={self.n_calls}"
            )


def format_reward_raw(fmt: StepFormat) -> float:
    """PORTool's formatting rubric, a cascade with range [0, 1] (portool.md 3.2).

    0.2 for a think block; only then 0.1 for a tool_call block; only then 0.1 if its content parses as JSON;
    only then 0.05 if every call has a string ``name`` and a dict ``arguments``; only then 0.55 times the
    fraction of calls that succeeded.
    """
    raw = 0.0
    if not fmt.has_think:  # "Formatting rewards are activated only when a reasoning block is present."
        return raw
    raw += W_THINK
    if not fmt.has_tool_call:
        return raw
    raw += W_TOOL_CALL
    if not fmt.json_ok:
        return raw
    raw += W_JSON
    if not fmt.fields_ok or fmt.n_calls == 0:
        return raw
    raw += W_FIELDS
    # min(): guards the [0, 1] range against float round-off in the partial-success term.
    return min(1.0, raw + W_SUCCESS * fmt.n_success / fmt.n_calls)


def rescale_format_reward(raw: float, bound: float = FORMAT_REWARD_BOUND) -> float:
    """The affine map [0, 1] -> [-bound, bound]; with bound 0.25 it is R_fm = 0.5 * raw - 0.25 (spec 3.2 [R])."""
    if not 0.0 <= raw <= 1.0:
        raise ValueError(f"raw formatting reward must lie in [0, 1], got {raw}")
    if bound < 0:
        raise ValueError(f"bound must be >= 0, got {bound}")
    return bound * (2.0 * raw - 1.0)


# --- Parsing ---------------------------------------------------------------------------------------------------
@dataclass
class CallSlot:
    """One element of the step's JSON array: a call to run, or the error the model sees instead."""

    name: str | None
    arguments: dict[str, Any] | None
    error: str | None = None  # "ERROR: ..." when the call is not run
    call_index: int | None = None  # index into Turn.calls when it is run


@dataclass
class ParsedStep:
    fmt: StepFormat
    slots: list[CallSlot] = field(default_factory=list)
    error: str | None = None  # a step-level error observation (format, JSON); then no call runs


def set_format_reward(info: dict[str, Any], fmt: StepFormat, bound: float = FORMAT_REWARD_BOUND) -> None:
    """Write a step's rubric, raw reward and rescaled reward into ``turn.info`` (the keys the trainers read)."""
    raw = format_reward_raw(fmt)
    info["format"] = asdict(fmt)
    info["format_reward_raw"] = raw
    info["format_reward"] = rescale_format_reward(raw, bound)


def _find_block(text: str, open_tag: str, close_tag: str, start: int = 0) -> tuple[int, int] | None:
    """Span (content start, content end) of the first ``open_tag ... close_tag`` at or after ``start``."""
    i = text.find(open_tag, start)
    if i < 0:
        return None
    j = text.find(close_tag, i + len(open_tag))
    return None if j < 0 else (i + len(open_tag), j)


def normalise_schema(index: int, entry: Any, *, owner: str = "jsoncall") -> dict[str, Any]:
    """An OpenAI-style ``{"type": "function", "function": {...}}`` or a flat ``{"name", "parameters"}`` schema."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"{owner}: tool schema {index} must be a mapping, got {type(entry).__name__}")
    fn = entry.get("function", entry) if entry.get("type") == "function" else entry
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ValueError(
            f"{owner}: tool schema {index} has no 'name' string (field 'function.name' or 'name')"
        )
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, Mapping):
        raise ValueError(
            f"{owner}: tool schema {index} ({fn['name']}): 'parameters' must be a JSON schema object"
        )
    try:
        jsonschema.validators.validator_for(params).check_schema(params)
    except jsonschema.SchemaError as exc:
        raise ValueError(
            f"{owner}: tool schema {index} ({fn['name']}): invalid 'parameters': {exc.message}"
        ) from exc
    return {"type": "function", "function": {**fn, "parameters": dict(params)}}


class JsonCallProtocol(Protocol):
    """PORTool's step format, its error observations, ``response_gen`` and the formatting reward.

    Args:
        schemas: the tool schemas (OpenAI-style or flat ``{"name", "description", "parameters"}``); default:
            ``agentcredit.tools.suite.suite_schemas()``, imported when the protocol is built. ``response_gen`` is
            added when missing.
        max_segments: step cap (spec 2.6: 6 generations, response_gen included).
        strict_list: a single JSON object in ``<tool_call>`` is an error (default: wrapped into a one-element
            list, spec 8.16).
        stop_at_tool_call: end a step at ``</tool_call>`` instead of at EOS (for models that keep writing); the
            end-of-turn token is then written by the environment instead of the policy (spec 2.9 trains it).
        chat_markers: role markers of observation turns; default: read off the tokenizer in ``prompt()``, ChatML
            when no tokenizer was seen.
        format_reward_bound: half-width of the rescaled formatting reward (spec 3.2: 0.25).
    """

    name = "jsoncall"

    def __init__(
        self,
        *,
        schemas: Sequence[Mapping[str, Any]] | None = None,
        max_segments: int = MAX_STEPS,
        strict_list: bool = False,
        stop_at_tool_call: bool = False,
        chat_markers: ChatMarkers | None = None,
        format_reward_bound: float = FORMAT_REWARD_BOUND,
    ) -> None:
        if schemas is None:
            try:
                from agentcredit.tools.suite import suite_schemas
            except ImportError as exc:
                raise ValueError(
                    f"jsoncall: no schemas given and the tool suite cannot be imported ({exc}); pass schemas=[...]"
                ) from exc
            schemas = suite_schemas()
        if isinstance(schemas, Mapping | str) or not isinstance(schemas, Sequence):
            raise ValueError(
                f"jsoncall: schemas must be a list of tool schemas, got {type(schemas).__name__}"
            )
        normalised = [normalise_schema(i, s) for i, s in enumerate(schemas)]
        names = [s["function"]["name"] for s in normalised]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"jsoncall: duplicate tool names in schemas: {duplicates}")
        if RESPONSE_GEN not in names:
            normalised.append(RESPONSE_GEN_SCHEMA)
        if not isinstance(max_segments, int) or max_segments < 1:
            raise ValueError(f"jsoncall: max_segments must be an integer >= 1, got {max_segments!r}")
        if chat_markers is not None and not isinstance(chat_markers, ChatMarkers):
            raise ValueError(
                f"jsoncall: chat_markers must be a ChatMarkers, got {type(chat_markers).__name__}"
            )
        if format_reward_bound < 0:
            raise ValueError(f"jsoncall: format_reward_bound must be >= 0, got {format_reward_bound!r}")
        self.schemas: list[dict[str, Any]] = normalised
        self.max_segments = max_segments
        self.strict_list = bool(strict_list)
        self.stop_at_tool_call = bool(stop_at_tool_call)
        self.chat_markers = chat_markers
        self.format_reward_bound = float(format_reward_bound)
        self._validators = {
            s["function"]["name"]: jsonschema.validators.validator_for(s["function"]["parameters"])(
                s["function"]["parameters"]
            )
            for s in normalised
        }
        # {tool_json}: an OpenAI-style function-schema JSON list, one tool per line (spec 2.4 [R]).
        tool_json = "[\n" + ",\n".join(json.dumps(s, ensure_ascii=False) for s in normalised) + "\n]"
        self.system_prompt = JSONCALL_SYSTEM_PROMPT_TEMPLATE.replace(TOOL_JSON_PLACEHOLDER, tool_json)

    @property
    def tool_names(self) -> list[str]:
        return list(self._validators)

    # -- prompt --------------------------------------------------------------------------------------------
    def messages(self, state: EpisodeState) -> list[dict[str, str]]:
        # Spec 2.9: the tools live in the system prompt; never pass tools= to the chat template. The user turn
        # is the raw query (spec 2.4 [I]).
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": state.question},
        ]

    def prompt(self, state: EpisodeState, tokenizer: Any) -> str:
        if self.chat_markers is None:
            state.extra["chat_markers"] = ChatMarkers.from_tokenizer(tokenizer)
        return super().prompt(state, tokenizer)

    def markers(self, state: EpisodeState) -> ChatMarkers:
        return self.chat_markers or state.extra.get("chat_markers") or CHATML

    # -- generation control --------------------------------------------------------------------------------
    def stop_strings(self, state: EpisodeState) -> list[str]:
        turn_end = self.markers(state).turn_end
        stops = [turn_end] if turn_end else []
        return ["</tool_call>", *stops] if self.stop_at_tool_call else stops

    def segment_ends(self, state: EpisodeState, text: str) -> bool:
        # A step ends at EOS (its end-of-turn token is a policy token, spec 2.9); the marker check covers a
        # backend that decodes special tokens without stopping on them.
        return tail_contains(text, self.stop_strings(state))

    # -- reading output ------------------------------------------------------------------------------------
    def parse_step(self, text: str) -> ParsedStep:
        """Check one step's format and validate its calls against the schemas. Never raises."""
        think = _find_block(text, "<think>", "</think>")
        if think is None:  # spec 8.17: the first complete think block, and the first tool_call block after it
            return ParsedStep(StepFormat(), error=FORMAT_ERROR)
        block = _find_block(text, "<tool_call>", "</tool_call>", start=think[1] + len("</think>"))
        if block is None:
            return ParsedStep(StepFormat(has_think=True), error=FORMAT_ERROR)
        content = text[block[0] : block[1]]
        try:
            data = json.loads(content)
        except (ValueError, RecursionError) as exc:  # also a >4300-digit integer or deep nesting: never raise
            if not isinstance(exc, json.JSONDecodeError):
                exc = json.JSONDecodeError(f"{type(exc).__name__}: {str(exc)[:100]}", content, 0)
            error = (
                f"ERROR: The <tool_call> block is not valid JSON ({exc.msg} at line {exc.lineno} column "
                f"{exc.colno}). It must hold a JSON array of tool calls."
            )
            return ParsedStep(StepFormat(has_think=True, has_tool_call=True), error=error)
        fmt = StepFormat(has_think=True, has_tool_call=True, json_ok=True)
        if isinstance(data, dict) and not self.strict_list:
            data = [data]  # spec 8.16: lenient default
        if not isinstance(data, list):
            got = "object" if isinstance(data, dict) else type(data).__name__
            return ParsedStep(
                fmt, error=f"ERROR: The <tool_call> block must hold a JSON array of tool calls, got a {got}."
            )
        if not data:
            return ParsedStep(
                fmt,
                error="ERROR: The <tool_call> block holds an empty JSON array; include at least one tool call.",
            )
        slots = [self._check_call(i, entry) for i, entry in enumerate(data)]
        fields_ok = all(s.name is not None and s.arguments is not None for s in slots)
        n_valid = sum(s.error is None for s in slots)
        fmt = StepFormat(True, True, True, fields_ok=fields_ok, n_calls=len(slots), n_success=n_valid)
        return ParsedStep(fmt, slots=slots)

    def _check_call(self, index: int, entry: Any) -> CallSlot:
        name = entry.get("name") if isinstance(entry, dict) else None
        arguments = entry.get("arguments") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return CallSlot(
                name if isinstance(name, str) else None,
                arguments if isinstance(arguments, dict) else None,
                error=(
                    f'ERROR: Tool call {index + 1} must be a JSON object with a "name" string and an '
                    f'"arguments" object, got {json.dumps(entry, ensure_ascii=False)[:200]}'
                ),
            )
        validator = self._validators.get(name)
        if validator is None:
            return CallSlot(
                name,
                arguments,
                error=f"ERROR: Unknown tool {name!r}. Available tools: {', '.join(self.tool_names)}.",
            )
        problem = best_match(validator.iter_errors(arguments))
        if problem is not None:
            where = f" at {problem.json_path}" if problem.path else ""
            return CallSlot(
                name, arguments, error=f"ERROR: Invalid arguments for {name}{where}: {problem.message}"
            )
        return CallSlot(name, arguments)

    def read_segment(self, state: EpisodeState, text: str, finish: FinishReason) -> Turn:
        parsed = self.parse_step(text)
        info: dict[str, Any] = {
            "finish": finish,
            "turn_end_generated": self.markers(state).ends_turn(text, finish),
        }
        if finish == "length":
            info["truncated"] = True
        turn = Turn("step", info=info)
        if parsed.error is not None:
            info["error"] = parsed.error
        final = next((s for s in parsed.slots if s.name == RESPONSE_GEN and s.arguments is not None), None)
        fmt = parsed.fmt
        if final is not None:
            # Spec 8.15: a step with response_gen completes the trajectory; its other calls are not run and
            # count as failed calls; the answer is response_gen's "response" argument.
            turn.done = True
            response = final.arguments.get("response") if final.arguments else None
            turn.answer = response if isinstance(response, str) else None
            if turn.answer is None:
                info["error"] = final.error or "response_gen has no 'response' string"
            succeeded = 1 if final.error is None else 0
            fmt = StepFormat(
                fmt.has_think, fmt.has_tool_call, fmt.json_ok, fmt.fields_ok, fmt.n_calls, succeeded
            )
        elif state.n_turns + 1 >= self.max_segments:
            # The cap is reached without response_gen: nothing more runs. With no tool results, a call's
            # success is its schema validity alone.
            turn.done = True
            info["cut"] = "max_segments"
        else:
            for slot in parsed.slots:
                if slot.error is None:
                    slot.call_index = len(turn.calls)
                    raw = json.dumps({"name": slot.name, "arguments": slot.arguments}, ensure_ascii=False)
                    turn.calls.append(ToolCall(slot.name or "", dict(slot.arguments or {}), raw=raw))
        info["slots"] = [asdict(s) for s in parsed.slots]
        self._set_format(info, fmt)
        return turn

    def _set_format(self, info: dict[str, Any], fmt: StepFormat) -> None:
        set_format_reward(info, fmt, self.format_reward_bound)

    def observation(
        self, state: EpisodeState, turn: Turn, results: Sequence[ToolResult]
    ) -> Observation | None:
        check_results(self.name, turn, results)
        error = turn.info.get("error")
        slots = turn.info.get("slots", [])
        if error is not None and not slots:
            body = error  # a step-level error: format (verbatim), JSON, not a list, empty list
        else:
            # Spec 8.18: one observation for the step, per call in order: {"name": ..., "response": ...}.
            lines = []
            for slot in slots:
                idx = slot["call_index"]
                response = results[idx].output if idx is not None else slot["error"]
                lines.append(json.dumps({"name": slot["name"], "response": response}, ensure_ascii=False))
            body = "\n".join(lines)
            # Tool-side ERROR results make a call fail too (spec 3.2 [R]): complete the formatting reward.
            fmt = StepFormat(**turn.info["format"])
            succeeded = sum(1 for r in results if r.ok)
            self._set_format(turn.info, StepFormat(**{**asdict(fmt), "n_success": succeeded}))
        content = f"<response>\n{body}\n</response>"
        generated = bool(turn.info.get("turn_end_generated"))
        return Observation(
            self.markers(state).user_turn(content, turn_end_generated=generated), kind="tool_response"
        )

    def render_answer(self, answer: str) -> str:
        # a complete (minimal) final step: the paper's format needs both blocks (portool.md §2.3)
        call = [{"name": RESPONSE_GEN, "arguments": {"response": answer}}]
        return f"<think></think>\n<tool_call>{json.dumps(call)}</tool_call>"

    def extract_answer(self, text: str) -> str | None:
        """The ``response`` argument of the text's response_gen call, or None."""
        parsed = self.parse_step(text)
        for slot in parsed.slots:
            if slot.name == RESPONSE_GEN and slot.arguments is not None:
                response = slot.arguments.get("response")
                return response if isinstance(response, str) else None
        return None
