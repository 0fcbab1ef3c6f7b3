"""carl-segment's code-fence protocol: invoke / assimilate / commit segments (carl-segment.md section 2).

One assistant turn, cut at structurally observable boundaries (spec 2.1):

* **invoke**: reasoning plus a Python code block; ends at the closing fence of an open ```python block. The
  engine runs the code (``ToolCall("python", {"code": ...})``; the sandbox provides ``search()`` and
  ``math``) and appends its stdout in the fixed wrapper of spec 2.4 / A3 as a *transient* observation.
* **assimilate**: reads the raw output and writes ``<context>...</context>``; ends at ``</context>``, which is
  armed only right after a tool output. In replacement mode (the paper's, default) the raw output is then
  removed from the context (Eqs. 8-9): the observation is ``transient=True`` and the assimilate turn has
  ``drop_transient=True``. Budget T_assimilate = 256 tokens (Tab. 5).
* **commit**: the final answer in ``\\boxed{}``; ends at EOS.

Boundary rules (spec section 9): A28, an invoke fires only when a line equal to ```` ``` ```` closes an open
```` ```python ```` / ```` ```py ```` block of the current segment; any other fence lets generation go on; an
unclosed block at EOS is a commit. A5, an assimilate that reaches EOS without ``</context>`` is a commit (the
raw output stays), and one cut by its budget is closed by an environment-appended ``</context>`` (not trained)
and the episode goes on. A6, at most 15 segments: a tool call is allowed only while invoke + assimilate +
commit still fit, otherwise the segment is a forced commit (no fence stop).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from agentcredit.protocols._text import TAIL_WINDOW, tail_contains
from agentcredit.protocols.base import EpisodeState, FinishReason, Observation, Protocol, Turn, check_results
from agentcredit.tasks.scoring import extract_boxed
from agentcredit.tools.base import ToolCall, ToolResult

# --- System prompts: carl-segment.md section 2.3, verbatim from the paper's App. C ("System prompt templates").
#: Prompt 1, "No-tool direct answer".
NO_TOOL_PROMPT = "Answer the following question directly. Do not use any tools or code. Provide your answer inside \\boxed{}."
#: Prompt 2, "Forced tool use".
FORCED_TOOL_PROMPT = (
    "You must use a Python code block to help answer this question. Use search(query) for retrieval or write "
    "arithmetic code. After seeing tool output, write a <context> block extracting the relevant information, "
    "then provide your answer inside \\boxed{}."
)
#: Prompt 3, "Optional tool use (Tier 2)": prompt 2 with "You may optionally use" for "You must use" (the
#: paper states the substitution; carl-segment.md §2.3 spells it out). The default for PPO and evaluation (carl-segment.md A1).
OPTIONAL_TOOL_PROMPT = (
    "You may optionally use a Python code block to help answer this question. Use search(query) for retrieval "
    "or write arithmetic code. After seeing tool output, write a <context> block extracting the relevant "
    "information, then provide your answer inside \\boxed{}."
)
#: Prompt 4, "Multi-hop forced tool use": prompt 2 plus the paper's additional instruction, appended (spec [R]).
MULTIHOP_TOOL_PROMPT = (
    FORCED_TOOL_PROMPT
    + " This question may require multiple search steps. You may call tools more than once."
)
SYSTEM_PROMPTS: dict[str, str] = {
    "no_tool": NO_TOOL_PROMPT,
    "forced": FORCED_TOOL_PROMPT,
    "optional": OPTIONAL_TOOL_PROMPT,
    "multihop": MULTIHOP_TOOL_PROMPT,
}

# --- Tool output wrapper: spec 2.4 and A3, "\n```output\n" + stdout + "\n```\n". It belongs to o_raw, so the
# replacement removes it with the output.
OUTPUT_OPEN = "\n```output\n"
OUTPUT_CLOSE = "\n```\n"
CONTEXT_CLOSE = "</context>"
#: Spec 2.5 / Tab. 5: max segments per episode, and the assimilate budget T_assimilate.
MAX_SEGMENTS = 15
T_ASSIMILATE = 256
#: Info strings that open a block the invoke rule watches (A28 names ```python and ```py; python3 is the
#: same language, so we accept it too).
PYTHON_FENCE_LANGS = frozenset({"python", "py", "python3"})

# A line equal to ``` (indentation and trailing spaces allowed): the only thing the per-token tail check
# looks for.
_BARE_FENCE_LINE = re.compile(r"^[ \t]*```[ \t]*$", re.MULTILINE)


@dataclass(frozen=True)
class CodeBlock:
    """A ```python block closed by a fence line: its code and the span of the closing fence line."""

    code: str
    close_start: int
    close_end: int


def _fence_lines(text: str) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of every fence line: optional indentation, then three backticks, then anything.

    Written with ``str.find`` (C speed, no per-character Python loop and no regex over the whole text), since
    it runs over the whole segment each time the tail shows a bare fence.
    """
    pos, n = 0, len(text)
    while (i := text.find("```", pos)) >= 0:
        start = text.rfind("\n", 0, i) + 1
        end = text.find("\n", i)
        end = n if end < 0 else end
        if not text[start:i].strip(" \t"):  # only indentation before the backticks: a fence line
            yield start, end
        pos = end + 1


