"""Every place that builds the python tool runs the sandbox preflight (``check_available``) first.

``tools.build.build_tools`` did since the preflight was added; the rollout benchmark (``agentcredit bench
rollout --task arith-tools``) and verl's agent-loop workers (``integrations.verl.tools.build_runtime``) built the
tool without it, so a sandbox that cannot run turned every tool call into an error text instead of stopping
with one message. The verl module needs no verl to import (pydantic only), so this runs in the main venv.
"""

from __future__ import annotations

from dataclasses import asdict

import pytest

from agentcredit.tools.base import ToolUnavailableError
from agentcredit.tools.sandbox import tool as ps


@pytest.fixture
def broken_sandbox(monkeypatch, tmp_path):
    """A sandbox pointed at an interpreter that does not exist: print(1) cannot run."""
    previous = ps.configure(python=str(tmp_path / "no-such-python"), uid_base=1_996_440, uid_count=8)
    monkeypatch.setattr(ps, "_modes", {})
    monkeypatch.setattr(ps, "_announced", set())
    monkeypatch.setattr(ps, "_checked", set())
    yield
    ps.configure(**asdict(previous))


def _preflight_message() -> str:
    with pytest.raises(ToolUnavailableError) as caught:
        ps.check_available()
    return str(caught.value)


def test_bench_rollout_runs_the_preflight(broken_sandbox):
    from agentcredit.lab.bench.rollout import build_task

    expected = _preflight_message()
    with pytest.raises(ToolUnavailableError) as caught:
        build_task("arith-tools", 2)
    assert str(caught.value) == expected  # the same one message as every other command
    assert "To fix it" in expected


def test_verl_agent_loop_tools_run_the_preflight(broken_sandbox):
    pytest.importorskip("pydantic")
    from agentcredit.integrations.verl.settings import ToolSettings
    from agentcredit.integrations.verl.tools import build_runtime

    expected = _preflight_message()
    with pytest.raises(ToolUnavailableError) as caught:
        build_runtime(ToolSettings(python=True))
    # the shared preflight's one message, prefixed with the node and followed by what to change on it (issue 36)
    message = str(caught.value)
    assert message.startswith("agentcredit.tools.python on node ") and f": {expected}. " in message
    assert "bubblewrap" in message.split(expected, 1)[1]
    build_runtime(ToolSettings()).close()  # no python tool asked for: no preflight, nothing raised


def test_both_call_the_shared_preflight(monkeypatch):
    """They call agentcredit.tools.sandbox.check_available itself (no copy of its logic), so its once-per-process
    cache holds."""
    import agentcredit.tools.sandbox

    calls = []
    monkeypatch.setattr(
        agentcredit.tools.sandbox, "check_available", lambda isolation="bwrap": calls.append(isolation)
    )
    from agentcredit.integrations.verl.settings import ToolSettings
    from agentcredit.integrations.verl.tools import build_runtime
    from agentcredit.lab.bench.rollout import build_task

    build_task("arith-tools", 1)[1].close()
    build_runtime(ToolSettings(python=True)).close()
    assert calls == ["bwrap", "bwrap"]


# ---- strict isolation by default (issue 52) -----------------------------------------------------------------------


@pytest.fixture
def no_bubblewrap(monkeypatch, tmp_path):
    """A machine without bubblewrap, with the fallback's interpreter usable (so only the mode's choice matters)."""
    real_which = ps.shutil.which
    monkeypatch.setattr(ps.shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    previous = ps.configure(python="/usr/bin/python3", uid_base=1_996_440, uid_count=8)
    monkeypatch.setattr(ps, "_modes", {})
    monkeypatch.setattr(ps, "_announced", set())
    monkeypatch.setattr(ps, "_checked", set())
    yield
    ps.configure(**asdict(previous))


def test_model_written_code_never_falls_back_unless_asked_by_name(no_bubblewrap):
    # One failed bubblewrap probe dropped the whole process to the rlimits fallback with a warning only; in that
    # mode a daemon survived a kill -9 of the host. The default is now bubblewrap or nothing.
    with pytest.raises(ToolUnavailableError) as caught:
        ps.check_available()
    message = str(caught.value)
    assert "\n" not in message and "bubblewrap is not installed" in message
    assert "isolation='rlimits'" in message and "tools.sandbox_isolation: rlimits" in message
    assert ps.python_tool()({"code": "print(1)"}).startswith("ERROR: the python sandbox is unavailable")
    with pytest.raises(ValueError, match="'auto' no longer exists"):
        ps.sandbox_mode("auto")  # type: ignore[arg-type]


def test_training_builds_the_sandbox_with_the_configured_isolation(monkeypatch):
    import agentcredit.tools.sandbox
    from agentcredit.config import load_config
    from agentcredit.tools.build import build_tools

    calls = []
    monkeypatch.setattr(
        agentcredit.tools.sandbox, "check_available", lambda isolation="bwrap": calls.append(isolation)
    )
    for settings, expected in (([], "bwrap"), (["tools.sandbox_isolation=rlimits"], "rlimits")):
        config = load_config("grpo-arith-tools", settings)
        build_tools(config, "codefence", None).close()
        assert calls.pop() == expected
