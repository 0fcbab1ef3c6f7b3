"""The tools a config gives a protocol: the built-in ones (python sandbox, search and access, PORTool's suite), your
functions and MCP servers, or a per-episode environment, and the tool schemas the protocol shows the model.

Building the tools is also their preflight: the search corpus is loaded and the python sandbox runs ``print(1)``,
so a tool that cannot run stops a command with one :class:`~agentcredit.tools.base.ToolUnavailableError`.
:func:`~agentcredit.environment.build_environment` calls these for the native trainer; verl's agent loop calls
:func:`load_user_tools` and :func:`load_episode_environments` on its workers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentcredit.tools.base import ToolFn, ToolRuntime, ToolUnavailableError

if TYPE_CHECKING:
    from agentcredit.config import Config


def load_episode_environments(settings: Any, protocol_name: str) -> Any:
    """``tools.environment`` of a :class:`~agentcredit.config.UserToolsConfig` (native ``tools`` or verl's
    ``agentcredit.tools``) as :class:`~agentcredit.tools.episodes.EpisodeEnvironments`, or None when unset."""
    if settings.environment is None:
        if settings.environment_options:
            raise ValueError("tools.environment_options is set but tools.environment is not")
        return None
    if protocol_name not in ("chat", "jsoncall"):
        raise ValueError(
            "tools.environment needs a protocol that shows tool schemas: chat (the model's own tool calls) or "
            f"jsoncall (PORTool's format), got {protocol_name!r}"
        )
    if settings.functions or settings.mcp or getattr(settings, "suite_tools", None):
        raise ValueError(
            "tools.environment gets every call of an episode: list its tools in the environment class, not in "
            "tools.functions, tools.mcp or tools.suite_tools"
        )
    from agentcredit.tools.episodes import EpisodeEnvironments

    return EpisodeEnvironments(settings.environment, settings.environment_options)


def user_tools(config: Config, resources: list[Any]) -> list[Any]:
    """``tools.functions`` and ``tools.mcp`` (:func:`load_user_tools`) for the protocols that show tool schemas."""
    t = config.tools
    if (t.functions or t.mcp) and config.protocol.name not in ("jsoncall", "chat"):
        raise ValueError(
            f"tools.functions and tools.mcp need protocol jsoncall or chat (the protocols that show tool schemas), "
            f"got {config.protocol.name!r}"
        )
    return load_user_tools(t, resources)


def load_user_tools(settings: Any, resources: list[Any]) -> list[Any]:
    """Your tools from a :class:`~agentcredit.config.UserToolsConfig` (the native ``tools`` section or verl's
    ``agentcredit.tools`` block): ``functions`` and the tools of the ``mcp`` servers, whose toolset is appended
    to ``resources`` (the caller closes it). Errors name the entry, module and function, or the server."""
    if not settings.functions and not settings.mcp:
        return []
    from agentcredit.tools.functions import function_tools
    from agentcredit.tools.suite import suite_schemas

    tools = function_tools(settings.functions)
    if settings.mcp:
        from agentcredit.tools.mcp import mcp_tools

        toolset = mcp_tools(settings.mcp)
        resources.append(toolset)
        tools += toolset.tools
    names = [tool.name for tool in tools]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"tools.functions and tools.mcp both name a tool {twice}")
    clash = sorted(set(names) & {s["function"]["name"] for s in suite_schemas()})
    if clash:
        raise ValueError(
            f"tools.functions / tools.mcp: {clash} would shadow the tool suite's tools of the same name"
        )
    return tools


def shown_schemas(
    settings: Any,
    protocol_name: str,
    episodes: Any = None,
    functions: Sequence[Any] = (),
    *,
    per_question_tools: bool = False,
) -> list[dict[str, Any]] | None:
    """The tool schemas a protocol shows the model (its ``schemas`` option), or None where it keeps its own: a
    per-episode environment's (:func:`environment_schemas`); jsoncall's ``tools.suite_tools`` subset plus the user's
    ``functions`` when either is given; chat's subset (none by default) plus ``functions``, which must show at least
    one tool unless each question brings its own (``per_question_tools``: BFCL)."""
    if episodes is not None:
        return environment_schemas(episodes, protocol_name)
    if protocol_name == "jsoncall" and (settings.suite_tools is not None or functions):
        from agentcredit.tools.suite import suite_schemas

        shown = suite_subset(settings.suite_tools) if settings.suite_tools is not None else None
        schemas = [s for s in suite_schemas() if shown is None or s["function"]["name"] in shown]
        return schemas + [t.schema for t in functions]
    if protocol_name == "chat":
        from agentcredit.tools.suite import suite_schemas

        shown = suite_subset(settings.suite_tools or [], "chat")
        schemas = [s for s in suite_schemas() if s["function"]["name"] in shown]
        schemas += [t.schema for t in functions]
        if not schemas and not per_question_tools:
            raise ValueError(
                "protocol chat shows the model no tools: list your own in tools.functions "
                "('package.module:function') or tools.mcp, or suite tools in tools.suite_tools"
            )
        return schemas
    return None


def environment_schemas(episodes: Any, protocol_name: str) -> list[dict[str, Any]]:
    """The tools a per-episode environment shows: its own, plus jsoncall's ``response_gen``, which ends the episode
    in the protocol (it never reaches the environment)."""
    schemas = list(episodes.schemas)
    if protocol_name == "jsoncall":
        from agentcredit.tools.suite import suite_schemas

        schemas += [s for s in suite_schemas() if s["function"]["name"] == "response_gen"]
    return schemas


def suite_subset(names: list[str], protocol_name: str = "jsoncall") -> set[str]:
    """The suite tools a config exposes; unknown names are errors. jsoncall always keeps response_gen (it ends the
    episode); chat never shows it (a message without a call ends the episode)."""
    from agentcredit.tools.suite import suite_schemas

    known = {s["function"]["name"] for s in suite_schemas()}
    unknown = sorted(set(names) - known)
    if unknown:
        raise ValueError(f"tools.suite_tools: unknown tool(s) {unknown}; the suite has {sorted(known)}")
    return set(names) - {"response_gen"} if protocol_name == "chat" else set(names) | {"response_gen"}


def build_tools(
    config: Config,
    protocol_name: str,
    corpus: Path | None,
    functions: Sequence[Any] = (),
    wrap_python: Callable[[ToolFn], ToolFn] | None = None,
) -> ToolRuntime:
    """The tools a protocol calls: the python sandbox (codefence), search/access (tags), the suite (jsoncall; chat
    only the ``tools.suite_tools`` named) plus the user's ``functions`` (:func:`user_tools`). ``wrap_python`` wraps the
    python tool (a task's own version of it).

    Raises :class:`ToolUnavailableError` when the corpus cannot be loaded or the sandbox cannot run ``print(1)``.
    """
    t = config.tools
    if protocol_name == "chat" and not t.suite_tools:
        corpus = None  # only the suite's knowledge tools read a corpus
    retriever = _load_corpus(corpus, dense=t.dense) if corpus is not None else None
    if protocol_name == "codefence":
        from agentcredit.tools.sandbox import check_available, python_tool

        check_available(t.sandbox_isolation)  # preflight: print(1) in the sandbox, once per process
        python = python_tool(retriever, timeout=t.sandbox_timeout, isolation=t.sandbox_isolation)
        if (
            wrap_python is not None
        ):  # a task's own tool (arith-tools' seeded failures: tasks.arith.tool_wrapper)
            python = wrap_python(python)
        return ToolRuntime({"python": python}, max_workers=t.max_workers)
    if protocol_name == "tags":
        if retriever is None:
            raise ValueError(
                f"task {config.task.name!r} has no search corpus; set tools.corpus for the tags protocol"
            )
        return ToolRuntime(
            {"search": retriever.as_tool(t.search_k), "access": partial(_access_page, retriever)},
            max_workers=t.max_workers,
        )
    if protocol_name in ("jsoncall", "chat"):
        from agentcredit.tools.suite import suite_runtime

        runtime = suite_runtime(retriever, knowledge_k=t.search_k, max_workers=t.max_workers)
        if t.suite_tools is not None or protocol_name == "chat":
            shown = suite_subset(t.suite_tools or [], protocol_name)
            runtime.tools = {name: fn for name, fn in runtime.tools.items() if name in shown}
        for tool in functions:
            runtime.register(tool.name, tool)
        return runtime
    raise ValueError(f"no tools for protocol {protocol_name!r}")


def _load_corpus(corpus: Path, *, dense: bool) -> Any:
    """The retriever over ``corpus``; a corpus (or dense model) that cannot be loaded is a ToolUnavailableError."""
    from agentcredit.tools.search import load_retriever

    try:
        return load_retriever(corpus, dense=dense)
    except (OSError, ImportError) as exc:
        raise ToolUnavailableError(
            f"the search corpus cannot be loaded, so the search tool cannot run: {type(exc).__name__}: {exc}. "
            "To fix it: point tools.corpus at an existing JSONL corpus ({id, title, text} per line), or for a "
            "task's own corpus check its data root or package sample"
            + (" (dense retrieval also needs the 'dense' extra and its model)" if dense else "")
        ) from exc


def _access_page(retriever: Any, arguments: dict[str, Any]) -> str:
    """carl-critical's access action over the local corpus: the page (all passages) with that title."""
    title = arguments.get("url") if isinstance(arguments, dict) else None
    if not isinstance(title, str) or not title.strip():
        return "ERROR: access needs a page title or url"
    title = title.strip().rsplit("/", 1)[-1].replace("_", " ")
    passages = retriever.by_title(title)
    if not passages:
        return f"No page titled {title!r} was found."
    return "\n".join(p.text for p in passages)
