from pathlib import Path

import pytest

from agentcredit.tasks.paths import PACKAGE_DIR

SHARED_DATA = PACKAGE_DIR.parent.parent / "shared" / "data"


@pytest.fixture
def shared_data() -> Path:
    """The real benchmark files (``../shared/data``); tests that need them skip cleanly without them."""
    if not (SHARED_DATA / "README.md").is_file():
        pytest.skip(f"real benchmark files not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture
def samples_only(tmp_path, monkeypatch) -> Path:
    """No real data: $AGENTCREDIT_DATA points at an empty folder, caches go to a temp home."""
    empty = tmp_path / "empty-data"
    empty.mkdir()
    monkeypatch.setenv("AGENTCREDIT_DATA", str(empty))
    monkeypatch.setenv("AGENTCREDIT_HOME", str(tmp_path / "home"))
    return empty


@pytest.fixture
def temp_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("AGENTCREDIT_HOME", str(home))
    return home
