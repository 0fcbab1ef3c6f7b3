"""benchmarks/bench_memory.py runs each memory setting in its own process and prints one table (issue 13)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_memory.py"


@pytest.mark.slow
def test_bench_memory_on_the_tiny_model():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "tiny", "--examples", "12", "--steps", "1", "--batch", "2"]
        + ["--only", "0", "6", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout[out.stdout.index("{") :])
    names = [row["setting"] for row in result["settings"]]
    assert names == ["before: 4096 tok, malloc default", "1024 tok + checkpointing, 4 MiB (demo)"]
    for row in result["settings"]:
        assert row["tokens_per_s"] > 0 and row["peak_rss_gib"] > 0 and row["steps"] == 1
    assert len(result["load_before"]) == 3


@pytest.mark.slow
def test_too_few_demonstrations_is_an_error_naming_the_option():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "tiny", "--examples", "2", "--steps", "4", "--batch", "2"]
        + ["--only", "0"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode != 0
    assert "--examples" in out.stderr
