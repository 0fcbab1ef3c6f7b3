"""The sandboxed Python tool on ordinary programs: output, auto-display, tracebacks, limits, search, pool, tool.

Every test that runs code runs in both isolation modes (``bwrap`` and the ``rlimits`` fallback) where the machine
has them. The hostile programs are in ``test_sandbox_hostile.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import asdict
from pathlib import Path

import pytest

from agentcredit.tools.base import ToolCall, ToolRuntime
from agentcredit.tools.sandbox import (
    SandboxLimits,
    SandboxPool,
    SandboxResult,
    python_tool,
    run_python,
    tool_text,
)
from agentcredit.tools.sandbox import tool as ps

# A uid range of the tests' own, so sandboxes that other programs run on this machine do not disturb the checks.
TEST_UID_BASE, TEST_UID_COUNT = 1_996_000, 16
FAST = SandboxLimits(timeout=2.0)

PASSAGES = [
    ("Paris", "Paris is the capital of France."),
    ("Berlin", "Berlin is the capital of Germany."),
    ("Rome", "Rome is the capital of Italy."),
]


def keyword_search(query: str, k: int = 3) -> str:
    """A small real retriever: rank passages by words shared with the query (stable on ties)."""
    words = set(query.lower().split())
    ranked = sorted(PASSAGES, key=lambda p: -len(words & set(p[1].lower().rstrip(".").split())))
    return "\n".join(f"Doc {i} (Title: {t}) {x}" for i, (t, x) in enumerate(ranked[:k], 1))


def resolve_mode(isolation: str) -> ps.SandboxMode:
    """The mode, or a skip when this machine cannot run it. The fallback needs an interpreter that other users
    can read (a pyenv under a 0700 /root is not), so a system interpreter is tried when the default fails."""
    try:
        return ps.sandbox_mode(isolation)  # type: ignore[arg-type]
    except RuntimeError as exc:
        if isolation == "bwrap":
            pytest.skip(f"bubblewrap does not work here: {exc}")
        for candidate in ("/usr/bin/python3", shutil.which("python3")):
            if candidate and os.path.exists(candidate):
                ps.configure(python=candidate)
                try:
                    return ps.sandbox_mode(isolation)  # type: ignore[arg-type]
                except RuntimeError:
                    continue
        pytest.skip(f"the fallback sandbox cannot run Python here: {exc}")


@pytest.fixture(scope="module")
def sandbox_tmp_root():
    """A parent for the fallback's working directories that the sandbox uid can cross (pytest's are 0700)."""
    root = tempfile.mkdtemp(prefix="agentcredit-sbx-test-")
    os.chmod(root, 0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module", params=["bwrap", "rlimits"])
def isolation(request, sandbox_tmp_root):
    previous = ps.configure(uid_base=TEST_UID_BASE, uid_count=TEST_UID_COUNT, tmp_root=sandbox_tmp_root)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the fallback's "which mode" warning is tested on its own below
            resolve_mode(request.param)
        yield request.param
    finally:
        ps.configure(**asdict(previous))


def run(code: str, isolation: str, **kwargs) -> SandboxResult:
    kwargs.setdefault("limits", FAST)
    return run_python(code, isolation=isolation, **kwargs)


# ---- output and Jupyter-style display ---------------------------------------------------------------------------


def test_print(isolation):
    result = run("print('hello')\nprint(1 + 1)", isolation)
    assert result == SandboxResult(True, "hello\n2\n", None, None, 0, result.seconds, isolation, False, 0)


def test_last_expression_is_displayed(isolation):
    assert run("x = 6 * 7\nx", isolation).output == "42\n"
    assert run("[1, 'a']", isolation).output == "[1, 'a']\n"  # repr for non-strings
    assert run("'two\\nlines'", isolation).output == "two\nlines\n"  # text as text, not a quoted repr


def test_display_only_the_last_bare_expression(isolation):
    assert run("1\n2\n3", isolation).output == "3\n"
    assert run("x = 5", isolation).output == ""  # an assignment displays nothing
    assert run("None", isolation).output == ""
    assert run("print('a')", isolation).output == "a\n"  # print returns None: no extra 'None' line
    assert run("6 * 7;", isolation).output == ""  # a trailing semicolon suppresses display, as in Jupyter


def test_math_is_preimported_and_each_block_is_fresh(isolation):
    assert run("math.sqrt(16)", isolation).output == "4.0\n"
    first = run("secret = 1\nopen('note.txt', 'w').write('x')", isolation)
    assert first.ok
    second = run("import os\nprint(os.listdir('.'))\nsecret", isolation)
    assert second.output.startswith("[]\n")  # a fresh working directory
    assert second.error == "exception: NameError: name 'secret' is not defined"


def test_exception_gives_the_tracebacks_last_lines(isolation):
    result = run("print('before')\ndef f(x):\n    return 1 / x\nf(0)", isolation)
    assert not result.ok and result.error_kind == "exception"
    assert result.error == "exception: ZeroDivisionError: division by zero"
    assert result.output.startswith("before\nTraceback (most recent call last):\n")
    assert 'File "<cell>", line 4, in <module>' in result.output
    assert "    return 1 / x\n" in result.output  # the source line is shown
    assert result.output.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "<sandbox>" not in result.output  # the bootstrap's own frames are hidden


def test_long_traceback_is_cut_to_its_last_lines(isolation):
    code = "def f(n):\n    if n == 0:\n        raise ValueError('deep')\n    f(n - 1)\nf(20)"
    result = run(code, isolation, limits=SandboxLimits(timeout=2.0, traceback_lines=4))
    lines = result.output.rstrip("\n").split("\n")
    assert lines[0] == "[traceback cut to its last 4 lines]"
    assert len(lines) == 5 and lines[-1] == "ValueError: deep"


def test_syntax_error_shows_where(isolation):
    result = run("x = (1,\n", isolation)
    assert result.error_kind == "exception" and result.error.startswith("exception: SyntaxError:")
    assert 'File "<cell>", line 1' in result.output and "ast.py" not in result.output


def test_stderr_is_captured_with_stdout_in_order(isolation):
    result = run("import sys\nprint('out1')\nprint('err', file=sys.stderr)\nprint('out2')", isolation)
    assert result.output == "out1\nerr\nout2\n"


def test_unicode_round_trip(isolation):
    result = run("s = 'é 中文 🙂'\nprint(s)\nlen(s)", isolation)
    assert result.output == "é 中文 🙂\n6\n"
    assert run("变量 = 'ok'\n变量", isolation).output == "ok\n"


def test_stdin_is_empty(isolation):
    result = run("input()", isolation)
    assert result.error == "exception: EOFError: EOF when reading a line"


def test_output_cap_keeps_head_and_tail_with_a_marker(isolation):
    code = "print('FIRST')\nfor i in range(2000): print('line', i)\nprint('LAST')"
    result = run(code, isolation, limits=SandboxLimits(timeout=2.0, output_bytes=1024))
    assert result.ok and result.truncated
    assert result.output.startswith("FIRST\nline 0\n")
    assert result.output.endswith("line 1999\nLAST\n")
    assert "[... output truncated:" in result.output
    assert len(result.output.encode()) < 1024 + 100  # the cap plus the marker


def test_environment_is_scrubbed(isolation, monkeypatch):
    monkeypatch.setenv("AGENTCREDIT_TEST_SECRET", "do-not-leak")
    result = run("import os\nsorted(k for k in os.environ if 'SECRET' in k or 'TOKEN' in k)", isolation)
    assert result.output == "[]\n"
    assert run("import os\nos.environ['LANG']", isolation).output == "C.UTF-8\n"


def test_runs_as_an_unprivileged_uid_in_a_private_directory(isolation):
    result = run("import os\nprint(os.getuid(), os.geteuid(), os.getgroups())\nos.getcwd()", isolation)
    uid_line, cwd = result.output.splitlines()
    uid, euid, groups = uid_line.split(" ", 2)
    if os.geteuid() == 0:
        assert TEST_UID_BASE <= int(uid) < TEST_UID_BASE + TEST_UID_COUNT and uid == euid
        assert groups == "[]"
    assert (cwd == "/home/sandbox") if isolation == "bwrap" else cwd.startswith(ps.settings().tmp_root)


def test_file_size_limit(isolation):
    code = "open('big', 'wb').write(b'x' * (3 * 1024 * 1024))"
    result = run(code, isolation, limits=SandboxLimits(timeout=2.0, file_bytes=1024 * 1024))
    assert result.error_kind == "exception" and "File too large" in result.error


def test_cpu_time_limit(isolation):
    result = run("while True: pass", isolation, limits=SandboxLimits(timeout=5.0, cpu_seconds=1))
    assert result.error_kind == "cpu" and "CPU time limit" in result.error
    assert result.seconds < 4.0  # stopped by the CPU limit, well before the 5 s wall clock


def test_exit_status_zero_is_ok_and_keeps_output(isolation):
    result = run("print('done')\nimport sys\nsys.exit(0)", isolation)
    assert result.ok and result.output == "done\n"
    assert run("raise SystemExit(3)", isolation).error == "exit status 3"


def test_code_too_long_is_not_run(isolation):
    result = run("#" * 300, isolation, limits=SandboxLimits(timeout=2.0, max_code_bytes=100))
    assert result.error_kind == "input" and "more than the 100-byte limit" in result.error


def test_empty_code(isolation):
    assert run("", isolation).ok and run("", isolation).output == ""


def test_no_descriptor_or_thread_leaks(isolation):
    run("print(1)", isolation, search_fn=keyword_search)  # warm up (mode probe, imports)
    fds, threads = len(os.listdir("/proc/self/fd")), threading.active_count()
    for code in ["print(1)", "1 / 0", "while True: pass", "search('x')", "import os\nos.closerange(3, 99)"]:
        run(code, isolation, search_fn=keyword_search, limits=SandboxLimits(timeout=0.5))
    assert len(os.listdir("/proc/self/fd")) == fds and threading.active_count() == threads


# ---- search() over the control pipe -----------------------------------------------------------------------------


def test_search_round_trip(isolation):
    result = run("r = search('capital of Germany', k=2)\nprint(r)", isolation, search_fn=keyword_search)
    assert result.ok and result.search_calls == 1
    assert result.output == keyword_search("capital of Germany", 2) + "\n"
    assert result.output.startswith("Doc 1 (Title: Berlin) Berlin is the capital of Germany.")


def test_search_as_last_expression_is_displayed(isolation):
    result = run("search('Italy')", isolation, search_fn=keyword_search)
    assert result.output == keyword_search("Italy", 3) + "\n"


def test_search_accepts_an_object_with_a_search_method(isolation):
    class Index:
        def search(self, query: str, k: int = 3) -> str:
            return f"{query}|{k}"

    assert run("search('q', 5)", isolation, search_fn=Index()).output == "q|5\n"


def test_search_without_an_index_raises_inside(isolation):
    result = run("search('x')", isolation)
    assert result.error_kind == "exception" and "no search index" in result.error


def test_search_bad_arguments_raise_inside(isolation):
    assert (
        "k must be an int from 1 to 50" in run("search('x', k=0)", isolation, search_fn=keyword_search).error
    )
    assert "TypeError" in run("search(3)", isolation, search_fn=keyword_search).error


def test_search_failure_in_the_host_is_reported_to_the_code(isolation):
    def broken(query: str, k: int) -> str:
        raise KeyError("index not loaded")

    result = run("search('x')", isolation, search_fn=broken)
    assert result.error == "exception: RuntimeError: search() failed: KeyError: 'index not loaded'"


def test_search_call_limit(isolation):
    limits = SandboxLimits(timeout=2.0, max_search_calls=2)
    code = "for i in range(3):\n    print(search(f'q{i}')[:5])"
    result = run(code, isolation, search_fn=lambda q, k: f"hit {q}", limits=limits)
    assert result.output.startswith("hit q\nhit q\n") and result.search_calls == 2
    assert "call limit reached (2 per run)" in result.error


def test_time_spent_in_search_is_not_the_codes(isolation):
    def slow(query: str, k: int) -> str:
        time.sleep(0.25)
        return "ok"

    # Four searches take 1 s of the host's time, more than the 0.8 s limit: only the code's own time counts.
    code = "for _ in range(4): search('x')\nprint('done')"
    result = run(code, isolation, search_fn=slow, limits=SandboxLimits(timeout=0.8))
    assert result.ok and result.output == "done\n" and result.seconds > 1.0


# ---- pool and tool adapter --------------------------------------------------------------------------------------


def test_pool_runs_concurrently_with_a_bound(isolation):
    codes = [f"import time\ntime.sleep(0.4)\nprint({i})" for i in range(4)]
    with SandboxPool(2, limits=FAST, isolation=isolation) as pool:
        start = time.monotonic()
        results = pool.map(codes)
        elapsed = time.monotonic() - start
    assert [r.output for r in results] == ["0\n", "1\n", "2\n", "3\n"]  # in order
    assert 0.8 <= elapsed < 1.6  # two waves of two: concurrent, and never more than two at once


def test_pool_submit_and_search(isolation):
    with SandboxPool(2, limits=FAST, search_fn=keyword_search, isolation=isolation) as pool:
        futures = [pool.submit(f"search('capital of {c}', 1)") for c in ("France", "Italy")]
        outputs = [f.result().output for f in futures]
    assert outputs == [
        keyword_search("capital of France", 1) + "\n",
        keyword_search("capital of Italy", 1) + "\n",
    ]


def test_tool_in_tool_runtime(isolation):
    runtime = ToolRuntime({"python": python_tool(keyword_search, isolation=isolation, timeout=1.0)})
    calls = [
        ToolCall("python", {"code": "print(2 + 2)"}),
        ToolCall("python", {"code": "search('Germany', 1)"}),
        ToolCall("python", {"code": "1 / 0"}),
        ToolCall("python", {"code": "while True: pass"}),
        ToolCall("python", {"source": "print(1)"}),
    ]
    results = runtime.run(calls)
    runtime.close()
    assert results[0].output == "4\n" and results[0].ok
    assert results[1].output.startswith("Doc 1 (Title: Berlin)")
    assert results[2].output.rstrip().endswith("ZeroDivisionError: division by zero")  # the model reads it
    assert results[3].output.startswith("ERROR: timeout: still running after 1 s") and not results[3].ok
    assert results[4].output.startswith("ERROR: the python tool needs a string argument 'code'")
    assert not results[4].ok


def test_tool_reports_an_unavailable_sandbox_as_text(monkeypatch):
    def unavailable(isolation="bwrap"):
        raise RuntimeError("bubblewrap is not installed")

    monkeypatch.setattr(ps, "sandbox_mode", unavailable)
    text = python_tool()({"code": "print(1)"})
    assert text == "ERROR: the python sandbox is unavailable: bubblewrap is not installed"


# ---- API validation and mode selection (no sandbox needed) ------------------------------------------------------


def test_tool_text():
    assert tool_text(SandboxResult(True, "4\n")) == "4\n"
    assert tool_text(SandboxResult(False, "tb\n", "exception: E", "exception")) == "tb\n"
    assert (
        tool_text(SandboxResult(False, "partial\n", "timeout: x", "timeout"))
        == "ERROR: timeout: x\npartial\n"
    )
    assert tool_text(SandboxResult(False, "", "crashed: y", "crash")) == "ERROR: crashed: y"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout": 0}, "timeout must be a positive number"),
        ({"timeout": float("nan")}, "timeout must be a positive number"),
        ({"memory_bytes": 1024}, "memory_bytes must be an int >= 67108864"),
        ({"max_processes": 0}, "max_processes must be an int >= 1"),
        ({"output_bytes": 10}, "output_bytes must be an int >= 64"),
        (
            {"output_bytes": 4096, "output_kill_bytes": 1024},
            "output_kill_bytes (1024) must be >= output_bytes",
        ),
        ({"cpu_seconds": 0}, "cpu_seconds must be a positive int or None"),
    ],
)
def test_limits_validation(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SandboxLimits(**kwargs)


def test_cpu_limit_default_follows_the_timeout():
    assert SandboxLimits(timeout=5.0).cpu_limit == 6
    assert SandboxLimits(timeout=1.5).cpu_limit == 3
    assert SandboxLimits(timeout=1.5, cpu_seconds=9).cpu_limit == 9


def test_run_python_argument_errors():
    with pytest.raises(ValueError, match="code must be a str"):
        run_python(b"print(1)")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="conflicts with limits.timeout"):
        run_python("1", timeout=3.0, limits=SandboxLimits(timeout=2.0))
    with pytest.raises(ValueError, match="isolation must be"):
        ps.sandbox_mode("docker")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="search_fn must be a callable"):
        run_python("1", search_fn=42)
    with pytest.raises(ValueError, match=r"unknown limit\(s\) \['timout'\]"):
        python_tool(timout=3)
    with pytest.raises(ValueError, match="unknown setting"):
        ps.configure(pyhton="/usr/bin/python3")
    with pytest.raises(ValueError, match="max_workers must be a positive int"):
        SandboxPool(0)


@pytest.fixture
def fresh_modes(monkeypatch, sandbox_tmp_root):
    """Forget resolved modes and announcements for one test; the real ones and the settings come back after."""
    previous = ps.configure(uid_base=TEST_UID_BASE, uid_count=TEST_UID_COUNT, tmp_root=sandbox_tmp_root)
    monkeypatch.setattr(ps, "_modes", {})
    monkeypatch.setattr(ps, "_announced", set())
    yield
    ps.configure(**asdict(previous))


def test_missing_bubblewrap_is_refused_and_the_fallback_warns_once(fresh_modes, monkeypatch):
    real_which = shutil.which
    monkeypatch.setattr(ps.shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    with pytest.raises(RuntimeError, match="bubblewrap is not installed"):
        ps.sandbox_mode()  # the default: never the fallback unless asked for by name (issue 52)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mode = resolve_mode("rlimits")
        ps.sandbox_mode("rlimits")
    assert mode.name == "rlimits" and mode.reason == "requested by name"
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "isolation mode 'rlimits'" in messages[0]


_FALLBACK_RUN = """
import logging, os, tempfile, warnings
logging.basicConfig(format="LOG %(levelname)s %(message)s")
warnings.simplefilter("ignore")  # counted on their own above; here only the log
from agentcredit.tools.sandbox import configure, run_python, sandbox_mode
root = tempfile.mkdtemp(); os.chmod(root, 0o711)
configure(python="/usr/bin/python3", tmp_root=root, uid_base={uid_base}, uid_count=4)
for _ in range(3):
    assert run_python("print(1)", isolation="rlimits").ok