def find_invoke_block(text: str) -> CodeBlock | None:
    """The first ```python / ```py block in ``text`` that a line equal to ```` ``` ```` closes (spec A28).

    A small CommonMark-style fence state machine: outside a block, a fence line opens one (a python block if its
    info string is python/py/python3, an *other* block otherwise, a bare fence included); inside a block, only a
    bare fence line closes it, and other fence lines are content. Only a closed python block counts; an other
    block's closing fence does not fire (generation resumes), and an unclosed block returns None.
    """
    open_kind: str | None = None  # None (outside), "python" or "other"
    code_start = 0
    for start, end in _fence_lines(text):
        stripped = text[start:end].strip()
        if open_kind is None:
            info = stripped[3:].strip().lower()
            open_kind = "python" if info in PYTHON_FENCE_LANGS else "other"
            code_start = end + 1  # the code starts after the opening line's newline
        elif stripped == "```":
            if open_kind == "python":
                code = text[code_start:start] if start > code_start else ""
                return CodeBlock(code=code.removesuffix("\n"), close_start=start, close_end=end)
            open_kind = None
    return None


def _bare_fence_in_tail(text: str) -> bool:
    """Cheap tail test: is there a line equal to ```` ``` ```` among the last TAIL_WINDOW characters?

    Constant cost per call. A fence line that the last token completed always lies in the tail, even when the
    same token went on to the next line; a false "yes" (an old fence of another block, or a long line cut by
    the window) only costs one full parse, which then says no.
    """
    return _BARE_FENCE_LINE.search(text, max(0, len(text) - TAIL_WINDOW)) is not None


