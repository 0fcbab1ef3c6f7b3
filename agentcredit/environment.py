"""An environment = a protocol, the tools it calls and the outcome reward, built from a config for one task.

Trainer, evaluator, SFT and benchmarks all build it here, so a method sees exactly the same tools and scoring
in training and in evaluation. This module only assembles: the tools and the schemas the protocol shows come from
:mod:`agentcredit.tools.build`, the protocol from :mod:`agentcredit.protocols`, the reward from
:mod:`agentcredit.rewards` (which loads an LLM judge's model and hands it to the judge).

Building it is also the preflight of the tools: the search corpus is loaded and the python sandbox runs
``print(1)`` before any work starts, so a tool that cannot run stops a command with one
:class:`~agentcredit.tools.base.ToolUnavailableError` instead of turning every tool call into an error message.
Tool results that are infrastructure failures anyway (the sandbox dies mid-run) carry ``infra=True``;
:func:`~agentcredit.rollout.infra.infra_failures` finds them in a rollout tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentcredit.config import Config
from agentcredit.protocols import get_protocol
from agentcredit.protocols.base import Protocol, warn_on_two_caps
from agentcredit.rewards import RewardFn, task_reward
from agentcredit.tasks import arith, bfcl, task_corpus
from agentcredit.tools.base import ToolRuntime
from agentcredit.tools.build import build_tools, load_episode_environments, shown_schemas, user_tools


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


def build_environment(config: Config) -> Environment:
    resources: list[Any] = []
    try:
        return _build_environment(config, resources)
    except BaseException:
        for resource in resources:  # a failure after an MCP server started must not leave it running
            resource.close()
        raise


def _build_environment(config: Config, resources: list[Any]) -> Environment:
    protocol_options = dict(config.protocol.options)
    # BFCL: every question brings its own functions (info["episode_options"]), shown by the model's own template
    per_question_tools = bfcl.is_bfcl(config.task.name)
    if per_question_tools and config.protocol.name != "chat":
        raise ValueError(
            f"task {config.task.name!r} shows each question's functions as the model's tools: set protocol.name=chat"
        )
    # the reward reads the config alone: a task.reward that cannot be loaded stops here, before any tool starts
    reward = task_reward(config)
    episodes = load_episode_environments(config.tools, config.protocol.name)
    functions = user_tools(config, resources)
    if "schemas" not in protocol_options:
        schemas = shown_schemas(
            config.tools, config.protocol.name, episodes, functions, per_question_tools=per_question_tools
        )
        if schemas is not None:
            protocol_options["schemas"] = schemas
    protocol = get_protocol(config.protocol.name, **protocol_options)
    warn_on_two_caps(config.rollout.max_turns, protocol.max_segments, "max_segments" in protocol_options)
    corpus = (
        Path(config.tools.corpus)
        if config.tools.corpus
        else task_corpus(config.task.name, seed=config.task.seed)
    )
    wrap_python = arith.tool_wrapper(config.task.options) if config.task.name == arith.TASK else None
    tools = build_tools(config, config.protocol.name, corpus, functions, wrap_python)
    tools.episodes = episodes
    return Environment(protocol, tools, reward, corpus, resources)
