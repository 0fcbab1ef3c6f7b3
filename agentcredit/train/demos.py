"""Programmatic demonstrations: a scripted policy per (task, protocol) that writes what a competent agent writes.

A small model must learn the text format before RL (SmolLM2-135M never follows a tool format zero-shot), so SFT
starts from these. Each scripted policy is a function ``(example, turn_index, last_observation) -> text``; the
episode is played through the real protocol and the real tools (:func:`agentcredit.rollout.replay.replay`), so
observations in the demonstrations are exactly what the environment returns.

The scripts encode *when* to call a tool: arith-tools answers easy questions directly and computes the others in
Python (the carl-segment paper's "2+2 vs 347x28"); multi-hop tasks search once per hop. With ``tool_share`` the
arith-tools script instead calls the tool on that fixed share of questions whatever their tier (chosen by a stable
hash of the question id), so SFT teaches the format but leaves *when to call* for RL to learn.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentcredit.tasks import Example
from agentcredit.tasks.example import stable_int

ScriptedPolicy = Callable[[Example, int, str | None], str]


def _hops(example: Example) -> list[tuple[str, str, str]]:
    """(subject, relation, object) per hop: kb-multihop's chain, or HotpotQA-style supporting titles."""
    chain = example.info.get("chain")
    if chain:
        return [tuple(hop) for hop in chain]
    titles = example.info.get("supporting_titles") or []
    return [(t, "", "") for t in titles]


def _relation_text(relation: str) -> str:
    return relation.replace("_", " ")


def _first_sentence(observation: str | None, name: str) -> str:
    """The sentence of a search result that mentions ``name`` (what a good extraction keeps)."""
    if not observation:
        return ""
    for sentence in re.split(r"(?<=[.!?])\s+", observation):
        if name and name.lower() in sentence.lower() and "Doc " not in sentence[:6]:
            return sentence.strip()
    return ""


def calls_tool(example: Example, tool_share: float | None) -> bool:
    """Whether the scripted agent computes an arithmetic question with the tool.

    ``tool_share=None``: by tier (easy questions are answered directly). Otherwise on that share of questions,
    independent of the tier: a stable hash of the question id, the same in every process.
    """
    if tool_share is None:
        return example.info.get("tier") != "easy"
    if not 0.0 <= tool_share <= 1.0:
        raise ValueError(f"tool_share must be in [0, 1], got {tool_share}")
    return stable_int("demo-tool-share", example.id) % 10_000 < round(tool_share * 10_000)


#: What a demonstration replayed under one of codefence's prompt modes does (``demo_prompts``): the no-tool prompt
#: answers directly (carl-segment App. C, Prompt 1: "Do not use any tools or code"), the forced prompt calls the
#: tool (Prompt 2: "You must use a Python code block"). Under the protocol's own prompt ``tool_share`` decides.
PROMPT_TOOL_SHARE: dict[str, float] = {"no_tool": 0.0, "forced": 1.0}


def demo_prompt(example_id: str, shares: Mapping[str, float]) -> str:
    """The prompt mode a question's demonstration is replayed under: ``shares`` (mode -> share, summing to 1)
    split the questions by a stable hash of the id, the same in every process and independent of the tier and of
    ``calls_tool``'s hash. Modes are taken in sorted order, so the assignment does not depend on the mapping's."""
    if not shares:
        raise ValueError("demo prompt shares must name at least one prompt mode")
    if any(v < 0 for v in shares.values()) or abs(sum(shares.values()) - 1.0) > 1e-6:
        raise ValueError(f"demo prompt shares must be >= 0 and sum to 1, got {dict(shares)}")
    point = stable_int("demo-prompt", example_id) % 10_000
    edge = 0
    modes = sorted(m for m in shares if shares[m] > 0)
    for mode in modes:
        edge += round(shares[mode] * 10_000)
        if point < edge:
            return mode
    return modes[-1]  # rounding: the last mode takes the remainder


