import threading
import time

from agentcredit.tools.base import ToolCall, ToolRuntime


def test_more_concurrent_steps_than_workers_do_not_deadlock():
    # each step holds two calls; 6 steps are submitted at once to a 2-worker runtime
    runtime = ToolRuntime({"echo": lambda args: str(args["x"])}, max_workers=2)
    try:
        futures = [
            runtime.submit([ToolCall("echo", {"x": i}), ToolCall("echo", {"x": -i})]) for i in range(6)
        ]
        results = [f.result(timeout=10) for f in futures]
    finally:
        runtime.close()
    assert [[r.output for r in rs] for rs in results] == [[str(i), str(-i)] for i in range(6)]


def test_calls_of_one_step_run_concurrently_and_errors_become_text():
    barrier = threading.Barrier(3, timeout=5)

    def wait(args):
        barrier.wait()
        return "ok"

    def boom(args):
        raise RuntimeError("broken tool")

    runtime = ToolRuntime({"wait": wait, "boom": boom}, max_workers=4)
    try:
        start = time.perf_counter()
        out = runtime.run(
            [ToolCall("wait"), ToolCall("wait"), ToolCall("wait"), ToolCall("boom"), ToolCall("nope")]
        )
        assert time.perf_counter() - start < 5
    finally:
        runtime.close()
    assert [r.ok for r in out] == [True, True, True, False, False]
    assert "broken tool" in out[3].output and "unknown tool 'nope'" in out[4].output
