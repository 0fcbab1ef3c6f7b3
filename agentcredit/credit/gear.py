"""GEAR's maths under its old path: it lives in its method's home, :mod:`agentcredit.credit.methods.gear.maths`.

Kept only while the lab's mechanism probe (``experiment/mechanism/gear.py``, being moved out of the package)
imports ``gear_details`` from here; once it imports it from :mod:`agentcredit.credit`, delete this file.
"""

from agentcredit.credit.methods.gear.maths import *  # noqa: F403
from agentcredit.credit.methods.gear.maths import __all__  # noqa: F401
