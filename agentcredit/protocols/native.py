"""The model's own tool-call format (protocol ``chat``): tools shown by its chat template, calls in its dialect.

A model tuned for tool use (Qwen2.5/3, Hermes, Llama 3.x, Mistral) already knows one way to see tools and call
them: its chat template renders ``apply_chat_template(messages, tools=schemas)`` and teaches a call syntax.
This protocol uses both instead of a format of ours, so such a model is trained in the format it was tuned on:

* **prompt**: the template with ``tools=`` (OpenAI-style function schemas). A template that ignores ``tools``
  (SmolLM2's) gets them in a system message written in the Hermes format, and is parsed as Hermes.
* **calls**, by dialect (read off the template's text, or set with ``dialect=``):
  ``hermes`` -- ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call (Qwen, Hermes);
  ``llama3`` -- the message is one JSON object ``{"name": ..., "parameters": {...}}``, optionally after
  ``<|python_tag|>`` (Llama 3.1-3.3 JSON tool calling); ``mistral`` -- ``[TOOL_CALLS]`` then a JSON array of
  ``{"name", "arguments"}`` objects, or ``[TOOL_CALLS]name[ARGS]{...}`` per call (newer Mistral templates).
* **results** come back as the template's own tool-role turn(s), appended as text read off the template
  (:class:`~agentcredit.protocols.chat.ToolTurns`), never by re-rendering earlier turns.

Segments are assistant messages: one that calls a tool is an ``invoke``; one that calls none is the final
answer, a ``commit`` whose text (think blocks removed) is the answer. A call that does not parse runs nothing and
comes back as an ``ERROR:`` tool result naming what is wrong; the episode goes on. The tools' argument checks
are the tools' own (:class:`~agentcredit.tools.functions.FunctionTool` validates against its schema).

Per episode (``new_episode(question, **options)``; an example's ``info["episode_options"]``, see
:mod:`agentcredit.rollout.engine`): ``schemas`` replaces the protocol's tools for that episode (BFCL: each question
has its own functions), ``system_prompt`` is added to the system message, and ``calls_end_episode`` makes the first
message the whole episode: its calls are the answer, never run, written as ``{"calls": [{"name", "arguments"}]}``
(the calls that parsed) and a message without a call as ``{"text": ...}`` (single-turn function-calling
benchmarks score the calls themselves).

Every step also carries PORTool's formatting reward (``turn.info["format_reward"]``), with one adaptation: the
rubric's think-block item is always met, since this format has no required reasoning block; the other items
(a call block, valid JSON, name/arguments fields, the share of calls that succeeded) are the paper's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from agentcredit.protocols._text import tail_contains
from agentcredit.protocols.base import EpisodeState, FinishReason, Observation, Protocol, Turn, check_results
from agentcredit.protocols.chat import _PROBE_TOOL, ToolTurns
from agentcredit.protocols.jsoncall import StepFormat, normalise_schema, set_format_reward
from agentcredit.tools.base import ToolCall, ToolResult

DIALECTS = ("hermes", "llama3", "mistral")
_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
_MISTRAL_NAMED = re.compile(r"\[TOOL_CALLS\]\s*([A-Za-z_][\w.-]*)\s*\[ARGS\]")

#: The tool list for a template that does not render ``tools=``: the Hermes format, in our words.
HERMES_TOOLS_PROMPT = (
    "You can call tools. Their signatures, as JSON schemas:\n<tools>\n{tools}\n</tools>\n\n"
    "To call a tool, write a JSON object with its name and arguments between <tool_call> and </tool_call>:\n"
    '<tool_call>\n{{"name": "<tool name>", "arguments": {{"<argument>": <value>}}}}\n</tool_call>\n'
    "You may call several tools in one message, one block each. Their results come back in the next turn. "
    "When you have the answer, reply with it without a tool call."
)

#: carl-segment's prompt modes (carl-segment.md §2.3) in this format, so its critic warm-up (tier labels from no-tool
#: rollouts, forced-tool rollouts) runs on the chat protocol too: the paper's sentences without the code-block and
#: \boxed{} wording, added to the system message. ``no_tool`` also shows no tools and reads every message as the
#: answer; ``optional`` (the default, for training and evaluation) adds nothing.
PROMPT_MODES: dict[str, str] = {
    "optional": "",
    "forced": "You must use a tool to help answer this question.",
    "multihop": "You must use a tool to help answer this question. This question may require multiple tool "
    "calls. You may call tools more than once.",
    "no_tool": "Answer the following question directly. Do not use any tools.",
}


def detect_dialect(template: str) -> str | None:
    """The call dialect a chat template's source teaches, or None when it shows no tool calling."""
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<tool_call>" in template:
        return "hermes"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3"
    return None


