"""BFCL v4 (the Berkeley Function Calling Leaderboard) as a task family, ``bfcl:<category>``, scored by BFCL's checker.

The questions, function documents and possible answers are read from the installed ``bfcl-eval`` package (its
wheel ships ``bfcl_eval/data/BFCL_v4_*.json``), never downloaded. Every verdict comes from bfcl-eval's own code:

* AST categories (``simple_python``, ``multiple``, ``parallel``, ``parallel_multiple``, ``live_simple``,
  ``live_multiple``, ``live_parallel``, ``live_parallel_multiple``): ``bfcl_eval.eval_checker.ast_eval.ast_checker``
  on the calls the model made, after BFCL's own ``is_function_calling_format_output`` check;
* ``irrelevance`` / ``live_irrelevance``: correct when the model made no call, ``live_relevance``: correct when it
  made at least one, both read through BFCL's own ``is_empty_output`` (as its ``_evaluate_single_relevance_entry``).

The model sees the functions as its tools in its own chat template (protocol ``chat``), with their types mapped to
JSON schema by BFCL's own ``convert_to_tool`` (``GORILLA_TO_OPENAPI``; names keep their dots, as BFCL's local
function-calling handlers show them). An episode is one assistant message: its calls are the answer and are never
executed (``episode_options.calls_end_episode``). The protocol writes the answer as ``{"calls": [{name: args}]}``
(the calls that parsed, BFCL's decoded form; a block that does not parse is dropped, as BFCL's Hermes decoder
``QwenFCHandler._extract_tool_calls`` drops it) or ``{"text": ...}`` for a message without a call; None when the
message was cut by the token budget.

Not supported (a clear error): Java / JavaScript (their checker reads Java/JS source values, not JSON arguments),
multi-turn, memory, web search and format sensitivity (they need BFCL's executable back-ends or its prompting
formats).

Installing: ``make setup-bfcl`` (``bfcl-eval`` without its dependencies, which pin numpy==1.26.4 and a dozen provider
SDKs, plus the few packages its checker imports). ``bfcl_eval.constants.model_config`` imports every provider's SDK
only to build ``MODEL_CONFIG_MAPPING``, which the AST checker reads for one thing: whether a model's function names
had their dots replaced by underscores (``underscore_to_dot``). Our prompts keep the dots, so before importing the
checker this module registers a stand-in ``model_config`` whose every entry says ``underscore_to_dot=False`` (what
BFCL's own entries for local function-calling models say); nothing of the checker itself is replaced.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import types
from dataclasses import dataclass
from functools import cache
from typing import Any

from agentcredit.tasks.example import Example, seeded_subset
from agentcredit.tasks.paths import default_cache_dir

PREFIX = "bfcl:"
#: The bfcl-eval release this integration is tested against (``make setup-bfcl`` installs it).
BFCL_EVAL_VERSION = "2026.3.23"
INSTALL_HINT = (
    "the BFCL tasks need the bfcl-eval package: run `make setup-bfcl`, or `pip install --no-deps "
    f"bfcl-eval=={BFCL_EVAL_VERSION}` plus its checker's imports (see docs/evaluation.md, section BFCL)"
)
#: The model name handed to BFCL's checker; with the stand-in model config it only means "dots kept".
CHECKER_MODEL_NAME = "agentcredit"


@dataclass(frozen=True)
class Category:
    """One BFCL v4 single-turn category: its leaderboard section and column, and how it is scored."""

    name: str
    section: str  # the leaderboard table it is a column of (constants/column_headers.py)
    column: str  # the column's name in that table
    kind: str  # "ast", "irrelevance" (no call is correct) or "relevance" (a call is correct)


#: The categories this task family runs, with the leaderboard's own names (bfcl_eval/constants/column_headers.py:
#: COLUMNS_NON_LIVE, COLUMNS_LIVE). ``simple_python`` is the Python third of the leaderboard's "Simple AST".
CATEGORIES: dict[str, Category] = {
    c.name: c
    for c in (
        Category("simple_python", "Non-Live", "Python Simple AST", "ast"),
        Category("multiple", "Non-Live", "Multiple AST", "ast"),
        Category("parallel", "Non-Live", "Parallel AST", "ast"),
        Category("parallel_multiple", "Non-Live", "Parallel Multiple AST", "ast"),
        Category("irrelevance", "Non-Live", "Irrelevance Detection", "irrelevance"),
        Category("live_simple", "Live", "Python Simple AST", "ast"),
        Category("live_multiple", "Live", "Python Multiple AST", "ast"),
        Category("live_parallel", "Live", "Python Parallel AST", "ast"),
        Category("live_parallel_multiple", "Live", "Python Parallel Multiple AST", "ast"),
        Category("live_irrelevance", "Live", "Irrelevance Detection", "irrelevance"),
        Category("live_relevance", "Live", "Relevance Detection", "relevance"),
    )
}
#: ``bfcl:all``: every category above.
GROUPS: dict[str, tuple[str, ...]] = {"all": tuple(CATEGORIES)}
UNSUPPORTED = {
    "simple_java": "its checker reads Java source values, not JSON arguments",
    "simple_javascript": "its checker reads JavaScript source values, not JSON arguments",
    "multi_turn_base": "multi-turn categories execute calls on BFCL's simulated back-ends",
    "multi_turn_miss_func": "multi-turn categories execute calls on BFCL's simulated back-ends",
    "multi_turn_miss_param": "multi-turn categories execute calls on BFCL's simulated back-ends",
    "multi_turn_long_context": "multi-turn categories execute calls on BFCL's simulated back-ends",
    "memory": "agentic categories need BFCL's memory back-ends",
    "web_search": "agentic categories need live web search",
    "format_sensitivity": "it tests BFCL's prompting formats, not the model's own tool-call format",
}
#: The training task of docs/evaluation.md: trained on (rewards, SFT demonstrations) ...
TRAIN_CATEGORIES = ("simple_python", "multiple")
#: ... and never trained or tuned on: evaluation only.
HELDOUT_CATEGORIES = tuple(c for c in CATEGORIES if c not in TRAIN_CATEGORIES)


def is_bfcl(task: str) -> bool:
    return task.startswith(PREFIX)


def categories_of(task: str) -> list[str]:
    """The categories a task name means: ``bfcl:simple_python``, ``bfcl:simple_python,multiple``, ``bfcl:all``."""
    body = task.removeprefix(PREFIX)
    names: list[str] = []
    for part in body.split(","):
        part = part.strip()
        for name in GROUPS.get(part, (part,)):
            if name in UNSUPPORTED:
                raise ValueError(
                    f"task {task!r}: BFCL category {name!r} is not supported ({UNSUPPORTED[name]})"
                )
            if name not in CATEGORIES:
                raise ValueError(
                    f"task {task!r}: unknown BFCL category {name!r}; known: {', '.join(CATEGORIES)}, or "
                    f"{', '.join(GROUPS)}"
                )
            if name not in names:
                names.append(name)
    return names


# ---------------------------------------------------------------------------------------------- bfcl-eval
def _stand_in_model_config() -> None:
    """Register the stand-in ``bfcl_eval.constants.model_config`` (see the module docstring) unless the real one
    is already imported."""
    name = "bfcl_eval.constants.model_config"
    if name in sys.modules:
        return

    class _Config:
        underscore_to_dot = False  # our prompts keep BFCL's dotted function names

    class _Mapping(dict):
        def __missing__(self, key: str) -> _Config:
            return _Config()

    module = types.ModuleType(name)
    module.MODEL_CONFIG_MAPPING = _Mapping()  # type: ignore[attr-defined]
    module.__doc__ = (
        "agentcredit's stand-in: every model keeps dotted function names (underscore_to_dot=False)"
    )
    sys.modules[name] = module


@cache
def bfcl_eval() -> types.SimpleNamespace:
    """bfcl-eval's loaders and checker; a clear ImportError naming the way to install it when it is missing."""
    # bfcl-eval creates result/score/lock folders under BFCL_PROJECT_ROOT when imported (default: beside the
    # package, inside site-packages); point it at our cache instead, unless the user chose a place.
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(default_cache_dir() / "bfcl"))
    try:
        import bfcl_eval as package  # noqa: F401
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    _stand_in_model_config()
    try:
        from bfcl_eval.constants.enums import Language, ModelStyle
        from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
        from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
        from bfcl_eval.model_handler.utils import convert_to_tool
        from bfcl_eval.utils import (
            is_empty_output,
            is_function_calling_format_output,
            load_dataset_entry,
            load_ground_truth_entry,
        )
    except ImportError as exc:
        raise ImportError(
            f"bfcl-eval is installed but its checker cannot be imported ({exc}); {INSTALL_HINT}"
        ) from exc
    from importlib.metadata import version

    return types.SimpleNamespace(
        version=version("bfcl-eval"),
        Language=Language,
        ModelStyle=ModelStyle,
        GORILLA_TO_OPENAPI=GORILLA_TO_OPENAPI,
        ast_checker=ast_checker,
        convert_to_tool=convert_to_tool,
        is_empty_output=is_empty_output,
        is_function_calling_format_output=is_function_calling_format_output,
        load_dataset_entry=load_dataset_entry,
        load_ground_truth_entry=load_ground_truth_entry,
    )


