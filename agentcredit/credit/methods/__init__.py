"""The credit methods, one module each: settings, needs, the estimate or modifier, and optional hooks.

``METHODS[name]`` is what both trainers call (:class:`~agentcredit.credit.methods.base.Method`); a method from
your own package joins them with :func:`register_method` (``docs/adding-a-method.md``), and a signal it reads
that no built-in method does with :func:`register_signal`.

The built-in methods are found, not listed: every module of this package other than ``base`` (and ``_private``
helpers) is a method file and must define ``METHOD``; importing the package registers each one, in module-name
order. :data:`BUILT_IN` names them; the native config and verl's block give each its settings section from it, so
a built-in method is its method file, its preset and its tests.
"""

import importlib
import pkgutil

from agentcredit.credit.methods.base import (
    CRITIC_BASELINE,
    DEFAULT_METHOD,
    DEMO_METHOD,
    GROUP_BASELINE,
    METHODS,
    SIGNALS,
    Method,
    Needs,
    NoSettings,
    Settings,
    compose,
    get_method,
    modifier_names,
    register_method,
    register_signal,
    resolve_method,
    unregister_method,
    unregister_signal,
)


def _discover() -> tuple[str, ...]:
    names = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name == "base" or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        method = getattr(module, "METHOD", None)
        if not isinstance(method, Method):
            raise ImportError(f"{module.__file__}: a method file defines METHOD = Method(...)")
        names.append(register_method(method).name)
    return tuple(names)


#: The methods of this package (registered on import, in module-name order); user-registered ones are not here.
BUILT_IN: tuple[str, ...] = _discover()

__all__ = [
    "BUILT_IN",
    "CRITIC_BASELINE",
    "DEFAULT_METHOD",
    "DEMO_METHOD",
    "GROUP_BASELINE",
    "METHODS",
    "SIGNALS",
    "Method",
    "Needs",
    "NoSettings",
    "Settings",
    "compose",
    "get_method",
    "modifier_names",
    "register_method",
    "register_signal",
    "resolve_method",
    "unregister_method",
    "unregister_signal",
]
