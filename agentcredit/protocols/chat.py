"""Chat-turn markers as plain text, for protocols whose observations are new chat turns (tips, jsoncall, chat).

The engine builds contexts by appending token ids and never re-renders the chat template mid-episode
(portool.md section 2.9; carl-segment.md A27). An observation that is a new user turn therefore
carries the template's role markers as plain text: tokenised alone, ``<|im_start|>`` still becomes the special
token id. :meth:`ChatMarkers.from_tokenizer` reads the markers off a tokenizer's own chat template, so the same
protocol works for ChatML models (Qwen, SmolLM2) and others (Llama 3).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

_PROBE_USER = "AGENTCREDIT-PROBE-USER"
_PROBE_ASSISTANT = "AGENTCREDIT-PROBE-ASSISTANT"
_PROBE_OBSERVATION = "AGENTCREDIT-PROBE-OBSERVATION"


@dataclass(frozen=True)
class ChatMarkers:
    """The template text around a user turn that follows an assistant turn.

    Attributes:
        turn_end: what ends the assistant's turn; the model samples it as its EOS token.
        user_open: template text after ``turn_end`` up to the user content.
        user_close: template text after the user content up to the next assistant content (the
            generation prompt included).
    """

    turn_end: str = "<|im_end|>"
    user_open: str = "\n<|im_start|>user\n"
    user_close: str = "<|im_end|>\n<|im_start|>assistant\n"

    def user_turn(self, content: str, *, turn_end_generated: bool) -> str:
        """A user turn appended after a policy segment; adds ``turn_end`` when the model did not emit it."""
        head = "" if turn_end_generated else self.turn_end
        return f"{head}{self.user_open}{content}{self.user_close}"

    def ends_turn(self, text: str, finish: str) -> bool:
        """Whether a segment already holds its end-of-turn token (it stopped at EOS, or the text shows it)."""
        return finish == "eos" or (bool(self.turn_end) and text.rstrip().endswith(self.turn_end))

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, *, chat_template: str | None = None) -> ChatMarkers:
        """Read the markers off ``tokenizer``'s chat template (or ``chat_template``, one of its named ones) by
        rendering a three-turn probe conversation."""
        probe = [
            {"role": "user", "content": _PROBE_USER},
            {"role": "assistant", "content": _PROBE_ASSISTANT},
            {"role": "user", "content": _PROBE_OBSERVATION},
        ]
        try:
            rendered = tokenizer.apply_chat_template(
                probe,
                tokenize=False,
                add_generation_prompt=True,
                **({"chat_template": chat_template} if chat_template else {}),
            )
        except Exception as exc:  # a template that cannot render this is unusable for multi-turn protocols
            raise ValueError(
                f"cannot read chat markers from the tokenizer's chat template ({type(exc).__name__}: {exc}); "
                "pass chat_markers=ChatMarkers(...) explicitly"
            ) from exc
        a_end = rendered.find(_PROBE_ASSISTANT)
        o_start = rendered.find(_PROBE_OBSERVATION)
        if a_end < 0 or o_start < a_end:
            raise ValueError(
                "the chat template did not render the probe conversation in order; "
                "pass chat_markers=ChatMarkers(...) explicitly"
            )
        between = rendered[a_end + len(_PROBE_ASSISTANT) : o_start]
        after = rendered[o_start + len(_PROBE_OBSERVATION) :]
        # The turn end is the special token the template puts right after assistant content (the model's EOS).
        specials = sorted(getattr(tokenizer, "all_special_tokens", []) or [], key=len, reverse=True)
        eos = getattr(tokenizer, "eos_token", None)
        candidates = ([eos] if eos else []) + specials
        turn_end = next((tok for tok in candidates if tok and between.startswith(tok)), "")
        return cls(turn_end=turn_end, user_open=between[len(turn_end) :], user_close=after)


#: ChatML (Qwen2.5, SmolLM2): the default when no tokenizer is at hand.
CHATML = ChatMarkers()


_PROBE_CALL_ID = "probe0001"  # 9 characters: Mistral's templates reject other tool-call id lengths
_PROBE_RESULTS = ("AGENTCREDIT-PROBE-RESULT-ONE", "AGENTCREDIT-PROBE-RESULT-TWO")
_PROBE_TOOL = {
    "type": "function",
    "function": {"name": "probe", "description": "probe", "parameters": {"type": "object", "properties": {}}},
}


@dataclass(frozen=True)
class ToolTurns:
    """The template text around tool results that follow an assistant turn calling tools.

    A tool turn is ``[turn_end] + open + r1 + separator + r2 + ... + close``: ``open`` holds everything after
    the assistant's end-of-turn token up to the first result (Qwen's ``\n<|im_start|>user\n<tool_response>\n``,
    Llama 3's ``<|start_header_id|>ipython<|end_header_id|>\n\n``), ``separator`` what lies between two results,
    and ``close`` what follows the last one, the next assistant header included. ``json_quoted``: the template
    writes a result as a JSON string (Llama 3.1 applies ``tojson`` to tool content).

    Read off a template, the text around results is the probe's: a template that numbers results with their call
    ids (Mistral's ``"call_id"``) gets the probe's id in every result, since the model's calls carry none.
    """

    turn_end: str = "<|im_end|>"
    open: str = "\n<|im_start|>tool\n"
    separator: str = "<|im_end|>\n<|im_start|>tool\n"
    close: str = "<|im_end|>\n<|im_start|>assistant\n"
    json_quoted: bool = False

    def render(self, outputs: list[str], *, turn_end_generated: bool) -> str:
        """The tool turn(s) carrying ``outputs`` in call order, appended after a policy segment."""
        if self.json_quoted:
            outputs = [json.dumps(o, ensure_ascii=False) for o in outputs]
        head = "" if turn_end_generated else self.turn_end
        return head + self.open + self.separator.join(outputs) + self.close

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ToolTurns:
        """Read the tool-turn text off ``tokenizer``'s chat template by rendering a probe conversation.

        The probe is a user turn, an assistant turn calling one tool, and two tool results, rendered with a tool
        list (so a tokenizer with named templates uses its tool-use one, as the prompt does). ``open`` is the text
        between the last end-of-turn token before the first result and that result; only the rendering with the
        results is read, since templates may render an assistant turn differently when it is the last one (Qwen3
        adds an empty think block). A template that cannot render a ``tool`` role (it raises, or drops the results)
        is a ValueError: pass ``tool_turns=`` explicitly.
        """
        call = {"type": "function", "id": _PROBE_CALL_ID, "function": {"name": "probe", "arguments": {}}}
        head = [
            {"role": "user", "content": _PROBE_USER},
            {"role": "assistant", "content": "", "tool_calls": [call]},
        ]
        results = [
            {"role": "tool", "content": r, "tool_call_id": _PROBE_CALL_ID, "name": "probe"}
            for r in _PROBE_RESULTS
        ]
        try:
            template = tokenizer.get_chat_template(None, tools=[_PROBE_TOOL])
        except Exception:  # a tokenizer object without the lookup: its apply_chat_template picks
            template = None
        try:
            full = tokenizer.apply_chat_template(
                head + results, tools=[_PROBE_TOOL], chat_template=template, tokenize=False,
                add_generation_prompt=True,
            )  # fmt: skip
        except Exception as exc:
            raise ValueError(
                f"the chat template cannot render tool results ({type(exc).__name__}: {exc}); "
                "pass tool_turns=ToolTurns(...) explicitly"
            ) from exc
        one, two = (full.find(r) for r in _PROBE_RESULTS)
        turn_end = ChatMarkers.from_tokenizer(tokenizer, chat_template=template).turn_end
        cut = full.rfind(turn_end, 0, one) if turn_end and one >= 0 else -1
        if one < 0 or two < one or cut < 0:
            raise ValueError(
                "the chat template did not render the tool results after an ended assistant turn; "
                "pass tool_turns=ToolTurns(...) explicitly"
            )
        quoted = full[one - 1 : one] == '"' and full[two - 1 : two] == '"'
        q = 1 if quoted else 0
        return cls(
            turn_end=turn_end,
            open=full[cut + len(turn_end) : one - q],
            separator=full[one + len(_PROBE_RESULTS[0]) + q : two - q],
            close=full[two + len(_PROBE_RESULTS[1]) + q :],
            json_quoted=quoted,
        )