def tool_schemas(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """BFCL function documents as JSON-schema tools, by BFCL's own ``convert_to_tool`` (types through
    ``GORILLA_TO_OPENAPI``: dict -> object, float -> number, tuple -> array, any -> string). ``FIREWORK_AI`` is the
    style whose output is OpenAI's ``{"type": "function", "function": ...}`` with dotted names kept (the OpenAI,
    Mistral, Google and OSS styles replace dots by underscores), as BFCL's local function-calling handlers show
    them; it also appends a function's ``response`` schema to its description."""
    b = bfcl_eval()
    return b.convert_to_tool(copy.deepcopy(functions), b.GORILLA_TO_OPENAPI, b.ModelStyle.FIREWORK_AI)


def ground_truth_calls(
    ground_truth: list[dict[str, Any]], *, skip_omission: bool = False
) -> list[dict[str, Any]]:
    """One call list from a BFCL possible answer: each parameter's first accepted value, inside nested dicts too
    (their values are option lists again). ``""`` is BFCL's mark of "may be omitted": a parameter whose chosen value
    is ``""`` is left out. ``skip_omission``: choose the first value other than ``""`` instead, for the answers that
    list ``""`` first on a parameter the checker requires (simple_python_200's ``fuel_efficiency: ["", 25.0]``)."""
    calls = []
    for entry in ground_truth:
        ((name, params),) = entry.items()
        calls.append({"name": name, "arguments": _chosen(params, skip_omission)})
    return calls


def _chosen(options: dict[str, Any], skip_omission: bool) -> dict[str, Any]:
    picked = {}
    for key, values in options.items():
        if not isinstance(values, list):  # a literal nested value, not an option list
            picked[key] = values
            continue
        given = [v for v in values if v != ""] if skip_omission else values[:1]
        if given and given[0] != "":
            picked[key] = _value(given[0], skip_omission)
    return picked


def _value(value: Any, skip_omission: bool) -> Any:
    if isinstance(value, dict):
        return _chosen(value, skip_omission)
    if isinstance(value, list):
        return [_value(v, skip_omission) for v in value]
    return value


def demonstration_calls(example_info: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The ground-truth calls BFCL's own checker accepts (the first of the two choices of
    :func:`ground_truth_calls` that passes), or None when neither does (the question then has no demonstration)."""
    b = bfcl_eval()
    for skip in (False, True):
        calls = ground_truth_calls(example_info["bfcl_ground_truth"], skip_omission=skip)
        decoded = [{c["name"]: c["arguments"]} for c in calls]
        result = b.ast_checker(
            example_info["bfcl_functions"],
            decoded,
            example_info["bfcl_ground_truth"],
            b.Language.PYTHON,
            example_info["bfcl_category"],
            CHECKER_MODEL_NAME,
        )
        if result["valid"]:
            return calls
    return None


def _question(messages: list[dict[str, Any]], where: str) -> tuple[str, str]:
    """(system text, user text) of a single-turn BFCL question."""
    system = "\n\n".join(m["content"] for m in messages if m.get("role") == "system")
    user = "\n\n".join(m["content"] for m in messages if m.get("role") == "user")
    if not user.strip():
        raise ValueError(f"{where}: no user message")
    return system, user


@cache
def _category_examples(category: str) -> tuple[Example, ...]:
    b = bfcl_eval()
    kind = CATEGORIES[category].kind
    # The prompt shows the documents with BFCL's language hint (as its generation does); the checker gets them
    # without it (as its evaluation does: eval_runner.evaluate_task loads with include_language_specific_hint=False).
    shown = b.load_dataset_entry(category, include_prereq=False, include_language_specific_hint=True)
    checked = b.load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False)
    truth = (
        {row["id"]: row["ground_truth"] for row in b.load_ground_truth_entry(category)}
        if kind == "ast"
        else {}
    )
    examples = []
    for entry, plain in zip(shown, checked, strict=True):
        where = f"bfcl-eval {b.version} {category} {entry['id']}"
        if len(entry["question"]) != 1:
            raise ValueError(f"{where}: {len(entry['question'])} turns; this category should be single-turn")
        system, user = _question(entry["question"][0], where)
        info: dict[str, Any] = {
            "metric": "bfcl",
            "tier": category,  # per-category accuracy in every evaluation summary (``<category>/accuracy``)
            "bfcl_category": category,
            "bfcl_functions": plain["function"],
            "episode_options": {
                "schemas": tool_schemas(entry["function"]),
                "calls_end_episode": True,
                **({"system_prompt": system} if system else {}),
            },
        }
        if kind == "ast":
            if entry["id"] not in truth:
                raise ValueError(f"{where}: no possible answer in bfcl-eval's possible_answer file")
            info["bfcl_ground_truth"] = truth[entry["id"]]
            calls = demonstration_calls(info)
            if calls is not None:  # SFT demonstrates only calls BFCL's checker accepts
                info["demo_calls"] = [calls]
        examples.append(
            Example(id=entry["id"], question=user, answers=[], task=f"{PREFIX}{category}", info=info)
        )
    return tuple(examples)


def load_bfcl(task: str, limit: int | None = None, seed: int = 0) -> list[Example]:
    """The examples of ``task`` (``bfcl:<category>[,<category>...]`` or ``bfcl:all``), at most ``limit`` per
    category (a seeded subset kept in file order), categories in the order given."""
    examples = []
    for category in categories_of(task):
        chosen = seeded_subset(list(_category_examples(category)), limit, seed)
        examples += [copy.deepcopy(ex) for ex in chosen]
    return examples


# ---------------------------------------------------------------------------------------------- scoring
def decoded_answer(answer: str | None) -> list[dict[str, Any]] | None:
    """The calls an episode's answer holds in BFCL's decoded form ``[{name: {arg: value}}]``; ``[]`` for a message
    without a call; None when there is nothing to decode (no answer: the message was cut by the token budget)."""
    if answer is None:
        return None
    data = json.loads(answer)
    if "calls" in data:
        return [{call["name"]: call["arguments"]} for call in data["calls"]]
    return []


def verdict(example: Example, answer: str | None) -> dict[str, Any]:
    """BFCL's verdict on one episode, ``{"valid": bool, ...}`` with its ``error_type`` when not valid."""
    b = bfcl_eval()
    category = CATEGORIES[example.info["bfcl_category"]]
    decoded = decoded_answer(answer)
    if category.kind in ("irrelevance", "relevance"):
        # eval_runner._evaluate_single_relevance_entry: a decode failure or an empty output is "no call"
        called = decoded is not None and not b.is_empty_output(decoded)
        valid = not called if category.kind == "irrelevance" else called
        if valid:
            return {"valid": True}
        kind = "irrelevance_error:decoder_success" if called else "relevance_error:decoder_failed"
        return {"valid": False, "error_type": kind}
    # eval_runner._evaluate_single_ast_entry
    if decoded is None:
        return {"valid": False, "error_type": "ast_decoder:decoder_failed"}
    if not b.is_function_calling_format_output(decoded):
        return {"valid": False, "error_type": "ast_decoder:decoder_wrong_output_format"}
    return b.ast_checker(
        example.info["bfcl_functions"],
        decoded,
        example.info["bfcl_ground_truth"],
        b.Language.PYTHON,
        category.name,
        CHECKER_MODEL_NAME,
    )


def bfcl_reward(example: Example, answer: str | None) -> float:
    """1.0 when BFCL's checker accepts the episode, else 0.0 (the outcome reward of the ``bfcl:`` tasks)."""
    return 1.0 if verdict(example, answer)["valid"] else 0.0


def summary_tables(task: str, summary: dict[str, float]) -> dict[str, Any]:
    """The BFCL tables of a summary file (``eval.evaluate.summary_file``): the leaderboard's columns and the
    checker's version for a ``bfcl:`` task, nothing otherwise. One place for ``agentcredit eval``'s summary.json
    and ``train``'s eval_summary.json, so both carry them."""
    if not is_bfcl(task):
        return {}
    return {"leaderboard": leaderboard_metrics(summary), "bfcl_eval_version": bfcl_eval().version}


def leaderboard_metrics(summary: dict[str, float]) -> dict[str, float]:
    """``"<section> <column> (<category>)" -> accuracy`` for every category an evaluation summary holds (its
    ``<category>/accuracy`` keys), with the leaderboard's own column names."""
    out = {}
    for name, category in CATEGORIES.items():
        key = f"{name}/accuracy"
        if key in summary:
            out[f"{category.section} {category.column} ({name})"] = summary[key]
    return out