# ------------------------------------------------------------------------------------------------ direct answers
#: How an arithmetic demonstration that does not call the tool writes its answer (``start.sft.direct_answers``):
#: ``plain`` states the result (``28+15 = 43.``); ``worked`` shows the steps where the expression has a shape
#: :func:`worked_steps` works (``28+10 = 38, 38+5 = 43.``) and states the result otherwise.
DIRECT_ANSWERS = ("plain", "worked")


def _minus_one_digit(a: int, b: int) -> list[str]:
    """``a - b`` for a one-digit ``b``: down to the ten first when the difference crosses one (``15-8``:
    ``15-5 = 10, 10-3 = 7``), directly otherwise (``18-6 = 12``, ``20-3 = 17``: already on a ten)."""
    units = a % 10
    if a >= 10 and 0 < units < b:
        ten = a - units
        return [f"{a}-{units} = {ten}", f"{ten}-{b - units} = {ten - (b - units)}"]
    return [f"{a}-{b} = {a - b}"]


def worked_steps(kind: str, operands: Sequence[int]) -> str | None:
    """The steps of a direct answer that shows its working, or None where the shape has no worked form.

    - a sum or difference with a two-digit (or longer) second operand goes tens first:
      ``28+15`` -> ``28+10 = 38, 38+5 = 43``; ``47-28`` -> ``47-20 = 27, 27-7 = 20, 20-1 = 19``;
    - a difference with a one-digit second operand that crosses a ten goes down to the ten first:
      ``15-8`` -> ``15-8: 15-5 = 10, 10-3 = 7`` (the expression first: the steps do not name the 8);
    - a product of two operands of at most 10 counts up by the larger: ``7*4`` ->
      ``4 times 7: 7, 14, 21, 28, so 7*4 = 28``;
    - every other shape (a sum with a one-digit second operand, a difference that stays within its ten, the
      medium tier's two-digit x one-digit products and every hard kind) has none: it is answered directly.

    The shapes and texts are the ones measured by the probe recorded with the arith-tool-can-hurt study's start
    selection (docs/results/arith-tool-can-hurt/; steps: 0.750 vs plain 0.500 on 16 easy training questions),
    plus the crossing-a-ten difference it proposed.
    The last step always ends at the exact value (property-tested over every expression the generator makes).
    """
    if kind in ("add", "sub") and len(operands) == 2:
        a, b = operands
        sign = "+" if kind == "add" else "-"
        if b >= 10:
            tens, units = b - b % 10, b % 10
            mid = a + tens if kind == "add" else a - tens
            steps = [f"{a}{sign}{tens} = {mid}"]
            if units:
                if kind == "add":
                    steps.append(f"{mid}+{units} = {mid + units}")
                else:
                    steps += _minus_one_digit(mid, units)
            return ", ".join(steps)
        if kind == "sub":
            steps = _minus_one_digit(a, b)
            return f"{a}-{b}: " + ", ".join(steps) if len(steps) > 1 else None
        return None
    if kind == "mul" and len(operands) == 2 and max(operands) <= 10 and min(operands) >= 1:
        a, b = operands
        n, m = min(a, b), max(a, b)
        counts = ", ".join(str(m * i) for i in range(1, n + 1))
        return f"{n} times {m}: {counts}, so {a}*{b} = {a * b}"
    return None


def direct_answer(example: Example, direct_answers: str = "plain") -> str:
    """The text of an arithmetic demonstration that answers without the tool, ending as every demonstration does
    (``The answer is \\boxed{<answer>}.``, what the codefence protocol reads)."""
    if direct_answers not in DIRECT_ANSWERS:
        raise ValueError(f"direct_answers must be one of {list(DIRECT_ANSWERS)}, got {direct_answers!r}")
    answer = example.answers[0]
    steps = None
    if direct_answers == "worked" and "kind" in example.info and "operands" in example.info:
        steps = worked_steps(example.info["kind"], tuple(example.info["operands"]))
    text = steps if steps is not None else f"{example.info['expression']} = {answer}"
    return f"{text}. The answer is \\boxed{{{answer}}}."