def _strip_think(text: str) -> str:
    return _THINK.sub("", text)


@dataclass(frozen=True)
class CallSlot:
    """One call the message tried to make, in message order: the parsed call, or what is wrong with it.

    ``problem``: ``"json"`` (the call does not parse, or its block is not closed) or ``"fields"`` (it parses but
    lacks a ``name`` string or an ``arguments`` object); the two weigh differently in the formatting reward.
    """

    call: ToolCall | None
    error: str | None = None
    problem: str | None = None


@dataclass(frozen=True)
class ParsedCalls:
    """The calls of one assistant message. ``attempted``: it tries to call a tool at all (a call block, a
    ``[TOOL_CALLS]`` marker, a Llama-style JSON call), whether or not its calls parse."""

    slots: list[CallSlot] = field(default_factory=list)
    attempted: bool = False

    @property
    def calls(self) -> list[ToolCall]:
        return [s.call for s in self.slots if s.call is not None]

    @property
    def errors(self) -> list[str]:
        return [s.error for s in self.slots if s.error is not None]


def _call_object(index: int, data: Any, args_key: str = "arguments") -> CallSlot:
    """A ``{"name": str, "arguments": {...}}`` object as a call, or the error naming what is wrong."""
    if not isinstance(data, dict):
        return CallSlot(
            None, f"tool call {index + 1} must be a JSON object, got {type(data).__name__}", "fields"
        )
    name = data.get("name")
    arguments = data.get(args_key, data.get("arguments", data.get("parameters", {})))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        decoded, _ = _json(index, arguments)
        arguments = decoded if decoded is not None else arguments
    if not isinstance(name, str) or not name:
        return CallSlot(None, f'tool call {index + 1} has no "name" string', "fields")
    if not isinstance(arguments, dict):
        return CallSlot(None, f'tool call {index + 1} ({name}): "{args_key}" must be a JSON object', "fields")
    raw = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return CallSlot(ToolCall(name, arguments, raw=raw))


def _json(index: int, text: str) -> tuple[Any, str | None]:
    # ValueError beyond JSONDecodeError: an integer over Python's 4300-digit limit; RecursionError: deep nesting.
    # A model can write either (a run of digits cut by the budget), and read_segment must never raise.
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, f"tool call {index + 1} is not valid JSON ({exc.msg} at column {exc.colno})"
    except (ValueError, RecursionError) as exc:
        return None, f"tool call {index + 1} is not valid JSON ({type(exc).__name__}: {str(exc)[:100]})"


def _json_objects(text: str) -> tuple[list[Any], str | None]:
    """Llama 3 may write several JSON calls separated by ';': decode them one after another (json's raw_decode)."""
    decoder, found, i = json.JSONDecoder(), [], 0
    while i < len(text):
        try:
            data, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            return found, f"tool call {len(found) + 1} is not valid JSON ({exc.msg} at column {exc.colno})"
        except (ValueError, RecursionError) as exc:  # see _json
            return found, f"tool call {len(found) + 1} is not valid JSON ({type(exc).__name__})"
        found.append(data)
        while i < len(text) and (text[i].isspace() or text[i] == ";"):
            i += 1
    return found, None