class CodeFenceProtocol(Protocol):
    """carl-segment's format: Python code fences, raw stdout, ``<context>`` extraction, ``\\boxed{}`` answer.

    Args:
        prompt: which of the four system prompts of carl-segment.md §2.3 to use: ``optional`` (default, A1, for PPO
            and evaluation), ``forced``, ``multihop`` (warm-up, A32) or ``no_tool``.
        system_prompt: a custom system prompt instead of the four (then ``prompt`` is ignored).
        replacement: remove the raw tool output from the context after the assimilate (paper default, Eq. 9).
            False keeps it (the observation is not transient): an ablation.
        tools: allow tool calls at all; None means "unless prompt is no_tool" (then every episode is one
            commit segment with no fence stop, as in the paper's no-tool rollouts).
        max_segments: segment cap per episode (Tab. 5: 15).
        assimilate_tokens: token budget of an assimilate segment (Tab. 5: T_assimilate = 256).
        tool_name: name of the Python tool in the tool runtime.
    """

    name = "codefence"

    def __init__(
        self,
        *,
        prompt: str = "optional",
        system_prompt: str | None = None,
        replacement: bool = True,
        tools: bool | None = None,
        max_segments: int = MAX_SEGMENTS,
        assimilate_tokens: int = T_ASSIMILATE,
        tool_name: str = "python",
    ) -> None:
        if prompt not in SYSTEM_PROMPTS:
            raise ValueError(f"codefence: prompt must be one of {sorted(SYSTEM_PROMPTS)}, got {prompt!r}")
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ValueError(f"codefence: system_prompt must be a string or None, got {system_prompt!r}")
        if not isinstance(max_segments, int) or max_segments < 1:
            raise ValueError(f"codefence: max_segments must be an integer >= 1, got {max_segments!r}")
        if not isinstance(assimilate_tokens, int) or assimilate_tokens < 1:
            raise ValueError(
                f"codefence: assimilate_tokens must be an integer >= 1, got {assimilate_tokens!r}"
            )
        if not tool_name:
            raise ValueError("codefence: tool_name must be a non-empty string")
        self.prompt_name = prompt
        self.system_prompt = system_prompt if system_prompt is not None else SYSTEM_PROMPTS[prompt]
        self.replacement = bool(replacement)
        self.tools = (prompt != "no_tool") if tools is None else bool(tools)
        self.max_segments = max_segments
        self.assimilate_tokens = assimilate_tokens
        self.tool_name = tool_name

    # -- state ---------------------------------------------------------------------------------------------
    @staticmethod
    def after_tool(state: EpisodeState) -> bool:
        """The next segment is an assimilate: the last segment was an invoke, whose output was appended."""
        last = state.last
        return last is not None and last.kind == "invoke"

    def tools_allowed(self, state: EpisodeState) -> bool:
        """A tool call is allowed only if invoke + assimilate + commit still fit in the cap (spec 2.6, A6)."""
        return self.tools and state.n_turns + 2 < self.max_segments

    # -- prompt --------------------------------------------------------------------------------------------
    def messages(self, state: EpisodeState) -> list[dict[str, str]]:
        # Spec A2: system = the prompt, user = the question; tool output is spliced inside the assistant turn.
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": state.question},
        ]

    # -- generation control --------------------------------------------------------------------------------
    def segment_ends(self, state: EpisodeState, text: str) -> bool:
        if self.after_tool(state):
            return tail_contains(text, (CONTEXT_CLOSE,))
        if not self.tools_allowed(state):
            return False  # forced commit: EOS or the budget ends it
        # The full fence parse runs only when the tail holds a bare fence line, i.e. a few times per segment.
        return _bare_fence_in_tail(text) and find_invoke_block(text) is not None

    def stop_strings(self, state: EpisodeState) -> list[str]:
        if self.after_tool(state):
            return [CONTEXT_CLOSE]
        return ["```"] if self.tools_allowed(state) else []

    def max_new_tokens(self, state: EpisodeState, default: int) -> int:
        return min(default, self.assimilate_tokens) if self.after_tool(state) else default

    # -- reading output ------------------------------------------------------------------------------------
    def read_segment(self, state: EpisodeState, text: str, finish: FinishReason) -> Turn:
        info: dict[str, Any] = {"finish": finish}
        if self.after_tool(state):
            turn = self._read_assimilate(text, finish, info)
        else:
            turn = self._read_invoke_or_commit(state, text, finish, info)
        if not turn.done and state.n_turns + 1 >= self.max_segments:
            # Unreachable with the forced-commit rule unless the cap is tiny; kept so the cap always holds.
            turn.done, turn.calls, turn.answer = True, [], None
            turn.info["cut"] = "max_segments"
        return turn

    def _read_assimilate(self, text: str, finish: FinishReason, info: dict[str, Any]) -> Turn:
        if CONTEXT_CLOSE in text:
            return Turn("assimilate", drop_transient=self.replacement, info=info)
        if finish == "length":
            # A5(b): close the extraction with an environment-appended </context> and splice it in place of
            # the raw output (observation() appends the tag).
            info["truncated"] = True
            return Turn("assimilate", drop_transient=self.replacement, info=info)
        # A5(a): EOS before </context> -> a commit conditioned on the raw output, which stays in the context.
        info["error"] = "assimilate ended without </context>; read as the commit"
        return self._commit(text, finish, info)

    def _read_invoke_or_commit(
        self, state: EpisodeState, text: str, finish: FinishReason, info: dict[str, Any]
    ) -> Turn:
        if self.tools_allowed(state):
            block = find_invoke_block(text)
            if block is not None:
                trailing = text[block.close_end :].strip()
                if trailing:  # only when a backend did not stop at the fence; the code still runs
                    info["text_after_fence"] = trailing[:200]
                call = ToolCall(self.tool_name, {"code": block.code}, raw=block.code)
                return Turn("invoke", calls=[call], info=info)
        elif self.tools:
            info["forced_commit"] = True
        return self._commit(text, finish, info)

    def _commit(self, text: str, finish: FinishReason, info: dict[str, Any]) -> Turn:
        answer = self.extract_answer(text)
        if finish == "length":
            info["truncated"] = True
        if answer is None:
            info.setdefault("error", "no \\boxed{} answer in the commit")
        return Turn("commit", done=True, answer=answer, info=info)

    def observation(
        self, state: EpisodeState, turn: Turn, results: Sequence[ToolResult]
    ) -> Observation | None:
        check_results(self.name, turn, results)
        if turn.kind == "invoke":
            # Trailing newlines of stdout are dropped so print()'s newline does not leave a blank line before
            # the wrapper's own "\n```" (the wrapper itself is verbatim, spec A3).
            stdout = results[0].output.rstrip("\n")
            return Observation(
                OUTPUT_OPEN + stdout + OUTPUT_CLOSE, transient=self.replacement, kind="tool_output"
            )
        if turn.kind == "assimilate" and turn.info.get("truncated"):
            return Observation(CONTEXT_CLOSE, transient=False, kind="context_close")
        return None

    def extract_answer(self, text: str) -> str | None:
        # Spec A16: the last brace-balanced \boxed{...} of the commit segment.
        return extract_boxed(text)

    def render_answer(self, answer: str) -> str:
        return f"\\boxed{{{answer}}}"
