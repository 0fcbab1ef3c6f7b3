"""The tools of a local MCP server over stdio as agentcredit tools (issue 15): a two-tool server written here and
started with this interpreter; schemas, calls, errors as observations, concurrency, and every way the server itself
can fail (missing, not MCP, killed, slow) marked as such, never as the tool's answer."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
import time

import pytest

pytest.importorskip("mcp", reason="the optional 'mcp' extra is not installed")

from agentcredit.tools.base import ToolCall, ToolRuntime, UnavailableText  # noqa: E402
from agentcredit.tools.mcp import McpServer, mcp_tools  # noqa: E402

SERVER = textwrap.dedent(
    '''
    import asyncio
    import os
    import sys

    try:  # mcp 2
        from mcp.server.mcpserver import MCPServer as Server
    except ImportError:  # mcp 1
        from mcp.server.fastmcp import FastMCP as Server

    with open(sys.argv[1], "w") as f:
        f.write(str(os.getpid()))

    server = Server("shop")


    @server.tool()
    async def price(sku: str, quantity: int = 1, delay: float = 0.0) -> str:
        """Price of an item in the shop."""
        await asyncio.sleep(delay)
        return f"{sku}: {2.5 * quantity:.2f}"


    @server.tool()
    def restock(sku: str) -> str:
        """Order more of an item."""
        raise RuntimeError(f"the warehouse for {sku} is closed")


    server.run()
    '''
)


def _server(tmp_path, name: str = "shop", **kwargs) -> tuple[McpServer, os.PathLike]:
    script = tmp_path / "shop_server.py"
    if not script.exists():
        script.write_text(SERVER)
    pid_file = tmp_path / f"{name}.pid"
    return McpServer(sys.executable, [str(script), str(pid_file)], **kwargs), pid_file


def _gone(pid_file) -> bool:
    """The server process has exited and been reaped (a zombie still answers signal 0)."""
    try:
        os.kill(int(pid_file.read_text()), 0)
    except ProcessLookupError:
        return True
    return False


def _mcp_threads() -> set[threading.Thread]:
    """The threads MCP clients run (the module's shared server keeps its own alive throughout)."""
    return {t for t in threading.enumerate() if t.name.startswith("agentcredit-mcp")}


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    server, _ = _server(tmp_path_factory.mktemp("mcp"))
    with mcp_tools([server], start_timeout=60) as toolset:
        yield {tool.name: tool for tool in toolset.tools}


def test_schema_comes_from_the_servers_tool_listing(shop):
    assert list(shop) == ["price", "restock"]
    schema = shop["price"].schema
    assert schema["type"] == "function"
    assert schema["function"]["name"] == "price"
    assert schema["function"]["description"] == "Price of an item in the shop."
    parameters = schema["function"]["parameters"]
    assert parameters["type"] == "object" and parameters["required"] == ["sku"]
    assert {k: v["type"] for k, v in parameters["properties"].items()} == {
        "sku": "string",
        "quantity": "integer",
        "delay": "number",
    }


def test_answers_and_every_failure_of_the_tool_are_observations(shop):
    runtime = ToolRuntime(shop)
    ok, bad_type, missing, raised, unknown = runtime.run(
        [
            ToolCall("price", {"sku": "A1", "quantity": 2}),
            ToolCall("price", {"sku": "A1", "quantity": "two"}),
            ToolCall("restock", {}),
            ToolCall("restock", {"sku": "A1"}),
            ToolCall("refund", {}),
        ]
    )
    runtime.close()
    assert ok.ok and ok.output == "A1: 5.00"
    assert not bad_type.ok
    assert bad_type.output.startswith(
        "ERROR: price: invalid arguments (argument 'quantity')"
    )  # FunctionTool's words
    assert not missing.ok and "'sku' is a required property" in missing.output
    assert (
        not raised.ok
        and raised.output.startswith("ERROR: tool 'restock' failed: ")
        and "restock" in raised.output
    )
    assert not unknown.ok and "available: price, restock" in unknown.output
    assert not any(
        r.infra for r in (ok, bad_type, missing, raised, unknown)
    )  # the model's or the tool's doing


def test_calls_from_many_threads_share_one_session(shop):
    runtime = ToolRuntime(shop, max_workers=8)
    calls = [ToolCall("price", {"sku": f"S{i}", "quantity": i, "delay": 0.2}) for i in range(16)]
    start = time.perf_counter()
    results = runtime.run(calls)
    elapsed = time.perf_counter() - start
    runtime.close()
    assert [r.output for r in results] == [f"S{i}: {2.5 * i:.2f}" for i in range(16)]
    assert elapsed < 16 * 0.2  # they overlapped on the server instead of queueing one after another


def test_a_call_past_its_timeout_is_marked_infra(shop):
    client = shop["price"].client
    client.call_timeout, saved = 0.5, client.call_timeout
    try:
        slow = ToolRuntime(shop).run_one(ToolCall("price", {"sku": "A1", "delay": 5}))
    finally:
        client.call_timeout = saved
    assert slow.infra and not slow.ok and "did not answer within 0.5 s" in slow.output
    assert shop["price"]({"sku": "A1"}) == "A1: 2.50"  # the session is still usable


def test_a_missing_command_is_named():
    before = _mcp_threads()
    with pytest.raises(
        ValueError, match="cannot start it: command 'agentcredit-no-such-mcp-server' not found"
    ):
        mcp_tools([McpServer("agentcredit-no-such-mcp-server", ["--stdio"])])
    assert _mcp_threads() <= before


def test_a_program_that_is_no_mcp_server_is_named():
    not_mcp = McpServer(sys.executable, ["-c", "print('hello'); raise SystemExit('no tools here')"])
    with pytest.raises(ValueError, match=r"(?s)MCP server `.*-c .*`: .*is it an MCP server.*no tools here"):
        mcp_tools([not_mcp])


@pytest.mark.slow
def test_duplicate_tool_names_across_servers_stop_both_servers(tmp_path):
    first, first_pid = _server(tmp_path, "first")
    second, second_pid = _server(tmp_path, "second")
    before = _mcp_threads()
    with pytest.raises(ValueError, match="two tools are named 'price'.*give one of them a 'prefix'"):
        mcp_tools([first, {"command": second.command, "args": list(second.args)}], start_timeout=60)
    assert _gone(first_pid) and _gone(second_pid)
    assert _mcp_threads() <= before


@pytest.mark.parametrize("while_calling", [True, False], ids=["mid-call", "idle"])
def test_a_server_killed_mid_session_gives_infra_results(tmp_path, while_calling):
    before = _mcp_threads()
    server, pid_file = _server(tmp_path, prefix="shop_")
    toolset = mcp_tools([server], start_timeout=60)
    runtime = ToolRuntime({t.name: t for t in toolset.tools})
    assert runtime.run_one(ToolCall("shop_price", {"sku": "A1"})).output == "A1: 2.50"
    pid = int(pid_file.read_text())
    if while_calling:
        pending = runtime.submit([ToolCall("shop_price", {"sku": "A1", "delay": 30})])
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        [first] = pending.result(timeout=20)
    else:
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not _gone(pid_file) and time.monotonic() < deadline:  # reaped: the client's end has seen it
            time.sleep(0.05)
        first = runtime.run_one(ToolCall("shop_price", {"sku": "A1"}))
    after = runtime.run_one(ToolCall("shop_price", {"sku": "A1"}))
    runtime.close()
    for result in (first, after):
        assert result.infra and not result.ok
        assert "is not running" in result.output and "shop_server.py" in result.output
    assert isinstance(toolset.tools[0]({"sku": "A1"}), UnavailableText)
    toolset.close()
    assert _gone(pid_file) and _mcp_threads() <= before


def test_close_stops_the_server_and_its_threads(tmp_path):
    before = _mcp_threads()
    server, pid_file = _server(tmp_path)
    with mcp_tools([server], start_timeout=60) as toolset:
        price = toolset.tools[0]
        assert price({"sku": "A1"}) == "A1: 2.50"
        assert not _gone(pid_file) and _mcp_threads() > before
    assert _gone(pid_file) and _mcp_threads() <= before
    closed = price({"sku": "A1"})
    assert isinstance(closed, UnavailableText) and "it was closed" in closed
    toolset.close()  # twice is harmless


def test_without_the_mcp_package_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mcp", None)  # `import mcp` now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'agentcredit\[mcp\]'"):
        mcp_tools([McpServer("any-server")])


