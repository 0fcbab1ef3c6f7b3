"""PORTool's tool suite: 17 tools with JSON schemas and offline, deterministic backends (portool.md §2.5).

* ``math_calculation``, ``conversion_calculation`` and the ``timestamp_*`` tools really compute.
* ``knowledge_search`` is BM25 over a local corpus (by default a small packaged one; pass ``search=`` for
  HotpotQA or any JSONL corpus); ``entity_labels`` look pages up by title.
* The time-sensitive tools (news, weather, flights, stocks, sports, maps, holidays) answer from dated fixture
  tables under ``agentcredit/data/tools/`` and say in their descriptions that they are simulated.
* Arguments are validated with ``jsonschema`` first; a bad call returns an ``ERROR: ...`` text (the paper's
  verbatim texts where §2.5.4 gives them), never an exception.
* ``response_gen`` ends the episode (the jsoncall protocol decides that); here it returns its ``response``.

>>> tools = build_suite()
>>> tools["math_calculation"]({"expression": "add(9, 2030 - 2023)"})
'{"result": 16}'
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError, best_match

from agentcredit.tools.base import ToolFn, ToolRuntime
from agentcredit.tools.search import BM25Search, Passage, Retriever, read_corpus
from agentcredit.tools.suite import maths, simulated, timestamps, units
from agentcredit.tools.suite.data import DEFAULT_NOW, SuiteContext, UserLocation, data_path, norm
from agentcredit.tools.suite.schemas import TOOL_NAMES, TOOL_SPECS

__all__ = [
    "DEFAULT_NOW",
    "TOOL_NAMES",
    "SuiteContext",
    "UserLocation",
    "build_suite",
    "suite_runtime",
    "suite_schemas",
    "validate_arguments",
]

Impl = Callable[[dict[str, Any], SuiteContext], Any]


def suite_schemas() -> list[dict[str, Any]]:
    """The 17 tools as OpenAI-style function schemas, the list the PORTool system prompt renders as {tool_json}."""
    return [{"type": "function", "function": copy.deepcopy(spec)} for spec in TOOL_SPECS]


_VALIDATORS = {spec["name"]: jsonschema.Draft202012Validator(spec["parameters"]) for spec in TOOL_SPECS}


def validate_arguments(name: str, arguments: Any) -> str | None:
    """None if ``arguments`` fit tool ``name``'s schema, else the ``ERROR: ...`` text the model sees."""
    if name not in _VALIDATORS:
        return f"ERROR: unknown tool {name!r}; available: {', '.join(sorted(TOOL_NAMES))}"
    if not isinstance(arguments, dict):
        return f"ERROR: the arguments of {name} must be a JSON object (a dictionary), got {_json_type(arguments)}"
    error = best_match(_VALIDATORS[name].iter_errors(arguments))
    return None if error is None else _schema_error_text(name, error)


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _schema_error_text(name: str, error: ValidationError) -> str:
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    if error.validator == "required":
        return f"ERROR: invalid arguments for {name}: {error.message}"
    if error.validator == "enum":
        allowed = ", ".join(json.dumps(v) for v in error.validator_value)
        return f"ERROR: invalid arguments for {name}: {where} must be one of {allowed}, got {json.dumps(error.instance)}"
    if error.validator == "type":
        return (
            f"ERROR: invalid arguments for {name}: {where or 'arguments'} must be of type {error.validator_value}, "
            f"got {_json_type(error.instance)}"
        )
    if error.validator == "maxItems" and where == "to_units":
        return f"ERROR: invalid arguments for {name}: to_units must contain only one element (the single target unit)"
    return f"ERROR: invalid arguments for {name}: {where + ': ' if where else ''}{error.message}"


# ----------------------------------------------------------------------------------------- list tools


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _sort_list(args: dict[str, Any], ctx: SuiteContext) -> Any:
    prop = args["property"]
    for i, item in enumerate(args["list"]):
        if prop not in item:
            raise ValueError(f"ERROR: list[{i}] has no property {prop!r}")
        if not _is_number(item[prop]):
            raise ValueError(
                f"ERROR: list[{i}].{prop} must be a number to sort by it, got {json.dumps(item[prop])}"
            )
    descending = args.get("order", "ascending") == "descending"
    return {"result": sorted(args["list"], key=lambda item: item[prop], reverse=descending)}


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
}


def _filter_list(args: dict[str, Any], ctx: SuiteContext) -> Any:
    prop, op, value = args["property"], args["operator"], args["value"]
    ordered = op not in ("==", "!=")
    if ordered and not (_is_number(value) or isinstance(value, str)):
        raise ValueError(f"ERROR: operator {op} needs a number or a string value, got {json.dumps(value)}")
    kept, missing = [], 0
    for i, item in enumerate(args["list"]):
        if prop not in item:
            missing += 1
            continue
        x = item[prop]
        if ordered and not (
            (_is_number(x) and _is_number(value)) or (isinstance(x, str) and isinstance(value, str))
        ):
            raise ValueError(
                f"ERROR: list[{i}].{prop} = {json.dumps(x)} cannot be compared with {json.dumps(value)} using {op}"
            )
        if _COMPARE[op](x, value):
            kept.append(item)
    out: dict[str, Any] = {"result": kept}
    if missing:
        out["items_without_property"] = missing
    return out


