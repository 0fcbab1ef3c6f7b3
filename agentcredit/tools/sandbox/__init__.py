"""The python tool: model-written code run in a sandbox (:mod:`~agentcredit.tools.sandbox.tool`).

The public API is re-exported here; the parts behind it are ``config`` (limits, settings, results), ``session``
(one call's life: lease a uid, start the child, read its frames), ``child`` (the code that runs inside, standard
library only), ``framing`` (the parent-child wire format) and ``procs`` (uid leases and process cleanup).
"""

from __future__ import annotations

from agentcredit.tools.sandbox.tool import *  # noqa: F403 (the public names are the module's own __all__)
from agentcredit.tools.sandbox.tool import __all__  # noqa: F401
