"""Chat-turn markers as plain text, for protocols whose observations are new chat turns (tips, jsoncall).

The engine builds contexts by appending token ids and never re-renders the chat template mid-episode
(issue 4; portool.md section 2.9; carl-segment.md A27). An observation that is a new user turn therefore
carries the template's role markers as plain text: tokenised alone, ``<|im_start|>`` still becomes the special
token id. :meth:`ChatMarkers.from_tokenizer` reads the markers off a tokenizer's own chat template, so the same
protocol works for ChatML models (Qwen, SmolLM2) and others (Llama 3).
"""

from __future__ import annotations

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
    def from_tokenizer(cls, tokenizer: Any) -> ChatMarkers:
        """Read the markers off ``tokenizer``'s chat template by rendering a three-turn probe conversation."""
        probe = [
            {"role": "user", "content": _PROBE_USER},
            {"role": "assistant", "content": _PROBE_ASSISTANT},
            {"role": "user", "content": _PROBE_OBSERVATION},
        ]
        try:
            rendered = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
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
