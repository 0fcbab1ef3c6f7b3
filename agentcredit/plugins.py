"""Your own methods, signals, providers and tools, registered from your own modules without editing agentcredit.

A module registers what it defines when it is imported (``register_method``, ``register_signal``,
``register_provider``, ...). agentcredit imports two kinds before it reads a config's method:

* the config's ``imports`` list (the native config's top-level ``imports:``, verl's ``agentcredit.imports``), each
  an importable module name (``my_pkg.my_method``) or the path of a ``.py`` file (relative to the working
  directory, as verl's ``custom_reward_function.path``);
* every entry point of the group :data:`ENTRY_POINT_GROUP` of the installed distributions, once per process, as
  verl loads its ``verl.plugins`` group (``[project.entry-points."agentcredit.plugins"] my_method = "my_pkg.m"``).

A module that cannot be imported, or fails while importing, is one error line naming the ``imports`` entry.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

__all__ = [
    "ENTRY_POINT_GROUP",
    "UserModuleError",
    "import_user_module",
    "import_user_modules",
    "load_entry_points",
]

#: The entry-point group whose modules every agentcredit process imports before reading a config.
ENTRY_POINT_GROUP = "agentcredit.plugins"

_loaded_entry_points: list[str] | None = None


def _is_path(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def _import_file(path: Path) -> ModuleType:
    path = path.resolve()
    # one module per file, whatever the spelling of its path; the stem keeps tracebacks readable
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    name = f"agentcredit_user_{path.stem.replace('-', '_')}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


class UserModuleError(ValueError):
    """A user's module that cannot be imported or raises while it runs: the one-line message names the config
    field; ``spec`` is the module asked for and ``detail`` the failure's first line (``"ModuleNotFoundError: ..."``),
    for a caller that words the error its own way."""

    def __init__(self, message: str, spec: str, detail: str):
        super().__init__(message)
        self.spec, self.detail = spec, detail


def import_user_module(spec: str, *, where: str = "imports") -> ModuleType:
    """Import ``spec`` (a module name or a ``.py`` path); a :class:`UserModuleError` (a ValueError) naming ``where``
    when it cannot be imported or raises while it runs. Importing a module again is a no-op (Python caches it)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"{where}: a module name or a path to a .py file, got {spec!r}")
    spec = spec.strip()
    try:
        if _is_path(spec):
            return _import_file(Path(spec))
        return importlib.import_module(spec)
    except Exception as exc:  # the user's module: its failure is theirs, one line, no traceback
        detail = f"{type(exc).__name__}: {exc}".splitlines()[0]
        raise UserModuleError(f"{where}: cannot import {spec!r} ({detail})", spec, detail) from None


def import_user_modules(specs: Sequence[str], *, where: str = "imports") -> list[ModuleType]:
    """Import each module of a config's ``imports`` list in order (errors name ``<where>[i]``)."""
    if isinstance(specs, str) or not isinstance(specs, Sequence):
        raise ValueError(f"{where}: a list of module names or .py paths, got {specs!r}")
    return [import_user_module(spec, where=f"{where}[{i}]") for i, spec in enumerate(specs)]


def load_entry_points() -> list[str]:
    """Import every module of the :data:`ENTRY_POINT_GROUP` entry points, once per process; returns their names.
    A plugin that fails is an error naming it (an installed package that breaks on import would otherwise silently
    leave its method unknown)."""
    global _loaded_entry_points
    if _loaded_entry_points is None:
        names = []
        for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            try:
                ep.load()
            except Exception as exc:
                detail = f"{type(exc).__name__}: {exc}".splitlines()[0]
                raise ValueError(
                    f"the {ENTRY_POINT_GROUP} entry point {ep.name!r} ({ep.value}) fails on import: {detail}"
                ) from None
            names.append(ep.name)
        _loaded_entry_points = names
    return list(_loaded_entry_points)