def _decoded(index: int, text: str, make: Any) -> CallSlot:
    data, error = _json(index, text)
    return CallSlot(None, error, "json") if error else make(data)


def parse_calls(text: str, dialect: str) -> ParsedCalls:
    """The tool calls in one assistant message, one slot per call it tried to make, in order."""
    body = _strip_think(text)
    if dialect == "hermes":
        blocks = _HERMES_BLOCK.findall(body)
        slots = [
            _decoded(i, content.strip(), lambda d, i=i: _call_object(i, d))
            if close
            else CallSlot(None, f"tool call {i + 1} has no closing </tool_call>", "json")
            for i, (content, close) in enumerate(blocks)
        ]
        return ParsedCalls(slots, bool(blocks))
    if dialect == "llama3":
        stripped = body.replace("<|python_tag|>", "").strip()
        if "<|python_tag|>" in body and not stripped.startswith("{"):
            # Llama's built-in tools (brave_search.call(...)): not JSON tool calling, which is what runs here
            return ParsedCalls(
                [CallSlot(None, "only JSON tool calls are supported, not <|python_tag|> code", "json")], True
            )
        # A final answer may start with "{" too ({"answer": 3}, a set): only a JSON object naming a tool is a call
        if not (stripped.startswith("{") and '"name"' in stripped[:200]):
            return ParsedCalls()
        objects, error = _json_objects(stripped)
        slots = [_call_object(i, data, "parameters") for i, data in enumerate(objects)]
        return ParsedCalls(slots + ([CallSlot(None, error, "json")] if error else []), True)
    if dialect == "mistral":
        if "[TOOL_CALLS]" not in body:
            return ParsedCalls()
        named = list(_MISTRAL_NAMED.finditer(body))
        if named:  # [TOOL_CALLS]name[ARGS]{...} per call
            slots = []
            for i, match in enumerate(named):
                end = named[i + 1].start() if i + 1 < len(named) else len(body)
                make = lambda d, i=i, name=match[1]: _call_object(i, {"name": name, "arguments": d})  # noqa: E731
                slots.append(_decoded(i, body[match.end() : end].strip(), make))
            return ParsedCalls(slots, True)
        data, error = _json(0, body.split("[TOOL_CALLS]", 1)[1].strip())
        if error:
            return ParsedCalls([CallSlot(None, error, "json")], True)
        items = data if isinstance(data, list) else [data]
        if not items:
            return ParsedCalls(
                [CallSlot(None, "[TOOL_CALLS] holds an empty list; include at least one call", "fields")],
                True,
            )
        return ParsedCalls([_call_object(i, item) for i, item in enumerate(items)], True)
    raise ValueError(f"chat: unknown dialect {dialect!r}; choose one of {list(DIALECTS)}")


def write_calls(calls: Sequence[tuple[str, Mapping[str, Any]]], dialect: str) -> str:
    """``(name, arguments)`` calls written the way ``dialect`` writes them (what :func:`parse_calls` reads)."""
    if dialect == "hermes":
        return "\n".join(
            "<tool_call>\n" + json.dumps({"name": n, "arguments": a}, ensure_ascii=False) + "\n</tool_call>"
            for n, a in calls
        )
    if dialect == "llama3":
        return "; ".join(json.dumps({"name": n, "parameters": a}, ensure_ascii=False) for n, a in calls)
    if dialect == "mistral":
        return "[TOOL_CALLS] " + json.dumps(
            [{"name": n, "arguments": a} for n, a in calls], ensure_ascii=False
        )
    raise ValueError(f"chat: unknown dialect {dialect!r}; choose one of {list(DIALECTS)}")


