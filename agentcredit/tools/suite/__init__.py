"""PORTool's 17-tool suite (:mod:`~agentcredit.tools.suite.runtime`), re-exported here.

Behind it: ``schemas`` (the tools' JSON schemas), ``maths`` (``math_calculation``'s evaluator), ``units``
(``conversion_calculation``), ``timestamps`` (the ``timestamp_*`` tools), ``simulated`` (the dated fixture tools)
and ``data`` (fixture loading and the suite's context).
"""

from __future__ import annotations

from agentcredit.tools.suite.runtime import *  # noqa: F403 (the public names are the module's own __all__)
from agentcredit.tools.suite.runtime import __all__  # noqa: F401
