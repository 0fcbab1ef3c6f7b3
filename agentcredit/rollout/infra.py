"""Infrastructure failures in rollout trees: tool results that say a tool could not run, not what it answered.

A tool result that is an infrastructure failure (the sandbox died mid-run, a server was unreachable) carries
``infra=True``; such an episode is neither scored nor trained on. :func:`infra_failures` finds them in a tree,
:func:`raise_on_infra_failures` stops training (or demonstrations) at the first.
"""

from __future__ import annotations

from typing import Any

from agentcredit.tools.base import ToolUnavailableError


def infra_failures(tree: Any, leaf: int | None = None) -> list[str]:
    """``"tool: output"`` of every tool result in ``tree`` (on the path to ``leaf``) that is an infrastructure
    failure (``infra=True``: the tool could not run), not the tool's answer. Empty for a clean episode."""
    nodes = tree.path(leaf) if leaf is not None else range(len(tree.nodes))
    found = []
    for node in nodes:
        for result in tree.segment(node).info.get("results", ()):
            if isinstance(result, dict) and result.get("infra"):
                found.append(f"{result.get('name')}: {str(result.get('output', ''))[:500]}")
    return found


def raise_on_infra_failures(trees: Any, what: str) -> None:
    """Stop ``what`` (training, demonstrations) when an episode of ``trees`` holds an infrastructure failure."""
    for tree in trees:
        found = infra_failures(tree)
        if found:
            raise ToolUnavailableError(
                f"{what} stopped: a tool could not run during an episode ({len(found)} call(s) in one tree), so "
                f"its output is an infrastructure error, not the tool's answer, and must not be trained on. "
                f"First: {found[0]}"
            )