@pytest.mark.slow
def test_config_tools_mcp_builds_a_chat_environment_that_stops_its_server(tmp_path):
    """``tools.mcp`` in a config: the server's tools are shown in the chat protocol, run, and stop with the
    environment; a build that fails after the server started stops it too."""
    from agentcredit.config import load_config
    from agentcredit.environment import build_environment
    from agentcredit.tools.base import ToolCall

    server, pid_file = _server(tmp_path)
    entry = {"command": server.command, "args": list(server.args)}
    config = load_config("grpo-arith-tools", ["protocol.name=chat", "protocol.options={}"])
    config.tools.mcp = [entry]
    env = build_environment(config)
    try:
        assert [s["function"]["name"] for s in env.protocol.schemas] == [
            "price",
            "restock",
        ]  # shown to the model
        assert env.tools.run_one(ToolCall("price", {"sku": "A1"})).output == "A1: 2.50"
    finally:
        env.close()
    assert _gone(pid_file)

    again, pid_again = _server(tmp_path, "again")
    config.tools.mcp = [{"command": again.command, "args": list(again.args)}]
    config.tools.suite_tools = ["no_such_tool"]  # fails after the server started
    with pytest.raises(ValueError, match="unknown tool"):
        build_environment(config)
    assert _gone(pid_again)


