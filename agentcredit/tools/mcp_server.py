"""Writing an MCP server for agentcredit's ``tools.mcp``: one import for mcp 1.x and 2.x, and tool errors that keep
their reason.

The server side of :mod:`agentcredit.tools.mcp` (which is the client). Two things differ between the SDK's major
versions, and both change what the model reads:

* mcp 2 renamed ``mcp.server.fastmcp.FastMCP`` to ``mcp.server.mcpserver.MCPServer``; :func:`server_class` returns
  whichever the installed SDK has.
* mcp 2 withholds the text of an exception a tool raises: the model reads only ``Error executing tool stock``
  (the SDK's ``UnexpectedToolError``), while the same function given as ``tools.functions`` shows its reason. Only a
  ``ToolError`` keeps its message. :func:`keep_reasons` turns any other exception of a tool into a ``ToolError``
  saying ``<type>: <message>`` (the words :func:`~agentcredit.tools.base.run_call` uses for a function tool), so
  the model reads the same reason either way; mcp 1 kept the reason already and is unchanged by it.

Use::

    from agentcredit.tools.mcp_server import mcp_server

    server = mcp_server("warehouse")     # FastMCP (mcp 1) or MCPServer (mcp 2); every tool keeps its reasons

    @server.tool()
    def stock(item: str) -> str:
        '''Units of an item in stock.'''
        return str(STOCK[item])          # a KeyError reaches the model as "KeyError: 'washer'"

    server.run()                         # stdio: what agentcredit starts

The server runs in a process of its own with the MCP SDK's default environment (``HOME``, ``PATH``, ``USER`` and a
few more), not agentcredit's: whatever it needs (``PYTHONPATH``, a database path, an API key) goes in the config's
``tools.mcp[].env``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["keep_reasons", "mcp_server", "server_class", "tool_error_class"]


def server_class() -> type:
    """The SDK's server class: ``MCPServer`` on mcp 2, ``FastMCP`` on mcp 1 (the same class, renamed)."""
    try:
        from mcp.server.mcpserver import MCPServer

        return MCPServer
    except ImportError:
        from mcp.server.fastmcp import FastMCP

        return FastMCP


def tool_error_class() -> type[Exception]:
    """The SDK's ``ToolError``: the one exception whose message both SDK versions pass to the model."""
    try:
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError:
        from mcp.server.fastmcp.exceptions import ToolError
    return ToolError


def _protocol_error() -> type[Exception]:
    try:
        from mcp.shared.exceptions import MCPError

        return MCPError
    except ImportError:  # mcp 1 calls it McpError
        from mcp.shared.exceptions import McpError

        return McpError


def keep_reasons(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` whose exceptions reach the model with their reason: any exception but the SDK's ``ToolError`` and
    protocol errors is raised again as ``ToolError("<type>: <message>")``. The signature and docstring are kept
    (the SDK builds the tool's schema from them); a coroutine function stays one."""
    tool_error, protocol_error = tool_error_class(), _protocol_error()

    def reason(exc: Exception) -> Exception:
        if isinstance(exc, tool_error | protocol_error):
            return exc
        return tool_error(f"{type(exc).__name__}: {exc}")

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except Exception as exc:
                raise reason(exc) from exc

        return run_async

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise reason(exc) from exc

    return run


def mcp_server(name: str, *args: Any, **kwargs: Any) -> Any:
    """The SDK's server (:func:`server_class`) whose ``tool()`` decorator wraps every tool in :func:`keep_reasons`."""
    server = server_class()(name, *args, **kwargs)
    register = server.tool

    def tool(*t_args: Any, **t_kwargs: Any) -> Callable[[Callable[..., Any]], Any]:
        decorate = register(*t_args, **t_kwargs)
        return lambda fn: decorate(keep_reasons(fn))

    server.tool = tool
    return server