# ------------------------------------------------------------------------------------------------ codefence
def codefence_policy(
    example: Example,
    turn: int,
    observation: str | None,
    *,
    tool_share: float | None = None,
    direct_answers: str = "plain",
) -> str:
    """carl-segment format: invoke (```python), assimilate (<context>), commit (\\boxed{}).

    ``direct_answers``: how an arithmetic answer without the tool is written (:func:`direct_answer`)."""
    answer = example.answers[0]
    if example.task == "arith-tools" or "expression" in example.info:
        if not calls_tool(example, tool_share):
            return direct_answer(example, direct_answers)
        expression = example.info["expression"]
        if turn == 0:
            return f"This needs exact arithmetic, so I will compute it.\n```python\nprint({expression})\n```"
        if turn == 1:
            value = (observation or "").strip().splitlines()
            value = next((v for v in value if v.strip() and "```" not in v), answer)
            return f"<context>{expression} = {value.strip()}</context>"
        return f"The answer is \\boxed{{{answer}}}."
    hops = _hops(example)
    step, phase = divmod(turn, 2)
    if step < len(hops):
        subject, relation, obj = hops[step]
        if phase == 0:
            return f"I will look up {subject}.\n```python\nprint(search({json.dumps(subject)}))\n```"
        fact = (
            f"{subject} {_relation_text(relation)} {obj}."
            if relation
            else _first_sentence(observation, subject)
        )
        return f"<context>{fact or subject}</context>"
    return f"The answer is \\boxed{{{answer}}}."


# ------------------------------------------------------------------------------------------------ tags
def tags_policy(
    example: Example,
    turn: int,
    observation: str | None,
    *,
    style: str = "search-r1",
    search: Callable[[str], str] | None = None,
) -> str:
    """Search-R1 / ASearcher / TIPS formats: one search per hop, then the answer; arithmetic is answered directly.
    ``search(query)`` writes a search call as the protocol's style does (the tags protocol's ``render_search``;
    default ``<search>query</search>``).

    ASearcher (carl-critical) makes reading a separate action: after an ``<information>`` block the protocol opens
    a ``<think>`` and the read action writes the extracted fact and closes it.
    """
    answer = example.answers[0]
    hops = _hops(example)
    if style == "asearcher" and observation is not None and observation.rstrip().endswith("<think>"):
        step = turn // 2  # actions alternate: search, read, search, read, ...
        subject, relation, obj = hops[min(step, len(hops) - 1)]
        fact = (
            f"{subject} {_relation_text(relation)} {obj}."
            if relation
            else _first_sentence(observation, subject)
        )
        return f"{fact or subject}</think>"
    searches = turn // 2 if style == "asearcher" else turn
    if not hops or searches >= len(hops):
        thought = "I can answer this directly." if not hops else "I have found the answer."
        return f"<think>{thought}</think>\n<answer>{answer}</answer>"
    subject = hops[searches][0]
    call = search(subject) if search is not None else f"<search>{subject}</search>"
    return f"<think>I need information about {subject}.</think>\n{call}"


# ------------------------------------------------------------------------------------------------ jsoncall
def _call(name: str, arguments: dict) -> str:
    return "<tool_call>" + json.dumps([{"name": name, "arguments": arguments}]) + "</tool_call>"


def jsoncall_policy(example: Example, turn: int, observation: str | None) -> str:
    """PORTool format: <think> + <tool_call>[...] per step, ending with response_gen."""
    answer = example.answers[0]
    final = "<think>I can now answer.</think>\n" + _call("response_gen", {"response": answer})
    if example.task == "arith-tools" or "expression" in example.info:
        if example.info.get("tier") == "easy" or turn > 0:
            return final
        expression = example.info["expression"]
        return "<think>I will compute this exactly.</think>\n" + _call(
            "math_calculation", {"expression": expression}
        )
    hops = _hops(example)
    if turn < len(hops):
        subject = hops[turn][0]
        return f"<think>I need information about {subject}.</think>\n" + _call(
            "knowledge_search", {"query": subject}
        )
    return final


