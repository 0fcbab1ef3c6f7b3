"""Where data and caches live.

Real benchmark files are looked up in ``$AGENTCREDIT_DATA`` if set, else in ``../shared/data`` next to the
repository (the layout of a development checkout). When neither has a dataset, the loaders fall back to the
small samples shipped inside the package (``agentcredit/data/samples/``), so the package works anywhere.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]
SAMPLES_DIR = PACKAGE_DIR / "data" / "samples"
DATA_ENV = "AGENTCREDIT_DATA"
HOME_ENV = "AGENTCREDIT_HOME"


def data_root() -> Path | None:
    """``$AGENTCREDIT_DATA`` (which must be a directory), else ``<repo>/../shared/data`` if present, else None."""
    configured = os.environ.get(DATA_ENV)
    if configured:
        root = Path(configured).expanduser()
        if not root.is_dir():
            raise ValueError(
                f"${DATA_ENV}={configured} is not a directory; unset it or point it at the data folder"
            )
        return root
    shared = PACKAGE_DIR.parent.parent / "shared" / "data"
    return shared if shared.is_dir() else None


def default_cache_dir() -> Path:
    """``$AGENTCREDIT_HOME`` (the search tool keeps its indexes there too), else ``~/.cache/agentcredit``."""
    home = os.environ.get(HOME_ENV)
    return Path(home).expanduser() if home else Path.home() / ".cache" / "agentcredit"