configure(tmp_root=root)  # a new resolution of the mode is not a new announcement
sandbox_mode("rlimits")
print("done")
"""


def test_fallback_run_says_once_loudly_that_it_is_unsafe():
    """Issue 34: the fallback reached a host UNIX socket and left a daemon; a run that uses it must say so."""
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("the fallback needs an interpreter other users can read")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHONWARN")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, "-c", _FALLBACK_RUN.format(uid_base=TEST_UID_BASE)],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
    logged = [line for line in done.stderr.splitlines() if line.startswith("LOG ")]
    assert len(logged) == 1, logged
    assert logged[0].startswith("LOG WARNING ") and "NOT SAFE FOR UNTRUSTED CODE" in logged[0]


def test_broken_bubblewrap_is_detected_by_running_it(fresh_modes, monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    real_which = shutil.which
    monkeypatch.setattr(ps.shutil, "which", lambda name: str(fake) if name == "bwrap" else real_which(name))
    monkeypatch.setattr("agentcredit.tools.sandbox.session.shutil.which", ps.shutil.which)
    with pytest.raises(RuntimeError, match="does not work here: sandbox setup failed.*No permissions"):
        ps.sandbox_mode("bwrap")


def test_mode_is_resolved_once_and_is_thread_safe(isolation):
    modes: list[ps.SandboxMode] = []
    threads = [threading.Thread(target=lambda: modes.append(ps.sandbox_mode(isolation))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(m) for m in modes}) == 1 and modes[0].name == isolation