# ------------------------------------------------------------------------------------------------ chat
def demo_turns(example: Example) -> list[list[tuple[str, dict]]] | None:
    """The tool calls a task file scripts for an example (``info["demo_calls"]``), or None when it has none.

    ``demo_calls`` is a list of turns, each a list of ``{"name": ..., "arguments": {...}}`` calls (a single call
    may stand for a one-call turn); the demonstration makes those calls, one message per turn, then answers
    ``answers[0]``. This is how your own JSONL task gets SFT demonstrations for your own tools.
    """
    turns = example.info.get("demo_calls")
    if turns is None:
        return None
    where = f"example {example.id!r}: info.demo_calls"
    if not isinstance(turns, list):
        raise ValueError(f"{where} must be a list of turns, got {type(turns).__name__}")
    out = []
    for i, turn in enumerate(turns):
        calls = [turn] if isinstance(turn, dict) else turn
        if not isinstance(calls, list) or not calls:
            raise ValueError(f"{where}[{i}] must be a call or a non-empty list of calls")
        parsed = []
        for j, call in enumerate(calls):
            if not (isinstance(call, dict) and isinstance(call.get("name"), str)):
                raise ValueError(f"{where}[{i}][{j}] must be {{'name': str, 'arguments': {{...}}}}")
            arguments = call.get("arguments", {})
            if not isinstance(arguments, dict):
                raise ValueError(f"{where}[{i}][{j}].arguments must be an object")
            parsed.append((call["name"], arguments))
        out.append(parsed)
    return out


def _argument_checks(schemas: Sequence[Mapping[str, Any]]) -> dict[str, tuple[Any, set[str]]]:
    """tool name -> (its argument check, its parameter names), from function schemas."""
    from agentcredit.tools.functions import ArgumentCheck

    tools = {}
    for schema in schemas:
        fn = schema.get("function", schema)
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        tools[fn["name"]] = (ArgumentCheck(fn["name"], params), set(params.get("properties") or {}))
    return tools


def check_demo_calls(
    examples: Sequence[Example],
    schemas: Sequence[Mapping[str, Any]],
    *,
    locate: Mapping[str, str] | None = None,
    max_messages: int | None = None,
) -> list[str]:
    """Every example's ``demo_calls`` checked against the tools' schemas before any work: a call of a tool that does
    not exist, an argument the tool does not take, a missing required argument or a value of the wrong type (where
    the schema gives one) raises one ValueError naming the file, line and call (``locate``: example id ->
    ``"<file> line <n>"``, :func:`agentcredit.tasks.registry.example_locations`), and how many other rows are bad.

    Returns warnings (not errors: the row is still valid) for demonstrations that need more assistant messages
    (its turns + the answer; its turns alone when ``episode_options.calls_end_episode``) than ``max_messages``,
    the episode cap: SFT would cut them and drop them.

    An example that brings its own tools (``info["episode_options"]["schemas"]``, as BFCL's questions do) is
    checked against those instead of ``schemas``.
    """
    shared = _argument_checks(schemas)
    problems, warnings = [], []
    for example in examples:
        own = (example.info.get("episode_options") or {}).get("schemas")
        tools = shared if own is None else _argument_checks(own)
        where = (locate or {}).get(example.id)
        where = f"{where} (example {example.id!r})" if where else f"example {example.id!r}"
        try:
            turns = demo_turns(example)
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            continue
        if turns is None:
            continue
        for i, turn in enumerate(turns):
            for j, (name, arguments) in enumerate(turn):
                call = f"demo_calls[{i}][{j}] {name}({json.dumps(arguments, ensure_ascii=False)[:120]})"
                if name not in tools:
                    known = ", ".join(sorted(tools)) or "none"
                    problems.append(f"{where}: {call}: no tool is named {name!r} (tools: {known})")
                    continue
                check, known_args = tools[name]
                unknown = sorted(set(arguments) - known_args)
                error = (
                    f"argument(s) {unknown} are not parameters of {name} (it takes {sorted(known_args)})"
                    if unknown
                    else (check.error(arguments) or "").removeprefix("ERROR: ")
                )
                if error:
                    problems.append(f"{where}: {call}: {error}")
        # an episode its calls end (BFCL: the calls are the answer) has no answer message after them
        ends = bool((example.info.get("episode_options") or {}).get("calls_end_episode"))
        needed, parts = (
            (len(turns), f"{len(turns)} tool turns, the last ending the episode")
            if ends
            else (len(turns) + 1, f"{len(turns)} tool turns and the answer")
        )
        if max_messages is not None and needed > max_messages:
            warnings.append(
                f"{where}: its demo_calls need {needed} assistant messages ({parts}) "
                f"but an episode is capped at {max_messages} (the smaller of rollout.max_turns and "
                "protocol.options.max_segments): SFT cuts this demonstration and drops it, and RL episodes that "
                "need as many are cut without an answer; raise the cap"
            )
    if problems:
        more = f" (and {len(problems) - 1} more bad demo_calls)" if len(problems) > 1 else ""
        raise ValueError(problems[0] + more)
    return warnings