# ----------------------------------------------------------------------------------------- knowledge


def _knowledge_search(retriever: Retriever, k: int) -> Impl:
    def run(args: dict[str, Any], ctx: SuiteContext) -> str:
        query = args["query"]
        chosen: list[Passage] = []
        for label in args.get("entity_labels") or []:
            page = _page_for_label(retriever, label)
            if page is not None and page not in chosen:
                chosen.append(page)
        # The labelled pages are kept (the model asked for them); query hits fill up to k passages.
        limit = max(k, len(chosen))
        for hit in retriever.retrieve(query, limit) if query.strip() else []:
            if len(chosen) < limit and hit.passage not in chosen:
                chosen.append(hit.passage)
        if not chosen:
            if not query.strip():
                return "ERROR: the query is empty; write what to search for"
            return f"No relevant passages found for the query {query!r}."
        return "\n".join(f"[{i}] Title: {p.title}\n{p.text}" for i, p in enumerate(chosen, start=1))

    return run


def _page_for_label(retriever: Retriever, label: str) -> Passage | None:
    """Page lookup: the passage titled ``label``, else the best BM25 hit whose title contains all its words."""
    if not label.strip():
        return None
    exact = retriever.by_title(label)
    if exact:
        return exact[0]
    words = norm(label).split()
    for hit in retriever.retrieve(label, 5):
        title = f" {norm(hit.passage.title)} "
        if all(f" {w} " in title for w in words):
            return hit.passage
    return None


def default_knowledge_retriever() -> BM25Search:
    """BM25 over the small packaged knowledge corpus (for examples and tests; pass a real corpus to train)."""
    from importlib import resources

    with resources.as_file(data_path("knowledge.jsonl")) as path:
        return BM25Search(read_corpus(path), use_cache=False)


# ----------------------------------------------------------------------------------------- assembly


def _calc(args: dict[str, Any], ctx: SuiteContext) -> Any:
    return {"result": maths.render(maths.evaluate(args["expression"], seed=ctx.seed))}


def _response_gen(args: dict[str, Any], ctx: SuiteContext) -> str:
    return args["response"]  # pass-through (portool.md §2.3 [R]); the protocol ends the episode


_ERRORS = (ValueError,)  # every tool-level failure in the backends is a ValueError subclass with the message


def _wrap(name: str, impl: Impl, ctx: SuiteContext) -> ToolFn:
    def tool(arguments: dict[str, Any]) -> str:
        problem = validate_arguments(name, arguments)
        if problem is not None:
            return problem
        try:
            result = impl(arguments, ctx)
        except _ERRORS as exc:
            message = str(exc)
            return message if message.startswith("ERROR:") else f"ERROR: {message}"
        return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)

    tool.__name__ = name
    tool.__doc__ = next(s["description"] for s in TOOL_SPECS if s["name"] == name)
    return tool


def build_suite(
    search: Retriever | str | os.PathLike[str] | None = None,
    *,
    context: SuiteContext | None = None,
    knowledge_k: int = 3,
) -> dict[str, ToolFn]:
    """All 17 tools by name. ``search`` backs ``knowledge_search``: a retriever (BM25Search, DenseSearch), a
    path to a JSONL corpus, or None for the packaged sample corpus. ``context`` fixes the clock and location."""
    if knowledge_k < 1:
        raise ValueError(f"knowledge_k must be >= 1, got {knowledge_k}")
    ctx = context or SuiteContext()
    if search is None:
        retriever: Retriever = default_knowledge_retriever()
    elif isinstance(search, str | os.PathLike):
        retriever = BM25Search.from_jsonl(Path(search))
    else:
        retriever = search
    impls: dict[str, Impl] = {
        "news_search": simulated.news_search,
        "weather_search": simulated.weather_search,
        "flights_search": simulated.flights_search,
        "stocks_search": simulated.stocks_search,
        "sports_search": simulated.sports_search,
        "maps_search": simulated.maps_search,
        "conversion_calculation": lambda a, c: units.convert(a),
        "math_calculation": _calc,
        "get_current_context": timestamps.get_current_context,
        "timestamp_comparator": timestamps.timestamp_comparator,
        "sort_list": _sort_list,
        "holiday_search": simulated.holiday_search,
        "knowledge_search": _knowledge_search(retriever, knowledge_k),
        "filter_list": _filter_list,
        "timestamp_converter": timestamps.timestamp_converter,
        "timestamp_interval_calculator": timestamps.timestamp_interval_calculator,
        "response_gen": _response_gen,
    }
    assert list(impls) == TOOL_NAMES, "every schema needs a backend and vice versa"
    return {name: _wrap(name, impl, ctx) for name, impl in impls.items()}


def suite_runtime(
    search: Retriever | str | os.PathLike[str] | None = None,
    *,
    context: SuiteContext | None = None,
    knowledge_k: int = 3,
    max_workers: int = 8,
) -> ToolRuntime:
    """A ToolRuntime over the suite: the calls of one step run concurrently on its thread pool."""
    return ToolRuntime(build_suite(search, context=context, knowledge_k=knowledge_k), max_workers=max_workers)
