"""PORTool's 17-tool suite (:mod:`~agentcredit.tools.suite.runtime`), re-exported here.

Behind it: ``schemas`` (the tools' JSON schemas), ``maths`` (``math_calculation``'s evaluator), ``units``
(``conversion_calculation``), ``timestamps`` (the ``timestamp_*`` tools), ``simulated`` (the dated fixture tools)
and ``data`` (fixture loading and the suite's context).
"""

from __future__ import annotations

from agentcredit.tools.suite.runtime import (
    DEFAULT_NOW,
    TOOL_NAMES,
    SuiteContext,
    UserLocation,
    build_suite,
    suite_runtime,
    suite_schemas,
    validate_arguments,
)

__all__ = [
    "DEFAULT_NOW",
    "TOOL_NAMES",
    "SuiteContext",
    "UserLocation",
    "build_suite",
    "suite_runtime",
    "suite_schemas",
    "validate_arguments",
]
