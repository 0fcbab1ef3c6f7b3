"""An environment = a protocol, the tools it calls and the outcome reward, built from a config for one task.

Trainer, evaluator, SFT and benchmarks all build it here, so a method sees exactly the same tools and scoring
in training and in evaluation.

Building it is also the preflight of the tools: the search corpus is loaded and the python sandbox runs
``print(1)`` before any work starts, so a tool that cannot run stops a command with one
:class:`~agentcredit.tools.base.ToolUnavailableError` instead of turning every tool call into an error message.
Tool results that are infrastructure failures anyway (the sandbox dies mid-run) carry ``infra=True``;
:func:`~agentcredit.rollout.infra.infra_failures` finds them in a rollout tree.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from agentcredit.config import Config
from agentcredit.protocols import get_protocol
from agentcredit.protocols.base import Protocol
from agentcredit.rewards import FormatGatedF1, RewardFn, outcome_reward, user_reward
from agentcredit.tasks import arith, bfcl, task_corpus
from agentcredit.tools.base import ToolRuntime, ToolUnavailableError


@dataclass
class Environment:
    protocol: Protocol
    tools: ToolRuntime
    reward: RewardFn
    corpus: Path | None
    # what else the environment started and must stop (the MCP servers of tools.mcp)
    resources: list[Any] = field(default_factory=list)

    def close(self) -> None:
        self.tools.close()
        for resource in self.resources:
            resource.close()


def build_tools(
    config: Config, protocol_name: str, corpus: Path | None, functions: Sequence[Any] = ()
) -> ToolRuntime:
    """The tools a protocol calls: the python sandbox (codefence), search/access (tags), the suite (jsoncall; chat
    only the ``tools.suite_tools`` named) plus the user's ``functions`` (:func:`user_tools`).

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
        options = config.task.options
        if config.task.name == arith.TASK and options.get("tool_failure_rate", 0.0) > 0:
            # the tool that can hurt: seeded failures, part of the environment (tasks.arith.tool_failure)
            python = arith.failing_tool(
                python,
                options["tool_failure_rate"],
                options.get("tool_failure_seed", 0),
                options.get("tool_failure_modes", arith.TOOL_FAILURE_MODES),
            )
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


def suite_subset(names: list[str], protocol_name: str = "jsoncall") -> set[str]:
    """The suite tools a config exposes; unknown names are errors. jsoncall always keeps response_gen (it ends the
    episode); chat never shows it (a message without a call ends the episode)."""
    from agentcredit.tools.suite import suite_schemas

    known = {s["function"]["name"] for s in suite_schemas()}
    unknown = sorted(set(names) - known)
    if unknown:
        raise ValueError(f"tools.suite_tools: unknown tool(s) {unknown}; the suite has {sorted(known)}")
    return set(names) - {"response_gen"} if protocol_name == "chat" else set(names) | {"response_gen"}


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


def build_environment(config: Config) -> Environment:
    resources: list[Any] = []
    try:
        return _build_environment(config, resources)
    except BaseException:
        for resource in resources:  # a failure after an MCP server started must not leave it running
            resource.close()
        raise


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


def environment_schemas(episodes: Any, protocol_name: str) -> list[dict[str, Any]]:
    """The tools a per-episode environment shows: its own, plus jsoncall's ``response_gen``, which ends the episode
    in the protocol (it never reaches the environment)."""
    schemas = list(episodes.schemas)
    if protocol_name == "jsoncall":
        from agentcredit.tools.suite import suite_schemas

        schemas += [s for s in suite_schemas() if s["function"]["name"] == "response_gen"]
    return schemas