WAREHOUSE_SERVER = textwrap.dedent(
    '''
    import os
    import sys

    from agentcredit.tools.mcp_server import mcp_server, server_class

    server = mcp_server("warehouse") if sys.argv[1] == "keep" else server_class()("warehouse")
    STOCK = {"bolt": 40}


    @server.tool()
    def stock(item: str) -> str:
        """Units of an item in stock.

        Args:
            item: the item's name
        """
        return str(STOCK[item])


    @server.tool()
    async def where() -> str:
        """The warehouse this server was told about."""
        return os.environ.get("WAREHOUSE", "no WAREHOUSE in my environment")


    server.run()
    '''
)


@pytest.mark.parametrize("mode", ["keep", "sdk"])
def test_a_tool_that_raises_reaches_the_model_with_its_reason(tmp_path, mode, caplog):
    """Issue 35: on mcp 2 a raising tool read "Error executing tool stock", its reason lost (a function tool keeps
    it). mcp_server() keeps it on mcp 1 and 2 alike, in a function tool's words; a plain SDK server on mcp 2 cannot,
    and the operator is told once how to fix that."""
    import importlib.metadata

    from agentcredit.tools.base import run_call
    from agentcredit.tools.functions import FunctionTool

    script = tmp_path / "warehouse_server.py"
    script.write_text(WAREHOUSE_SERVER)
    env = {
        "PYTHONPATH": os.pathsep.join(sys.path),
        "WAREHOUSE": "north",
    }  # the server gets only what is passed
    with mcp_tools([McpServer(sys.executable, [str(script), mode], env=env)]) as toolset:
        tools = {t.name: t for t in toolset.tools}
        assert run_call(tools, ToolCall("stock", {"item": "bolt"})).output == "40"
        assert run_call(tools, ToolCall("where", {})).output == "north"
        with caplog.at_level("WARNING", logger="agentcredit.tools.mcp"):
            failed = run_call(tools, ToolCall("stock", {"item": "washer"}))
            run_call(tools, ToolCall("stock", {"item": "nut"}))

    def stock(item: str) -> str:
        """Units of an item in stock.

        Args:
            item: the item's name
        """
        return str({"bolt": 40}[item])

    as_function = run_call({"stock": FunctionTool(stock)}, ToolCall("stock", {"item": "washer"}))
    assert not failed.ok and not failed.infra
    withheld = mode == "sdk" and importlib.metadata.version("mcp").startswith("2.")
    if withheld:
        assert failed.output == "ERROR: tool 'stock' failed: Error executing tool stock"
        assert sum("withholds why its tool 'stock' failed" in r.message for r in caplog.records) == 1
    else:
        assert failed.output == as_function.output == "ERROR: tool 'stock' failed: KeyError: 'washer'"


@pytest.mark.slow
def test_the_schema_difference_of_an_mcp_tool_and_a_function(tmp_path):
    """What docs/bring-your-own-agent.md says: FastMCP puts the whole docstring, Args block included, in the
    description and gives no per-argument description; a function tool splits them (transformers' parser)."""
    from agentcredit.tools.functions import FunctionTool

    script = tmp_path / "warehouse_server.py"
    script.write_text(WAREHOUSE_SERVER)
    env = {"PYTHONPATH": os.pathsep.join(sys.path)}
    with mcp_tools([McpServer(sys.executable, [str(script), "keep"], env=env)]) as toolset:
        remote = next(t for t in toolset.tools if t.name == "stock").schema["function"]

    def stock(item: str) -> str:
        """Units of an item in stock.

        Args:
            item: the item's name
        """

    local = FunctionTool(stock).schema["function"]
    assert local["description"] == "Units of an item in stock."
    assert local["parameters"]["properties"]["item"] == {"type": "string", "description": "the item's name"}
    assert "Args:" in remote["description"] and "item: the item's name" in remote["description"]
    assert "description" not in remote["parameters"]["properties"]["item"]
