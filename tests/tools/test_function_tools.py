"""Your own Python functions as tools (issue 15, first item): schema from hints and docstring, arguments checked,
errors as observations, and ``tools.functions`` wired into the jsoncall environment."""

from __future__ import annotations

import json
import textwrap

import pytest

from agentcredit.config import load_config
from agentcredit.tools.base import ToolCall, ToolRuntime
from agentcredit.tools.functions import FunctionTool, function_tools, load_function


def lookup(sku: str, quantity: int = 1) -> dict:
    """Price of an item in the shop.

    Args:
        sku: the item's code
        quantity: how many
    """
    if sku == "boom":
        raise RuntimeError("database is locked")
    return {"sku": sku, "total": 2.5 * quantity}


def untyped(sku):
    """Price.

    Args:
        sku: the item's code
    """


def test_schema_comes_from_the_type_hints_and_docstring():
    tool = FunctionTool(lookup)
    assert tool.name == "lookup"
    assert tool.schema == {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Price of an item in the shop.",
            "parameters": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "description": "the item's code"},
                    "quantity": {"type": "integer", "description": "how many"},
                },
                "required": ["sku"],
            },
        },
    }


def test_calls_are_checked_and_every_failure_is_an_observation():
    runtime = ToolRuntime({"lookup": FunctionTool(lookup)})
    ok, bad_type, missing, raised = runtime.run(
        [
            ToolCall("lookup", {"sku": "A1", "quantity": 2}),
            ToolCall("lookup", {"sku": "A1", "quantity": "two"}),
            ToolCall("lookup", {}),
            ToolCall("lookup", {"sku": "boom"}),
        ]
    )
    assert ok.ok and json.loads(ok.output) == {"sku": "A1", "total": 5.0}  # non-strings come back as JSON
    assert not bad_type.ok and bad_type.output.startswith(
        "ERROR: lookup: invalid arguments (argument 'quantity')"
    )
    assert not missing.ok and "'sku' is a required property" in missing.output
    assert not raised.ok and raised.output == "ERROR: tool 'lookup' failed: RuntimeError: database is locked"
    assert not any(
        r.infra for r in (ok, bad_type, missing, raised)
    )  # the model's or the tool's fault, not ours


def test_bad_user_code_is_named():
    with pytest.raises(
        ValueError,
        match=r"tool (tests\.tools\.)?test_function_tools:untyped: cannot build its JSON schema: Argument sku is missing a type hint",
    ):
        FunctionTool(untyped)
    with pytest.raises(ValueError, match=r"tools.functions: 'nocolon' is not 'package.module:function'"):
        load_function("nocolon")
    with pytest.raises(ValueError, match=r"cannot import module 'no_such_module_xyz'"):
        load_function("no_such_module_xyz:f")
    with pytest.raises(ValueError, match=r"module 'json' has no attribute 'nope'"):
        load_function("json:nope")
    with pytest.raises(ValueError, match=r"two tools are named 'lookup'"):
        function_tools([lookup, lookup])


def test_a_function_of_a_py_file_loads_with_the_plugins_loader(tmp_path):
    # one loader of a user's module (agentcredit.plugins.import_user_module): a .py path works here as in imports
    (tmp_path / "my_tool_file.py").write_text("def ping() -> str:\n    return 'pong'\n")
    assert load_function(f"{tmp_path}/my_tool_file.py:ping")() == "pong"
    (tmp_path / "broken_tool_file.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ValueError, match=r"^tools.functions: cannot import module .*: RuntimeError: boom$"):
        load_function(f"{tmp_path}/broken_tool_file.py:ping")


def test_config_adds_them_to_the_jsoncall_environment(tmp_path, monkeypatch):
    (tmp_path / "fn_tools_under_test.py").write_text(
        textwrap.dedent(
            '''
            def price(sku: str) -> str:
                """Price of an item.

                Args:
                    sku: the item's code
                """
                return "2.50"
            '''
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from agentcredit.environment import build_environment

    config = load_config(
        "portool-arith-tools", ["tools.functions=[fn_tools_under_test:price]", "tools.suite_tools=[]"]
    )
    env = build_environment(config)
    try:
        assert sorted(env.protocol.tool_names) == ["price", "response_gen"]  # the prompt shows only these
        assert '"description": "Price of an item."' in env.protocol.system_prompt
        assert env.tools.run_one(ToolCall("price", {"sku": "A1"})).output == "2.50"
    finally:
        env.close()
    with pytest.raises(ValueError, match="tools.functions and tools.mcp need protocol jsoncall or chat"):
        build_environment(load_config("grpo-arith-tools", ["tools.functions=[fn_tools_under_test:price]"]))