def _build_environment(config: Config, resources: list[Any]) -> Environment:
    protocol_options = dict(config.protocol.options)
    # BFCL: every question brings its own functions (info["episode_options"]), shown by the model's own template
    per_question_tools = bfcl.is_bfcl(config.task.name)
    if per_question_tools and config.protocol.name != "chat":
        raise ValueError(
            f"task {config.task.name!r} shows each question's functions as the model's tools: set protocol.name=chat"
        )
    episodes = load_episode_environments(config.tools, config.protocol.name)
    if episodes is not None:
        protocol_options.setdefault("schemas", environment_schemas(episodes, config.protocol.name))
    functions = user_tools(config, resources)
    if (
        config.protocol.name == "jsoncall"
        and (config.tools.suite_tools is not None or config.tools.functions)
        and "schemas" not in protocol_options
    ):
        from agentcredit.tools.suite import suite_schemas

        shown = suite_subset(config.tools.suite_tools) if config.tools.suite_tools is not None else None
        schemas = [s for s in suite_schemas() if shown is None or s["function"]["name"] in shown]
        protocol_options["schemas"] = schemas + [t.schema for t in functions]
    if config.protocol.name == "chat" and "schemas" not in protocol_options:
        from agentcredit.tools.suite import suite_schemas

        shown = suite_subset(config.tools.suite_tools or [], "chat")
        schemas = [s for s in suite_schemas() if s["function"]["name"] in shown]
        protocol_options["schemas"] = schemas + [t.schema for t in functions]
        if not protocol_options["schemas"] and not per_question_tools:
            raise ValueError(
                "protocol chat shows the model no tools: list your own in tools.functions "
                "('package.module:function') or tools.mcp, or suite tools in tools.suite_tools"
            )
    protocol = get_protocol(config.protocol.name, **protocol_options)
    warn_on_two_caps(config.rollout.max_turns, protocol.max_segments, "max_segments" in protocol_options)
    corpus = (
        Path(config.tools.corpus)
        if config.tools.corpus
        else task_corpus(config.task.name, seed=config.task.seed)
    )
    tools = build_tools(config, config.protocol.name, corpus, functions)
    tools.episodes = episodes
    if config.task.reward is not None:
        reward: RewardFn = user_reward(config.task.reward, config.task.reward_weights)
    elif config.task.metric == "set_f1_format":
        if config.algorithm.credit_method.all_needs.reward == "judge":
            raise ValueError(
                "task.metric=set_f1_format: this method scores outcomes with its judge (+1 / 0 / -1); choose em, f1 "
                "or set_f1"
            )
        reward = FormatGatedF1(config.task.format_bonus)
    elif (
        config.algorithm.credit_method.all_needs.reward == "judge"
    ):  # the method scores outcomes with its own judge
        from agentcredit.tasks.judge import build_judge

        method = config.algorithm.credit_method
        p = next(
            method.settings_from(config.algorithm)[part.section]
            for part in method.parts
            if part.needs.reward == "judge"
        )
        reward = build_judge(
            p.judge, p.judge_model, metric=config.task.metric, unfinished=p.unfinished_reward
        )
    else:
        reward = partial(outcome_reward, metric=config.task.metric, format_bonus=config.task.format_bonus)
    return Environment(protocol, tools, reward, corpus, resources)


def episode_cap(max_turns: int | None, max_segments: int) -> int:
    """Assistant messages an episode may have: ``rollout.max_turns`` and the protocol's ``max_segments`` both cap
    it (the engine ends the episode at the first, the protocol cuts its last message at the second), so the smaller
    applies. This is the documented precedence; :func:`warn_on_two_caps` says so when they differ."""
    return min(max_turns or max_segments, max_segments)


def warn_on_two_caps(max_turns: int, max_segments: int, segments_set: bool) -> None:
    """One warning when ``rollout.max_turns`` and the protocol's ``max_segments`` differ: the smaller silently cuts
    every episode that needs more (issue 35: a task needing 4 messages under a cap of 3 scored 0 everywhere)."""
    if max_turns == max_segments:
        return
    where = "protocol.options.max_segments" if segments_set else "the protocol's default max_segments"
    warnings.warn(
        f"rollout.max_turns={max_turns} and {where}={max_segments} both cap an episode's assistant messages; the "
        f"smaller, {episode_cap(max_turns, max_segments)}, applies (an episode needing more ends without an "
        "answer). Set both to the same value to silence this",
        EpisodeCapWarning,
        stacklevel=3,
    )


class EpisodeCapWarning(UserWarning):
    """``rollout.max_turns`` and the protocol's ``max_segments`` differ (see :func:`episode_cap`)."""
