"""The tag protocol of Search-R1, TIPS and carl-critical: ``<think>``, ``<search>``, ``<information>``, ``<answer>``.

Three styles share the loop "reason, search, read the results, answer":

* ``search-r1`` (default; Search-R1's own generation loop, ``search_r1/llm_agent/generation.py``): one user turn
  with Search-R1's instruction; a segment ends at ``</search>`` or ``</answer>``; the first
  ``<search>``/``<answer>`` tag pair of the segment is its action; a search appends
  ``\\n\\n<information>...</information>\\n\\n`` inline; anything else gets Search-R1's corrective observation
  ("My previous action is invalid. ...") and the episode goes on. ``max_turns`` searches plus a final
  generation: a search in the last allowed segment is not run and the episode ends with no answer.
* ``asearcher`` (carl-critical, carl-critical-actions.md 2.2-2.5, ASearcher's format (a)): a raw-text prompt
  (no chat template) ending in ``Assistant: \\n<think>\\n``; actions ``<search>``, ``<access>`` (option) and
  ``<answer>``; each tool result is appended as ``\\n\\n<information>\\n...\\n</information>\\n<think>\\n`` and
  the next segment is a *read* action that stops at ``</think>`` (option, on by default). A page is read in
  chunks of 25,000 characters, one read action each. EOS ends the episode; the action budget counts reads.
* ``qwen-tools`` (TIPS, tips.md 2.2-2.6, verl's multi-turn tool loop that TIPS's released code runs): Qwen function calling,
  ``<tool_call>{"name": "search", "arguments": {"query_list": [...]}}</tool_call>``, one call per assistant
  turn; the result comes back as a new user turn ``<tool_response>{"result": ...}</tool_response>``, written
  here as plain text with the chat template's role markers (:mod:`agentcredit.protocols.chat`) so the context
  stays a list of appended token ids. A turn without a valid tool call ends the episode. At most 5 assistant
  turns (so at most 4 retrievals).

Every search is ``ToolCall("search", {"query": ...})`` (a TIPS ``query_list`` becomes one call per query, and
their results are joined as verl joins them); an access is ``ToolCall("access", {"url": ...})``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from agentcredit.protocols._text import tail_contains
from agentcredit.protocols.base import EpisodeState, FinishReason, Observation, Protocol, Turn, check_results
from agentcredit.protocols.chat import CHATML, ChatMarkers
from agentcredit.tasks.scoring import extract_tagged
from agentcredit.tools.base import ToolCall, ToolResult

STYLES: tuple[str, ...] = ("search-r1", "asearcher", "qwen-tools")

# --- Search-R1 ------------------------------------------------------------------------------------------------
#: Search-R1's instruction, verbatim from ``make_prefix(template_type="base")`` in
#: PeterGriffinJin/Search-R1, scripts/data_process/nq_search.py (and qa_search_train_merge.py). It is the
#: whole user message (no system message), "your want" typo included.
SEARCH_R1_INSTRUCTION = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query "
    "</search> and it will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)
#: Search-R1's corrective observation for an output with neither a search nor an answer, verbatim from
#: ``execute_predictions`` in search_r1/llm_agent/generation.py.
SEARCH_R1_INVALID_ACTION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)
#: Search-R1's information wrapper (generation.py): f"\n\n<information>{result.strip()}</information>\n\n".
SEARCH_R1_INFORMATION = "\n\n<information>{result}</information>\n\n"
#: Segments per episode: 4 searches plus Search-R1's final no-search generation (its loop runs max_turns
#: search rounds, then one generation with do_search=False). 4 is the retrieval budget TIPS uses for the same
#: task (tips.md 2.5); Search-R1's released train scripts set max_turns=2 (then pass max_segments=3).
SEARCH_R1_MAX_SEGMENTS = 5
_SEARCH_R1_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)

# --- ASearcher (carl-critical) -------------------------------------------------------------------------------
# Verbatim from inclusionAI/ASearcher, AReaL/ASearcher/train/prompts.py (Apache-2.0, see AReaL/LICENSE);
# carl-critical-actions.md 2.3 names this file as format (a). Typos ("cerain", "seperated") are the source's.
ASEARCHER_SEARCH_ACCESS_TEMPLATE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant answers it. The "
    "Assistant analyzes the given question and information in the mind, retains important relevant information, "
    "calls a search engine to find necessary information, accesses web pages with certain urls, and provides the "
    "user with the answer. The Assistant conducts search by <search> query </search>, access cerain url by "
    "<access> url </access>, and the top search results and url page will be returned between <information> and "
    "</information>.  The reasoning processes are enclosed within <think> </think>. Finally, the Assistant "
    "provides answer inside <answer> and </answer>, i.e. <answer> answer here </answer>. If there are multiple "
    "queries, ensure all answers are enclosed within <answer> </answer>, seperated with comma. Note that when "
    "the Assistant finds the question is invalid, e.g. no answer could match all information in the question, "
    "the Assistant replies with '<answer> the question is invalid. </answer>'. \n\nUser: \n\n{question}. \n\nThe "
    "language of your answer should align with the question. \n\nAssistant: \n<think>\n"
)
ASEARCHER_SEARCH_ONLY_TEMPLATE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant answers it. The "
    "Assistant analyzes the given question and information in the mind, retains important relevant information, "
    "calls a search engine to find necessary information, accesses web pages with certain urls, and provides the "
    "user with the answer. The Assistant conducts search by <search> query </search> and the top search results "
    "will be returned between <information> and </information>.  The reasoning processes are enclosed within "
    "<think> </think>. Finally, the Assistant provides answer inside <answer> and </answer>, i.e. <answer> "
    "answer here </answer>. If there are multiple queries, ensure all answers are enclosed within <answer> "
    "</answer>, seperated with comma. Note that when the Assistant finds the question is invalid, e.g. no answer "
    "could match all information in the question, the Assistant replies with '<answer> the question is invalid. "
    "</answer>'. \n\nUser: \n\n{question}. \n\nThe language of your answer should align with the question. "
    "\n\nAssistant: \n<think>\n"
)
#: ASearcher swaps this sentence for ASEARCHER_VALID_SENTENCE on valid questions; carl-critical trains on valid
#: questions only, so the swap is always made (carl-critical-actions.md 2.3 [R]).
ASEARCHER_INVALID_SENTENCE = (
    "Note that when the Assistant finds the question is invalid, e.g. no answer could match all information in "
    "the question, the Assistant replies with '<answer> the question is invalid. </answer>'."
)
ASEARCHER_VALID_SENTENCE = "You should try to find the most likely answer. "
ASEARCHER_NO_RESULTS = "No search results are found."
ASEARCHER_NO_PAGE = "No More Information is Found for this URL."
#: A page is cut to 250,000 characters and read in chunks of 25,000, at most 10 (carl-critical-actions.md 2.3).
ASEARCHER_PAGE_CHARS, ASEARCHER_CHUNK_CHARS, ASEARCHER_MAX_CHUNKS = 250_000, 25_000, 10
#: carl-critical's budget for Qwen2.5-3B/7B: 10 actions, reads included (carl-critical-actions.md 2.2).
ASEARCHER_MAX_SEGMENTS = 10
_ASEARCHER_ACTIONS = ("search", "access", "answer")  # ASearcher's priority when one output holds several

# --- TIPS (verl tool calling) ---------------------------------------------------------------------------------
#: TIPS's system turn as Qwen2.5's chat template renders it with the search tool schema (tips.md 2.3, verbatim;
#: paper Fig. 8). Written out here so that any chat template gets the same text, not only Qwen's.
QWEN_TOOLS_SYSTEM_PROMPT = (
    "You are a helpful and harmless assistant.\n\n# Tools\n\nYou may call one or more functions to assist with "
    "the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "search", "description": "Searches the web for relevant '
    'information based on the given query.", "parameters": {"type": "object", "properties": {"query_list": '
    '{"type": "array", "items": {"type": "string"}, "description": "A list of fully-formed semantic queries. '
    'The tool will return search results for each query."}}, "required": ["query_list"]}}}\n</tools>\n\nFor '
    "each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
#: TIPS's user-message prefix (tips.md 2.3, verbatim from examples/data_preprocess/
#: preprocess_search_r1_dataset.py of TIPS's code); the user message is this prefix + the question.
QWEN_TOOLS_USER_PREFIX = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<tool_call> query </tool_call> and it will return the top searched results between <tool_response> and "
    "</tool_response>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: "
)
#: verl's texts for a search call without results or with bad arguments (verl/tools/search_tool.py and
#: verl/tools/utils/search_r1_like_utils.py), and its separator between the results of several queries.
QWEN_TOOLS_NO_RESULTS = "No search results found."
QWEN_TOOLS_BAD_QUERY_LIST = "Error: 'query_list' is missing, empty, or not a list in parameters."
QWEN_TOOLS_QUERY_SEPARATOR = "\n---\n"
#: multi_turn.max_assistant_turns = 5, i.e. at most 4 retrievals (tips.md 2.5).
QWEN_TOOLS_MAX_SEGMENTS = 5
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

_DEFAULT_MAX_SEGMENTS = {
    "search-r1": SEARCH_R1_MAX_SEGMENTS,
    "asearcher": ASEARCHER_MAX_SEGMENTS,
    "qwen-tools": QWEN_TOOLS_MAX_SEGMENTS,
}
_READ_NEXT = "tags_read_next"  # state.extra key: the next segment is a read action
_QUEUE = "tags_information_queue"  # state.extra key: information still to be read (asearcher)
_MARKERS = "chat_markers"  # state.extra key: the chat markers of the tokenizer that rendered the prompt


class TagsProtocol(Protocol):
    """``<search>`` / ``<information>`` / ``<answer>`` tags in the style of Search-R1, ASearcher or TIPS.

    Args:
        style: ``search-r1`` (default), ``asearcher`` (carl-critical) or ``qwen-tools`` (TIPS).
        read: after each tool result the next segment is a read action ending at ``</think>``
            (carl-critical); default on for asearcher, off for search-r1; not available for qwen-tools.
        access: allow ``<access> url </access>`` actions; default on for asearcher (its search-access
            prompt), off otherwise; with search-r1 it needs an ``instruction`` that describes the tag.
        max_segments: policy segments per episode (reads included): search-r1 5 (4 searches + the final
            generation), asearcher 10, qwen-tools 5.
        instruction: a custom prompt template with a ``{question}`` placeholder: the user message (search-r1,
            qwen-tools) or the whole raw prompt (asearcher).
        chat_markers: role markers for qwen-tools observations; default: read off the tokenizer in ``prompt()``,
            ChatML when no tokenizer was seen.
        search_tool / access_tool: tool names in the tool runtime.
    """

    name = "tags"

    def __init__(
        self,
        *,
        style: str = "search-r1",
        read: bool | None = None,
        access: bool | None = None,
        max_segments: int | None = None,
        instruction: str | None = None,
        chat_markers: ChatMarkers | None = None,
        search_tool: str = "search",
        access_tool: str = "access",
    ) -> None:
        if style not in STYLES:
            raise ValueError(f"tags: style must be one of {list(STYLES)}, got {style!r}")
        if style == "qwen-tools" and (read or access):
            raise ValueError(
                "tags: read and access actions are not part of the qwen-tools style (verl tool calling)"
            )
        read = (style == "asearcher") if read is None else bool(read)
        access = (style == "asearcher") if access is None else bool(access)
        if instruction is not None and (not isinstance(instruction, str) or "{question}" not in instruction):
            raise ValueError(
                f"tags: instruction must be a string with a {{question}} placeholder, got {instruction!r}"
            )
        if access and style == "search-r1" and instruction is None:
            raise ValueError(
                "tags: Search-R1's instruction does not describe <access>; use style='asearcher' or pass an "
                "instruction that does"
            )
        if max_segments is None:
            max_segments = _DEFAULT_MAX_SEGMENTS[style]
        if not isinstance(max_segments, int) or max_segments < 1:
            raise ValueError(f"tags: max_segments must be an integer >= 1, got {max_segments!r}")
        if chat_markers is not None and not isinstance(chat_markers, ChatMarkers):
            raise ValueError(f"tags: chat_markers must be a ChatMarkers, got {type(chat_markers).__name__}")
        if not search_tool or not access_tool:
            raise ValueError("tags: search_tool and access_tool must be non-empty tool names")
        self.style = style
        self.read = read
        self.access = access
        self.max_segments = max_segments
        self.instruction = instruction
        self.chat_markers = chat_markers
        self.search_tool = search_tool
        self.access_tool = access_tool
        stops = ["</search>", "</access>", "</answer>"] if access else ["</search>", "</answer>"]
        self._act_stops: tuple[str, ...] = tuple(stops)

    # -- prompt --------------------------------------------------------------------------------------------
    def prompt_text(self, question: str) -> str:
        """The user message (search-r1, qwen-tools) or raw prompt (asearcher) for ``question``."""
        if self.style == "search-r1":
            # Search-R1's preprocessing strips the question and ends it with "?" (nq_search.py process_fn).
            question = question.strip()
            question = question if question.endswith("?") else question + "?"
            return (self.instruction or SEARCH_R1_INSTRUCTION).replace("{question}", question)
        if self.style == "qwen-tools":
            if self.instruction is not None:
                return self.instruction.replace("{question}", question)
            return QWEN_TOOLS_USER_PREFIX + question  # the code: prefix.rstrip("\n") + question
        template = self.instruction or (
            ASEARCHER_SEARCH_ACCESS_TEMPLATE if self.access else ASEARCHER_SEARCH_ONLY_TEMPLATE
        )
        template = template.replace(ASEARCHER_INVALID_SENTENCE, ASEARCHER_VALID_SENTENCE)
        return template.replace("{question}", question)

    def messages(self, state: EpisodeState) -> list[dict[str, str]]:
        user = {"role": "user", "content": self.prompt_text(state.question)}
        if self.style == "qwen-tools":
            return [{"role": "system", "content": QWEN_TOOLS_SYSTEM_PROMPT}, user]
        return [user]

    def prompt(self, state: EpisodeState, tokenizer: Any) -> str:
        if self.style == "asearcher":
            return self.prompt_text(state.question)  # ASearcher tokenises the raw text, no chat template
        if self.style == "qwen-tools" and self.chat_markers is None:
            state.extra[_MARKERS] = ChatMarkers.from_tokenizer(tokenizer)
        return super().prompt(state, tokenizer)

    def markers(self, state: EpisodeState) -> ChatMarkers:
        return self.chat_markers or state.extra.get(_MARKERS) or CHATML

    # -- generation control --------------------------------------------------------------------------------
    def _read_next(self, state: EpisodeState) -> bool:
        return bool(state.extra.get(_READ_NEXT))

    def stop_strings(self, state: EpisodeState) -> list[str]:
        if self.style == "qwen-tools":
            turn_end = self.markers(state).turn_end
            return [turn_end] if turn_end else []
        return ["</think>"] if self._read_next(state) else list(self._act_stops)

    def segment_ends(self, state: EpisodeState, text: str) -> bool:
        # qwen-tools: the assistant turn ends at EOS (the end-of-turn token is a policy token, tips.md 2.6); the
        # marker check only matters for a backend that decodes special tokens but does not stop on them.
        return tail_contains(text, self.stop_strings(state))

    # -- reading output ------------------------------------------------------------------------------------
    def read_segment(self, state: EpisodeState, text: str, finish: FinishReason) -> Turn:
        info: dict[str, Any] = {"finish": finish}
        if self.style == "qwen-tools":
            turn = self._read_qwen_tools(state, text, finish, info)
        elif self.style == "asearcher":
            turn = self._read_asearcher(state, text, finish, info)
        else:
            turn = self._read_search_r1(state, text, info)
        if not turn.done and state.n_turns + 1 >= self.max_segments:
            # Budget spent: the tool call of this last segment is not run and there is no answer
            # (Search-R1's final generation runs with do_search=False; verl stops at max_assistant_turns).
            turn.done, turn.calls, turn.answer = True, [], None
            turn.info["cut"] = "max_segments"
        return turn

    def _read_search_r1(self, state: EpisodeState, text: str, info: dict[str, Any]) -> Turn:
        match = _SEARCH_R1_ACTION.search(text)  # Search-R1 takes the first search/answer pair
        if match is None and self._read_next(state):
            return Turn("read", info=info)  # a read action: a thought about the information, no tool call
        if match is None:
            info["error"] = "neither <search>...</search> nor <answer>...</answer>"
            return Turn("invalid", info=info)
        action, content = match.group(1), match.group(2).strip()
        if action == "answer":
            return Turn("answer", done=True, answer=content, info=info)
        return Turn(
            "search", calls=[ToolCall(self.search_tool, {"query": content}, raw=match.group())], info=info
        )

    def _read_asearcher(
        self, state: EpisodeState, text: str, finish: FinishReason, info: dict[str, Any]
    ) -> Turn:
        # ASearcher's consume_llm_response: the last match of each action tag, search before access before
        # answer; the episode is over once any output holds an answer, or at EOS.
        found: dict[str, re.Match[str]] = {}
        for action in _ASEARCHER_ACTIONS:
            if action == "access" and not self.access:
                continue
            matches = list(re.finditer(rf"<{action}>(.*?)</{action}>", text, re.DOTALL))
            if matches:
                found[action] = matches[-1]
        answer = self.extract_answer(text)
        kind = "read" if self._read_next(state) else "act"
        if "answer" in found or finish == "eos":
            return Turn("answer" if answer is not None else kind, done=True, answer=answer, info=info)
        for action, tool in (("search", self.search_tool), ("access", self.access_tool)):
            if action in found:
                key = "query" if action == "search" else "url"
                call = ToolCall(tool, {key: found[action].group(1).strip()}, raw=found[action].group())
                return Turn(action, calls=[call], info=info)
        if kind == "act":
            info["error"] = "no <search>, <access> or <answer> action"
        return Turn(kind, info=info)

    def _read_qwen_tools(
        self, state: EpisodeState, text: str, finish: FinishReason, info: dict[str, Any]
    ) -> Turn:
        info["turn_end_generated"] = self.markers(state).ends_turn(text, finish)
        if finish == "length":
            # verl ends the episode on a length limit (tips.md 2.5), even if a tool call made it into the text.
            info["truncated"] = True
            return Turn("answer", done=True, answer=self.extract_answer(text), info=info)
        # verl's Hermes parser: every <tool_call> block whose JSON has "name" and "arguments"; blocks that fail
        # are skipped; only the first call runs (max_parallel_calls = 1).
        parsed: list[tuple[Any, Any, str]] = []
        n_blocks = 0
        for block in _TOOL_CALL_BLOCK.finditer(text):
            n_blocks += 1
            try:
                obj = json.loads(block.group(1))
                parsed.append((obj["name"], obj["arguments"], block.group()))
            except (ValueError, KeyError, TypeError):
                continue
        if not parsed:
            if n_blocks:
                info["error"] = "no <tool_call> block holds valid JSON with name and arguments"
            answer = self.extract_answer(text)
            return Turn("answer", done=True, answer=answer, info=info)
        name, arguments, raw = parsed[0]
        if name != self.search_tool:
            info["error"] = f"unknown tool {name!r}; the only tool is {self.search_tool!r}"
            return Turn("search", info=info)
        queries = arguments.get("query_list") if isinstance(arguments, dict) else None
        if not isinstance(queries, list) or not queries or not all(isinstance(q, str) for q in queries):
            info["error"] = QWEN_TOOLS_BAD_QUERY_LIST
            return Turn("search", info=info)
        calls = [ToolCall(self.search_tool, {"query": q}, raw=raw) for q in queries]
        return Turn("search", calls=calls, info=info)

    # -- observations --------------------------------------------------------------------------------------
    def observation(
        self, state: EpisodeState, turn: Turn, results: Sequence[ToolResult]
    ) -> Observation | None:
        check_results(self.name, turn, results)
        if self.style == "qwen-tools":
            return self._qwen_tools_observation(state, turn, results)
        if self.style == "search-r1":
            obs = self._search_r1_observation(turn, results)
        else:
            obs = self._asearcher_observation(state, turn, results)
        state.extra[_READ_NEXT] = self.read and obs is not None and obs.kind == "information"
        return obs

    def _search_r1_observation(self, turn: Turn, results: Sequence[ToolResult]) -> Observation | None:
        if turn.kind == "invalid":
            return Observation(SEARCH_R1_INVALID_ACTION, kind="invalid_action")
        if not results:
            return None
        text = SEARCH_R1_INFORMATION.replace("{result}", results[0].output.strip())
        if self.read:  # open the thought that the read action closes with </think> (our choice, [R])
            text += "<think>\n"
        return Observation(text, kind="information")

    def _asearcher_observation(
        self, state: EpisodeState, turn: Turn, results: Sequence[ToolResult]
    ) -> Observation | None:
        # ASearcher queues every piece of information (a search result, or each chunk of a page) and shows one
        # per read action, in order; the next act step comes once the queue is empty.
        new: list[str] = []
        if turn.kind == "search":
            new = [results[0].output.strip() or ASEARCHER_NO_RESULTS]
        elif turn.kind == "access":
            new = _page_chunks(results[0].output)
        if not self.read:
            new = new[:1]  # without read actions only the first chunk is shown, right away
        queue = [*state.extra.get(_QUEUE, []), *new]
        if not queue:
            return None  # a read with nothing left to read, or an output with no action: generation goes on
        # Replace, never mutate, extra values: forked states stay independent.
        state.extra[_QUEUE] = queue[1:]
        return Observation(f"\n\n<information>\n{queue[0]}\n</information>\n<think>\n", kind="information")

    def _qwen_tools_observation(
        self, state: EpisodeState, turn: Turn, results: Sequence[ToolResult]
    ) -> Observation:
        if results:
            outputs = [r.output.strip() for r in results]
            result = QWEN_TOOLS_QUERY_SEPARATOR.join(o for o in outputs if o) or QWEN_TOOLS_NO_RESULTS
        else:
            result = turn.info.get("error") or QWEN_TOOLS_NO_RESULTS
        content = (
            "<tool_response>\n" + json.dumps({"result": result}, ensure_ascii=False) + "\n</tool_response>"
        )
        generated = bool(turn.info.get("turn_end_generated"))
        return Observation(
            self.markers(state).user_turn(content, turn_end_generated=generated), kind="tool_response"
        )

    def extract_answer(self, text: str) -> str | None:
        return extract_tagged(text, "answer")

    def render_answer(self, answer: str) -> str:
        # tips.md §2.7: the teacher scores "<answer>" + a + "</answer>" (tags included)
        return f"<answer>{answer}</answer>"

    def render_search(self, query: str) -> str:
        """One search for ``query`` as a policy turn of this style writes it (a scripted demonstration's call):
        ``<search>query</search>``, or in the tool-calling style a ``<tool_call>`` with a one-query ``query_list``."""
        if self.style == "qwen-tools":
            call = json.dumps({"name": "search", "arguments": {"query_list": [query]}})
            return f"<tool_call>\n{call}\n</tool_call>"
        return f"<search>{query}</search>"


def _page_chunks(page: str) -> list[str]:
    """A page as ASearcher reads it: cut to 250,000 characters, chunks of 25,000, at most 10, numbered."""
    page = page[:ASEARCHER_PAGE_CHARS]
    if not page.strip():
        return [ASEARCHER_NO_PAGE]
    chunks = [page[i : i + ASEARCHER_CHUNK_CHARS] for i in range(0, len(page), ASEARCHER_CHUNK_CHARS)]
    return [f">>>> Page {k} >>>>\n\n{c}" for k, c in enumerate(chunks[:ASEARCHER_MAX_CHUNKS], 1)]