def chat_policy(example: Example, turn: int, observation: str | None, *, dialect: str) -> str:
    """The model's own format (protocol ``chat``), calls written in ``dialect``: the example's own
    ``demo_calls`` when its task file gives them (:func:`demo_turns`); otherwise the suite's math_calculation for
    arith-tools (easy questions answered directly) and one knowledge_search per hop for multi-hop tasks."""
    from agentcredit.protocols.native import write_calls

    scripted = demo_turns(example)
    if scripted is not None:
        # BFCL's examples have no text answer: their episode is the calls (the protocol's calls_end_episode)
        return write_calls(scripted[turn], dialect) if turn < len(scripted) else example.answers[0]
    answer = example.answers[0]
    if example.task == "arith-tools" or "expression" in example.info:
        if example.info.get("tier") == "easy" or turn > 0:
            return answer
        return write_calls([("math_calculation", {"expression": example.info["expression"]})], dialect)
    hops = _hops(example)
    if turn < len(hops):
        return write_calls([("knowledge_search", {"query": hops[turn][0]})], dialect)
    return answer


def scripted_policy(
    protocol_name: str,
    protocol: object | None = None,
    *,
    tool_share: float | None = None,
    tokenizer: object | None = None,
    direct_answers: str = "plain",
) -> ScriptedPolicy:
    """The scripted policy for a protocol (its style, for ``tags``, read from the protocol object; the call
    dialect, for ``chat``, from the protocol and ``tokenizer``).

    ``tool_share`` (arith-tools, codefence only): call the tool on that share of questions regardless of tier.
    ``direct_answers`` (arith-tools, codefence only): ``plain`` or ``worked`` direct answers (:func:`direct_answer`).
    """
    if tool_share is not None and protocol_name != "codefence":
        raise ValueError(f"tool_share is implemented for the codefence protocol only, not {protocol_name!r}")
    if direct_answers not in DIRECT_ANSWERS:
        raise ValueError(f"direct_answers must be one of {list(DIRECT_ANSWERS)}, got {direct_answers!r}")
    if direct_answers != "plain" and protocol_name != "codefence":
        raise ValueError(
            f"direct_answers={direct_answers!r} is implemented for the codefence protocol only, not {protocol_name!r}"
        )
    if protocol_name == "codefence":
        return lambda example, turn, observation: codefence_policy(
            example, turn, observation, tool_share=tool_share, direct_answers=direct_answers
        )
    if protocol_name == "jsoncall":
        return jsoncall_policy
    if protocol_name == "tags":
        style = getattr(protocol, "style", "search-r1")
        search = getattr(protocol, "render_search", None)
        return lambda example, turn, observation: tags_policy(
            example, turn, observation, style=style, search=search
        )
    if protocol_name == "chat":
        if tokenizer is None:
            raise ValueError("chat demonstrations need the tokenizer (its template decides the call dialect)")
        dialect = protocol.dialect_for(tokenizer)  # type: ignore[union-attr]
        return lambda example, turn, observation: chat_policy(example, turn, observation, dialect=dialect)
    raise ValueError(f"no scripted demonstrations for protocol {protocol_name!r}; use rejection sampling")
