"""Plain Python functions as tools: the schema from type hints and docstring, arguments checked against it.

A user's tool is an ordinary typed function with a Google-style docstring::

    def query(sql: str, limit: int = 5) -> str:
        '''Run a read-only SQL query on the shop database.

        Args:
            sql: one SELECT statement
            limit: at most this many rows
        '''

Its OpenAI-style schema comes from ``transformers.utils.get_json_schema`` (the function transformers' chat
templates render tools with; not re-implemented here), and :class:`FunctionTool` is a :data:`ToolFn`: it checks
the model's arguments against that schema with ``jsonschema`` and returns a mismatch as an ``ERROR:`` observation,
calls the function, and turns a non-string result into JSON. An exception raised inside the function becomes an
observation too (:class:`~agentcredit.tools.base.ToolRuntime` catches it), never a crashed batch.

Config: ``tools.functions: ["package.module:function", ...]`` adds them to the jsoncall protocol (set
``tools.suite_tools: []`` to show the model only yours and ``response_gen``). Python: pass ``FunctionTool``
objects' ``schema`` to ``JsonCallProtocol(schemas=...)`` and the tools to ``ToolRuntime``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jsonschema
from jsonschema.exceptions import best_match

from agentcredit.plugins import UserModuleError, import_user_module

__all__ = ["ArgumentCheck", "FunctionTool", "function_tools", "load_function"]


def _where(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def load_function(spec: str, *, field: str = "tools.functions") -> Callable[..., Any]:
    """The callable ``"package.module:function"`` names (the module may also be a ``.py`` path, as in ``imports``:
    both are imported by :func:`agentcredit.plugins.import_user_module`); a ValueError naming the field, module and
    function."""
    module_name, sep, attr = str(spec).partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{field}: {spec!r} is not 'package.module:function'")
    try:
        module = import_user_module(module_name, where=field)
    except UserModuleError as exc:  # an ImportError, or the module's own code failing at import
        raise ValueError(
            f"{field}: cannot import module {module_name!r} for {spec!r}: {exc.detail}"
        ) from None
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ValueError(f"{field}: module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{field}: {spec!r} is a {type(target).__name__}, not a function")
    return target


class ArgumentCheck:
    """A tool's arguments checked against its JSON-schema ``parameters``; a mismatch is an ``ERROR:`` observation.

    Shared by every tool kind that has a schema (:class:`FunctionTool`, :class:`~agentcredit.tools.mcp.McpTool`),
    so the model reads the same words for the same mistake whichever kind of tool it called.
    """

    def __init__(self, tool_name: str, parameters: Mapping[str, Any]):
        validator_cls = jsonschema.validators.validator_for(parameters)
        validator_cls.check_schema(parameters)  # a broken schema fails when the tool is made, not per call
        self.tool_name = tool_name
        self._validator = validator_cls(parameters)

    def error(self, arguments: Any) -> str | None:
        """``None`` when ``arguments`` fit the schema, else ``ERROR: <tool>: invalid arguments ...``."""
        error = best_match(self._validator.iter_errors(arguments))
        if error is None:
            return None
        path = ".".join(str(p) for p in error.absolute_path)
        where = f" (argument {path!r})" if path else ""
        return f"ERROR: {self.tool_name}: invalid arguments{where}: {error.message}"


class FunctionTool:
    """A typed Python function as a tool: ``name``, its OpenAI-style ``schema``, and ``tool(arguments) -> str``."""

    def __init__(self, fn: Callable[..., Any]):
        from transformers.utils import get_json_schema  # transformers is a core dependency

        try:
            schema = get_json_schema(fn)
        except Exception as exc:  # DocstringParsingException / TypeHintParsingException, with their reason
            raise ValueError(
                f"tool {_where(fn)}: cannot build its JSON schema: {exc} (a tool needs a type hint on every "
                "argument and a docstring with an 'Args:' line per argument)"
            ) from exc
        function = dict(schema["function"])
        function.pop("return", None)  # not part of the OpenAI tool schema the prompt shows
        self.fn = fn
        self.name: str = function["name"]
        self.schema: dict[str, Any] = {"type": "function", "function": function}
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        self._check = ArgumentCheck(self.name, parameters)

    def __call__(self, arguments: dict[str, Any]) -> str:
        error = self._check.error(arguments)
        if error is not None:
            return error
        result = self.fn(**arguments)
        if isinstance(result, str):
            return result
        try:
            return json.dumps(result, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            return str(result)

    def __repr__(self) -> str:
        return f"FunctionTool({_where(self.fn)})"


def function_tools(
    functions: Sequence[Callable[..., Any] | str], *, field: str = "tools.functions"
) -> list[FunctionTool]:
    """Tools from callables or ``"module:function"`` strings; duplicate tool names are an error."""
    tools = [
        FunctionTool(load_function(f, field=f"{field}[{i}]") if isinstance(f, str) else f)
        for i, f in enumerate(functions)
    ]
    seen: dict[str, FunctionTool] = {}
    for tool in tools:
        if tool.name in seen:
            raise ValueError(f"{field}: two tools are named {tool.name!r}: {seen[tool.name]!r} and {tool!r}")
        seen[tool.name] = tool
    return tools
