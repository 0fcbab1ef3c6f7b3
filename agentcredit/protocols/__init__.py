"""Text protocols: how an agent's output is cut into segments and tool calls, and how observations look.

``get_protocol(name, **options)`` builds one by name:

* ``codefence``: carl-segment's Python code fences, ``<context>`` extraction and ``\\boxed{}`` answer.
* ``tags``: ``<search>`` / ``<information>`` / ``<answer>`` in the styles of Search-R1, ASearcher
  (carl-critical, read and access actions) and TIPS (verl tool calling).
* ``jsoncall``: PORTool's ``<think>`` + ``<tool_call>[JSON]`` steps, ``response_gen`` and the formatting reward.
* ``chat``: the model's own tool calling: tools rendered by its chat template, calls in its dialect (Hermes/Qwen,
  Llama 3, Mistral), results as the template's tool turns.
"""

from __future__ import annotations

import inspect
from typing import Any

from agentcredit.protocols.base import EpisodeState, FinishReason, Observation, Protocol, Turn
from agentcredit.protocols.chat import CHATML, ChatMarkers
from agentcredit.protocols.codefence import CodeFenceProtocol
from agentcredit.protocols.jsoncall import (
    JsonCallProtocol,
    StepFormat,
    format_reward_raw,
    rescale_format_reward,
)
from agentcredit.protocols.native import ChatToolProtocol
from agentcredit.protocols.tags import TagsProtocol

PROTOCOLS: dict[str, type[Protocol]] = {
    "codefence": CodeFenceProtocol,
    "tags": TagsProtocol,
    "jsoncall": JsonCallProtocol,
    "chat": ChatToolProtocol,
}


def protocol_options(name: str) -> dict[str, Any]:
    """The options ``name`` accepts, with their defaults."""
    cls = _lookup(name)
    params = inspect.signature(cls.__init__).parameters
    return {p.name: p.default for p in params.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}


def get_protocol(name: str, **options: Any) -> Protocol:
    """Build the protocol ``name`` with ``options``; an unknown option is a ValueError naming the allowed ones."""
    allowed = protocol_options(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"protocol {name!r}: unknown option(s) {unknown}; allowed: {sorted(allowed)}")
    return PROTOCOLS[name](**options)


def _lookup(name: str) -> type[Protocol]:
    if name not in PROTOCOLS:
        raise ValueError(f"unknown protocol {name!r}; choose one of {sorted(PROTOCOLS)}")
    return PROTOCOLS[name]


__all__ = [
    "CHATML",
    "PROTOCOLS",
    "ChatMarkers",
    "ChatToolProtocol",
    "CodeFenceProtocol",
    "EpisodeState",
    "FinishReason",
    "JsonCallProtocol",
    "Observation",
    "Protocol",
    "StepFormat",
    "TagsProtocol",
    "Turn",
    "format_reward_raw",
    "get_protocol",
    "protocol_options",
    "rescale_format_reward",
]
