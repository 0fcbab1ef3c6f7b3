"""The tools of local MCP servers (stdio) as ordinary agentcredit tools.

Each server is started once, as a subprocess speaking MCP over its stdin and stdout, through the official ``mcp``
package (``pip install 'agentcredit[mcp]'``; the protocol is not re-implemented here). Its tools are listed once
and each becomes an :class:`McpTool`: a :data:`~agentcredit.tools.base.ToolFn` with ``name`` and an OpenAI-style
``schema``, like :class:`~agentcredit.tools.functions.FunctionTool`, so the same code hands them to
``JsonCallProtocol(schemas=...)`` and to :class:`~agentcredit.tools.base.ToolRuntime`::

    with mcp_tools([McpServer("python", ["shop_server.py"])]) as toolset:
        runtime = ToolRuntime({t.name: t for t in toolset.tools})
        protocol = JsonCallProtocol(schemas=[t.schema for t in toolset.tools])
        ...

What the model reads:

* arguments that do not fit the tool's ``inputSchema``: ``ERROR: <tool>: invalid arguments ...`` (checked here,
  before the server sees them, with the words a ``FunctionTool`` uses);
* a result: its text content, items joined by newlines (an image or audio item is named, not inlined; structured
  content alone comes back as JSON);
* a result the server flags ``isError`` (the tool raised, say): ``ERROR: tool '<tool>' failed: <its text>``, the
  SDK's ``Error executing tool <name>:`` prefix taken off (the words a function tool's error gives). mcp 2 sends no
  reason for an exception other than its ``ToolError``; a server built with
  :func:`agentcredit.tools.mcp_server.mcp_server` keeps every reason (one warning says so when a server does not).

A server that cannot start is a ``ValueError`` from :func:`mcp_tools` naming its command and what went wrong.
A server that dies, stops answering (a call past ``call_timeout``) or was closed makes every call return
:func:`~agentcredit.tools.base.unavailable` text, so the runtime marks the result ``infra=True``: the machine's
fault is never trained on or scored as the tool's answer.

The MCP session is asynchronous; each server's session runs on a private event loop in one background thread,
and calls from the runtime's worker threads are handed to that loop, so concurrent calls share one connection.
The server's environment is the MCP SDK's safe default (``HOME``, ``PATH``, ``USER`` and a few more), not this
process's: pass what the server needs (an API key, ``PYTHONPATH``) in ``env``. Its stderr is kept (the last lines
are quoted in errors) and logged at DEBUG level on this module's logger.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import shlex
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from agentcredit.tools.base import unavailable
from agentcredit.tools.functions import ArgumentCheck

__all__ = ["McpClient", "McpServer", "McpTool", "McpToolset", "mcp_tools"]

log = logging.getLogger(__name__)

START_TIMEOUT = 30.0
CALL_TIMEOUT = 60.0
# close(): the SDK closes the server's stdin, waits 2 s, then SIGTERM, 2 s, SIGKILL, 2 s; this bounds the wait.
_CLOSE_TIMEOUT = 10.0
_CONNECTION_CLOSED = -32000  # the JSON-RPC error code the SDK gives calls on a connection that ended
_STDERR_LINES = 20


def _import_mcp() -> Any:
    try:
        import mcp
    except ImportError as exc:
        raise ImportError(
            f"MCP tools need the 'mcp' package ({exc}); install it with: pip install 'agentcredit[mcp]'"
        ) from exc
    return mcp


@dataclass(frozen=True)
class McpServer:
    """How to start one local MCP server over stdio.

    Args:
        command: the executable (``"python"``, ``"npx"``, an absolute path), looked up on ``PATH``.
        args: its arguments.
        env: extra environment variables for it (over the SDK's safe default; this process's are not passed on).
        cwd: its working directory (default: this process's).
        prefix: put in front of each of its tool names (``"shop_"``), to tell apart two servers' same-named tools.
    """

    command: str
    args: Sequence[str] = ()
    env: Mapping[str, str] | None = None
    cwd: str | os.PathLike[str] | None = None
    prefix: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.command, str) or not self.command.strip():
            raise ValueError(f"MCP server: command must be a non-empty string, got {self.command!r}")
        if isinstance(self.args, str) or not all(isinstance(a, str | os.PathLike) for a in self.args):
            raise ValueError(
                f"MCP server {self.command!r}: args must be a list of strings, got {self.args!r}"
            )
        object.__setattr__(self, "args", tuple(os.fspath(a) for a in self.args))
        if self.env is not None:
            if not isinstance(self.env, Mapping):
                raise ValueError(f"MCP server {self.command!r}: env must be a mapping, got {self.env!r}")
            object.__setattr__(self, "env", {str(k): str(v) for k, v in self.env.items()})

    @classmethod
    def coerce(cls, server: McpServer | Mapping[str, Any]) -> McpServer:
        """``server`` itself, or one built from a mapping with these field names (a config entry)."""
        if isinstance(server, McpServer):
            return server
        if not isinstance(server, Mapping):
            raise ValueError(
                f"MCP server: expected a mapping with 'command' (and 'args', ...), got {server!r}"
            )
        unknown = sorted(set(server) - {"command", "args", "env", "cwd", "prefix"})
        if unknown or "command" not in server:
            problem = f"unknown keys {unknown}" if unknown else "no 'command'"
            raise ValueError(
                f"MCP server {dict(server)!r}: {problem} (keys: command, args, env, cwd, prefix)"
            )
        return cls(**server)

    def describe(self) -> str:
        """The command line, shell-quoted, for messages."""
        return shlex.join([self.command, *self.args])


class _StderrTail:
    """The server's stderr through a pipe: each line logged at DEBUG, the last few kept for error messages."""

    def __init__(self, name: str):
        read_fd, write_fd = os.pipe()
        self.writer = open(write_fd, "w", encoding="utf-8", errors="replace")  # noqa: SIM115 (handed to the SDK)
        self._reader = open(read_fd, encoding="utf-8", errors="replace")  # noqa: SIM115 (closed by the thread)
        self._lines: collections.deque[str] = collections.deque(maxlen=_STDERR_LINES)
        self._name = name
        self._thread = threading.Thread(target=self._pump, name=f"agentcredit-mcp-stderr-{name}", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        with self._reader:
            for line in self._reader:
                line = line.rstrip("\n")
                self._lines.append(line)
                log.debug("[%s] %s", self._name, line)

    def close_writer(self) -> None:
        """Close this process's copy of the write end (the server keeps its own); EOF comes when it exits."""
        if not self.writer.closed:
            self.writer.close()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def tail(self) -> str:
        lines = [line for line in self._lines if line.strip()]
        return ("; its stderr ends:\n    " + "\n    ".join(lines)) if lines else ""


def _connection_closed(exc: BaseException) -> bool:
    """The error a call gets when the server's end is gone: the SDK's ``CONNECTION_CLOSED``, or (mcp 1, a
    request sent after the server died) the closed stream under the session."""
    import anyio  # the SDK's own dependency

    if isinstance(exc, anyio.ClosedResourceError | anyio.BrokenResourceError | anyio.EndOfStream):
        return True
    return getattr(getattr(exc, "error", None), "code", None) == _CONNECTION_CLOSED


def _describe(exc: BaseException) -> str:
    # ExceptionGroup (from the SDK's task groups): name the first leaf, the rest is its consequences
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _result_text(result: Mapping[str, Any]) -> str:
    """A ``CallToolResult`` (dumped by alias) as the text the model reads."""
    parts: list[str] = []
    for item in result.get("content") or []:
        kind = item.get("type")
        if kind == "text":
            parts.append(item.get("text", ""))
        elif kind == "resource":
            resource = item.get("resource") or {}
            if "text" in resource:
                parts.append(resource["text"])
            else:
                parts.append(f"[resource {resource.get('uri', '?')} ({resource.get('mimeType', 'binary')})]")
        elif kind == "resource_link":
            parts.append(f"[resource link {item.get('uri', '?')}]")
        else:  # image, audio, or a kind this version does not know: named, never inlined as base64
            parts.append(f"[{kind} ({item.get('mimeType', '?')})]")
    if not parts and result.get("structuredContent") is not None:
        return json.dumps(result["structuredContent"], ensure_ascii=False, default=str)
    return "\n".join(parts)


class McpTool:
    """One tool of an MCP server: ``name``, its OpenAI-style ``schema``, and ``tool(arguments) -> str``."""

    def __init__(self, client: McpClient, tool: Mapping[str, Any]):
        self.client = client
        self.remote_name: str = tool["name"]
        self.name: str = client.server.prefix + self.remote_name
        parameters = dict(tool.get("inputSchema") or {"type": "object", "properties": {}})
        try:
            self._check = ArgumentCheck(self.name, parameters)
        except Exception as exc:  # jsonschema.SchemaError: the server's schema, not a call, is broken
            raise ValueError(
                f"MCP server `{client.server.describe()}`: tool {self.remote_name!r} has an invalid inputSchema: "
                f"{getattr(exc, 'message', exc)}"
            ) from exc
        function: dict[str, Any] = {"name": self.name, "description": tool.get("description") or ""}
        function["parameters"] = parameters
        self.schema: dict[str, Any] = {"type": "function", "function": function}

    def __call__(self, arguments: dict[str, Any]) -> str:
        error = self._check.error(arguments)
        if error is not None:
            return error
        return self.client.call(self.remote_name, arguments, shown_as=self.name)

    def __repr__(self) -> str:
        return f"McpTool({self.name!r} of `{self.client.server.describe()}`)"


class McpClient:
    """One running MCP server and its session; :attr:`tools` are its tools. Starts in the constructor.

    Raises ValueError (naming the command) when the server cannot be started, does not answer the MCP handshake
    within ``start_timeout`` seconds, or its tools cannot be listed. :meth:`close` (or ``with``) stops it.
    """

    def __init__(
        self, server: McpServer, *, start_timeout: float = START_TIMEOUT, call_timeout: float = CALL_TIMEOUT
    ):
        _import_mcp()
        if not start_timeout > 0 or not call_timeout > 0:
            raise ValueError(f"MCP: timeouts must be > 0, got start {start_timeout!r}, call {call_timeout!r}")
        self.server = server
        self.start_timeout = float(start_timeout)
        self.call_timeout = float(call_timeout)
        self.tools: list[McpTool] = []
        self._dead: str | None = None  # why calls can no longer reach the server
        self._closed = False
        self._warned_reasons = False  # the operator was told the server withholds its tools' error reasons
        self._lock = threading.Lock()
        self._session: Any = None
        self._stop = asyncio.Event()  # set (from close) on the loop; binds to no loop until awaited
        self._stderr = _StderrTail(os.path.basename(server.command))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever,
            name=f"agentcredit-mcp-{os.path.basename(server.command)}",
            daemon=True,
        )
        self._thread.start()
        self._started: Future[list[dict[str, Any]]] = Future()
        self._main = asyncio.run_coroutine_threadsafe(self._run(), self._loop)
        try:
            listed = self._started.result(timeout=self.start_timeout + 5)  # _run times itself out before
        except FutureTimeout:
            listed = None
            error = f"did not start within {self.start_timeout:g} s"
        except Exception as exc:
            listed = None
            error = str(exc)
        if listed is None:
            self.close()
            raise ValueError(f"MCP server `{server.describe()}`: {error}{self._stderr.tail()}")
        try:
            self.tools = [McpTool(self, tool) for tool in listed]
        except Exception:
            self.close()
            raise

    # -- the session, on the private loop ------------------------------------------------------------------
    async def _run(self) -> None:
        mcp = _import_mcp()
        timed_out = False
        try:
            params = mcp.StdioServerParameters(
                command=self.server.command,
                args=list(self.server.args),
                env=dict(self.server.env) if self.server.env is not None else None,
                cwd=os.fspath(self.server.cwd) if self.server.cwd is not None else None,
            )
            async with mcp.stdio_client(params, errlog=self._stderr.writer) as (read, write):
                self._stderr.close_writer()  # spawned: the server holds the write end now
                async with mcp.ClientSession(read, write) as session:
                    try:
                        async with asyncio.timeout(self.start_timeout):
                            await session.initialize()
                            listed = await self._list_tools(mcp, session)
                    except TimeoutError:
                        timed_out = True
                        raise
                    self._session = session
                    self._started.set_result(listed)
                    await self._stop.wait()
        except BaseException as exc:
            if not self._started.done():
                self._started.set_exception(RuntimeError(self._start_error(exc, timed_out)))
            else:
                self._mark_dead(f"its session ended: {_describe(exc)}")
            if not isinstance(exc, Exception):
                raise
        finally:
            self._session = None
            self._stderr.close_writer()
            if self._started.done() and self._started.exception() is None:
                self._mark_dead("its session ended")
            else:
                self._dead = self._dead or "it did not start"

    def _start_error(self, exc: BaseException, timed_out: bool) -> str:
        leaf = exc
        while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
            leaf = leaf.exceptions[0]
        if timed_out:
            return (
                f"no answer to the MCP handshake within {self.start_timeout:g} s; is it an MCP server speaking "
                "stdio (one JSON-RPC message a line on stdout, logs on stderr)?"
            )
        if _connection_closed(leaf):
            return "it exited or closed stdout during the MCP handshake; is it an MCP server speaking stdio?"
        cwd = self.server.cwd
        if (
            isinstance(leaf, FileNotFoundError | NotADirectoryError)
            and cwd is not None
            and not os.path.isdir(cwd)
        ):
            return f"cannot start it: its cwd {os.fspath(cwd)!r} is not a directory"
        if isinstance(leaf, FileNotFoundError):
            return f"cannot start it: command {self.server.command!r} not found"
        if isinstance(leaf, OSError):
            return f"cannot start it: {_describe(leaf)}"
        if isinstance(leaf, asyncio.CancelledError):
            return "it was closed while starting"
        return f"the MCP handshake failed ({_describe(leaf)}); is it an MCP server speaking stdio?"

    @staticmethod
    async def _list_tools(mcp: Any, session: Any) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        result = await session.list_tools()
        seen_cursors: set[str] = set()
        while True:
            tools += [t.model_dump(by_alias=True, exclude_none=True) for t in result.tools]
            cursor = getattr(result, "next_cursor", None) or getattr(result, "nextCursor", None)
            if not cursor or cursor in seen_cursors:
                return tools
            seen_cursors.add(cursor)
            if hasattr(mcp.types, "PaginatedRequestParams"):  # mcp 2
                result = await session.list_tools(params=mcp.types.PaginatedRequestParams(cursor=cursor))
            else:  # mcp 1
                result = await session.list_tools(cursor=cursor)

    async def _call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        session = self._session
        if session is None:
            raise ConnectionError(self._dead or "its session ended")
        async with asyncio.timeout(self.call_timeout):
            result = await session.call_tool(name, arguments)
        return result.model_dump(by_alias=True, exclude_none=True)

    # -- the caller's side ---------------------------------------------------------------------------------
    def call(self, name: str, arguments: dict[str, Any], *, shown_as: str | None = None) -> str:
        """Call the server's tool ``name``; its text, an ``ERROR:`` observation, or :func:`unavailable` text."""
        shown = shown_as or name
        where = f"MCP server `{self.server.describe()}`"
        if self._closed:
            return unavailable(f"tool {shown!r}: {where} is not running (it was closed)")
        if self._dead is not None:
            return unavailable(f"tool {shown!r}: {where} is not running ({self._dead})")
        try:
            future = asyncio.run_coroutine_threadsafe(self._call(name, arguments), self._loop)
        except RuntimeError:  # the loop was closed under us
            return unavailable(f"tool {shown!r}: {where} is not running (it was closed)")
        try:
            result = future.result(timeout=self.call_timeout + 5)
        except (FutureTimeout, TimeoutError):
            future.cancel()
            return unavailable(f"tool {shown!r}: {where} did not answer within {self.call_timeout:g} s")
        except ConnectionError as exc:  # the session had ended, or a pipe to the server broke
            self._mark_dead(str(exc) or type(exc).__name__)
            return unavailable(f"tool {shown!r}: {where} is not running ({self._dead or exc})")
        except Exception as exc:
            if _connection_closed(exc) or self._dead is not None:
                self._mark_dead("the connection closed (the server exited?)")
                return unavailable(f"tool {shown!r}: {where} is not running ({self._dead})")
            # a JSON-RPC error from a live server (unknown tool, arguments it rejects, a bug in it): its answer
            return f"ERROR: tool {shown!r} failed: {_describe(exc)}"
        text = _result_text(result)
        if result.get("isError"):
            return (
                text
                if text.startswith("ERROR:")
                else f"ERROR: tool {shown!r} failed: {self._reason(name, text)}"
            )
        return text

    def _reason(self, name: str, text: str) -> str:
        """An error result's text without the SDK's ``Error executing tool <name>: `` prefix, so the model reads the
        words a function tool's error gives. mcp 2 withholds the reason of an exception other than ``ToolError``
        (the text is the bare prefix): the operator hears once how to keep it."""
        prefix = f"Error executing tool {name}"
        if text.startswith(prefix + ": "):
            return text[len(prefix) + 2 :]
        if text.strip() == prefix:
            with self._lock:
                first, self._warned_reasons = not self._warned_reasons, True
            if first:
                log.warning(
                    "MCP server `%s` withholds why its tool %r failed (mcp 2 passes only a ToolError's message): "
                    "build the server with agentcredit.tools.mcp_server.mcp_server(...) or raise ToolError",
                    self.server.describe(),
                    name,
                )
        return text

    def _mark_dead(self, why: str) -> None:
        """Remember why calls cannot reach the server; the operator hears it once (with the server's stderr)."""
        with self._lock:
            if self._dead is not None or self._closed:
                return
            self._dead = why
        log.warning("MCP server `%s` stopped: %s%s", self.server.describe(), why, self._stderr.tail())

    def close(self) -> None:
        """Stop the session and the server (stdin closed, then SIGTERM, then SIGKILL) and the loop's thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stop.set)
        try:
            self._main.result(timeout=_CLOSE_TIMEOUT)
        except Exception as exc:  # a timeout, or the session's own failure: nothing more to stop
            if not self._main.done():
                log.warning(
                    "MCP server `%s` did not shut down cleanly: %s", self.server.describe(), _describe(exc)
                )
                self._loop.call_soon_threadsafe(self._main.cancel)
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_CLOSE_TIMEOUT)
        if not self._thread.is_alive():
            self._loop.close()
        self._stderr.close_writer()
        self._stderr.join(1.0)

    def __enter__(self) -> McpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("dead" if self._dead else "running")
        return f"McpClient(`{self.server.describe()}`, {len(self.tools)} tools, {state})"


@dataclass
class McpToolset:
    """The tools of several MCP servers and the clients that run them; ``close()`` (or ``with``) stops them all."""

    clients: list[McpClient] = field(default_factory=list)
    tools: list[McpTool] = field(default_factory=list)

    def close(self) -> None:
        for client in self.clients:
            client.close()

    def __enter__(self) -> McpToolset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def mcp_tools(
    servers: Iterable[McpServer | Mapping[str, Any]],
    *,
    start_timeout: float = START_TIMEOUT,
    call_timeout: float = CALL_TIMEOUT,
) -> McpToolset:
    """Start each server once and gather its tools; the caller closes the returned :class:`McpToolset`.

    Servers are given as :class:`McpServer` or as mappings with its field names (``{"command": "python",
    "args": ["server.py"]}``). A ValueError names the server when one cannot start or is no MCP server, and both
    servers when two offer a tool of the same name (give one a ``prefix``); servers already started are stopped
    before it is raised.
    """
    toolset = McpToolset()
    try:
        specs = [McpServer.coerce(s) for s in servers]
        owners: dict[str, McpClient] = {}
        for spec in specs:
            client = McpClient(spec, start_timeout=start_timeout, call_timeout=call_timeout)
            toolset.clients.append(client)
            for tool in client.tools:
                if tool.name in owners:
                    other = owners[tool.name]
                    raise ValueError(
                        f"MCP: two tools are named {tool.name!r}: "
                        + (
                            f"server `{spec.describe()}` lists it twice"
                            if other is client
                            else f"one from server `{other.server.describe()}` and one from server "
                            f"`{spec.describe()}`; give one of them a 'prefix'"
                        )
                    )
                owners[tool.name] = client
                toolset.tools.append(tool)
    except BaseException:
        toolset.close()
        raise
    return toolset