class ChatToolProtocol(Protocol):
    """The policy's own chat-template tool calling; see the module docstring.

    Args:
        schemas: the tools shown to the model, OpenAI-style (``{"type": "function", "function": {...}}``) or flat
            ``{"name", "description", "parameters"}``; the environment passes its tools' schemas.
        dialect: ``auto`` (read off the template, Hermes when it shows none) or one of :data:`DIALECTS`.
        system_prompt: an optional system message before the question.
        prompt: one of :data:`PROMPT_MODES`: ``optional`` (default), or ``forced`` / ``multihop`` / ``no_tool`` for
            carl-segment's critic warm-up; ``no_tool`` shows no tools and every message is the final answer.
        max_segments: assistant messages per episode; the episode is cut with no answer at the cap.
        tool_turns: the tool-turn text; default: read off the tokenizer's template in ``prompt()``.
        format_reward_bound: the range of the rescaled PORTool formatting reward.
    """

    name = "chat"

    def __init__(
        self,
        *,
        schemas: Sequence[Mapping[str, Any]] = (),
        dialect: str = "auto",
        system_prompt: str = "",
        prompt: str = "optional",
        max_segments: int = 8,
        tool_turns: ToolTurns | None = None,
        format_reward_bound: float = 0.25,
    ) -> None:
        if isinstance(schemas, Mapping | str) or not isinstance(schemas, Sequence):
            raise ValueError(f"chat: schemas must be a list of tool schemas, got {type(schemas).__name__}")
        if dialect != "auto" and dialect not in DIALECTS:
            raise ValueError(f"chat: dialect must be 'auto' or one of {list(DIALECTS)}, got {dialect!r}")
        if prompt not in PROMPT_MODES:
            raise ValueError(f"chat: prompt must be one of {sorted(PROMPT_MODES)}, got {prompt!r}")
        if not isinstance(max_segments, int) or max_segments < 1:
            raise ValueError(f"chat: max_segments must be an integer >= 1, got {max_segments!r}")
        if tool_turns is not None and not isinstance(tool_turns, ToolTurns):
            raise ValueError(f"chat: tool_turns must be a ToolTurns, got {type(tool_turns).__name__}")
        self.schemas = [normalise_schema(i, s, owner="chat") for i, s in enumerate(schemas)]
        self.dialect = dialect
        self.system_prompt = system_prompt
        self.prompt_name = prompt
        self.tools = prompt != "no_tool"
        self.max_segments = max_segments
        self.tool_turns = tool_turns
        self.format_reward_bound = float(format_reward_bound)
        # what prompt() reads off a template, per tokenizer (held, so its id is never reused while cached)
        self._templates: dict[int, tuple[Any, bool, str, ToolTurns | None]] = {}

    # -- prompt --------------------------------------------------------------------------------------------
    def episode_schemas(self, state: EpisodeState) -> list[dict[str, Any]]:
        """The tools of this episode: its own ``schemas`` option when it has one, else the protocol's."""
        own = state.extra.get("schemas")
        if own is None:
            return self.schemas
        return [normalise_schema(i, s, owner="chat (episode schemas)") for i, s in enumerate(own)]

    def messages(self, state: EpisodeState) -> list[dict[str, str]]:
        parts = (self.system_prompt, state.extra.get("system_prompt", ""), PROMPT_MODES[self.prompt_name])
        system = " ".join(part for part in parts if part)
        schemas = self.episode_schemas(state)
        if state.extra.get("tools_in_system") and schemas:
            tools = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
            system = (system + "\n\n" if system else "") + HERMES_TOOLS_PROMPT.format(tools=tools)
        head = [{"role": "system", "content": system}] if system else []
        return [*head, {"role": "user", "content": state.question}]

    def prompt(self, state: EpisodeState, tokenizer: Any) -> str:
        """The question rendered by the template with the tools; reads the dialect and tool turns off it."""
        shows_tools, dialect, turns = self._read_template(tokenizer)
        schemas = self.episode_schemas(state)
        shows_tools = shows_tools and self.tools and bool(schemas)
        state.extra.update(dialect=dialect, tools_in_system=self.tools and bool(schemas) and not shows_tools)
        if dialect == "llama3" and "<|eom_id|>" in getattr(tokenizer, "all_special_tokens", ()):
            state.extra["message_ends"] = ["<|eom_id|>"]
        if self.tool_turns is None:
            state.extra["tool_turns"] = turns
        messages = self.messages(state)
        if shows_tools:
            return tokenizer.apply_chat_template(
                messages, tools=schemas, tokenize=False, add_generation_prompt=True
            )
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _read_template(self, tokenizer: Any) -> tuple[bool, str, ToolTurns | None]:
        """(the template shows ``tools=``, the call dialect, its tool turns), read once per tokenizer."""
        key = id(tokenizer)
        if key not in self._templates:
            # a protocol whose tools come per episode (schemas=[]) asks with a probe tool: whether a template shows
            # tools does not depend on which
            shows_tools = _renders_tools(tokenizer, self.schemas or [_PROBE_TOOL])
            detected = detect_dialect(_template_source(tokenizer))
            if self.schemas and not shows_tools:  # the tools go in a system message in the Hermes format
                if self.dialect not in ("auto", "hermes"):
                    raise ValueError(
                        f"chat: the chat template does not show tools, so they are listed in the Hermes format; "
                        f"dialect {self.dialect!r} cannot be used with it (use 'auto' or 'hermes')"
                    )
                dialect = "hermes"
            elif self.dialect != "auto":
                dialect = self.dialect
            elif detected is None and shows_tools and self.schemas:
                raise ValueError(
                    "chat: the chat template shows tools but teaches none of the call syntaxes "
                    f"{list(DIALECTS)}; set protocol.options.dialect"
                )
            else:
                dialect = detected or "hermes"
            turns = ToolTurns.from_tokenizer(tokenizer) if self.tool_turns is None else None
            self._templates[key] = (tokenizer, shows_tools, dialect, turns)
        return self._templates[key][1:]

    def dialect_for(self, tokenizer: Any) -> str:
        """The call dialect this protocol parses for ``tokenizer``'s template."""
        return self._read_template(tokenizer)[1]

    def turns(self, state: EpisodeState) -> ToolTurns:
        return self.tool_turns or state.extra.get("tool_turns") or ToolTurns()

    # -- generation control --------------------------------------------------------------------------------
    def stop_strings(self, state: EpisodeState) -> list[str]:
        """The end-of-turn token, and Llama 3's end-of-message token ``<|eom_id|>`` (which its template teaches a
        model to end a tool-calling message with when tools are on, and which is not the tokenizer's EOS)."""
        turn_end = self.turns(state).turn_end
        return [turn_end] * bool(turn_end) + list(state.extra.get("message_ends", ()))

    def segment_ends(self, state: EpisodeState, text: str) -> bool:
        # An assistant message ends at EOS (the end-of-turn token); the text check covers a backend that
        # decodes special tokens without stopping on them.
        return tail_contains(text, self.stop_strings(state))

    # -- reading output ------------------------------------------------------------------------------------
    def read_segment(self, state: EpisodeState, text: str, finish: FinishReason) -> Turn:
        dialect = state.extra.get("dialect") or (self.dialect if self.dialect != "auto" else "hermes")
        content = self._content(state, text)
        # no_tool: no tools were shown, so every message is the answer
        parsed = parse_calls(content, dialect) if self.tools else ParsedCalls()
        ends = tuple(self.stop_strings(state))
        generated = finish == "eos" or (bool(ends) and text.rstrip().endswith(ends))
        info: dict[str, Any] = {"finish": finish, "turn_end_generated": generated}
        if finish == "length":
            info["truncated"] = True
        single = bool(state.extra.get("calls_end_episode"))
        if not parsed.attempted:  # no call: the final answer
            turn = Turn("commit", done=True, answer=self.extract_answer(content), info=info)
            if finish == "length":
                turn.answer = None  # a message cut by the budget is no answer
                info["error"] = "the final message was cut by the token budget"
            elif single and turn.answer is not None:
                turn.answer = json.dumps({"text": turn.answer}, ensure_ascii=False)
            set_format_reward(
                info, StepFormat(True, True, True, True, 1, 1 if turn.answer else 0), self.format_reward_bound
            )
            return turn
        turn = Turn("invoke", info=info)
        if parsed.errors:
            info["error"] = "; ".join(parsed.errors)
        if single:  # the calls are the answer, recorded and never run (a done turn's calls are not run)
            turn.done = True
            turn.calls = parsed.calls
            calls = [{"name": c.name, "arguments": c.arguments} for c in parsed.calls]
            turn.answer = json.dumps({"calls": calls}, ensure_ascii=False)
        elif state.n_turns + 1 >= self.max_segments:
            turn.done = True  # the cap: nothing more runs and the episode has no answer
            info["cut"] = "max_segments"
        else:
            turn.calls = parsed.calls
            # every slot in message order: results go back in call order (templates without call ids pair a
            # result with its call by position), a call that did not parse as its error
            index = iter(range(len(turn.calls)))
            info["call_slots"] = [
                {"call_index": next(index)} if slot.call is not None else {"error": slot.error}
                for slot in parsed.slots
            ]
        slots = parsed.slots
        fmt = StepFormat(
            has_think=True,  # the adaptation of the module docstring: this format has no reasoning block
            has_tool_call=True,
            json_ok=not any(slot.problem == "json" for slot in slots),
            fields_ok=not parsed.errors,
            n_calls=len(slots),
            n_success=len(parsed.calls),
        )
        set_format_reward(info, fmt, self.format_reward_bound)
        return turn

    def _content(self, state: EpisodeState, text: str) -> str:
        """The message without its end-of-turn token and anything after it."""
        cut = min(
            (i for i in (text.find(end) for end in self.stop_strings(state)) if i >= 0), default=len(text)
        )
        return text[:cut]

    def observation(
        self, state: EpisodeState, turn: Turn, results: Sequence[ToolResult]
    ) -> Observation | None:
        check_results(self.name, turn, results)
        slots = turn.info.get("call_slots", ())
        outputs = [
            results[slot["call_index"]].output if "call_index" in slot else f"ERROR: {slot['error']}"
            for slot in slots
        ]
        if not outputs:
            return None
        if "format" in turn.info:  # tool-side ERROR results make a call fail too (PORTool spec 3.2 [R])
            fmt = StepFormat(**turn.info["format"])
            set_format_reward(
                turn.info,
                StepFormat(**{**asdict(fmt), "n_success": sum(r.ok for r in results)}),
                self.format_reward_bound,
            )
        text = self.turns(state).render(outputs, turn_end_generated=bool(turn.info.get("turn_end_generated")))
        return Observation(text, kind="tool_response")

    def render_answer(self, answer: str) -> str:
        return answer

    def extract_answer(self, text: str) -> str | None:
        """The message text without think blocks, when it calls no tool; None for an empty message."""
        answer = _strip_think(text).strip()
        return answer or None


def _template_source(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # a tokenizer with named templates: the tool-use one teaches the calls
        template = template.get("tool_use") or template.get("default") or ""
    return template if isinstance(template, str) else ""


def _renders_tools(tokenizer: Any, schemas: list[dict[str, Any]]) -> bool:
    """Whether the template shows ``tools=`` at all (some accept the argument and ignore it)."""
    probe = [{"role": "user", "content": "?"}]
    try:
        with_tools = tokenizer.apply_chat_template(probe, tools=schemas, tokenize=False)
    except Exception:
        return False
    return with_tools != tokenizer.apply_chat_template(probe, tokenize=False)
