"""The CPU dry run of ``scripts/gpu_check.py`` (issue 50): the same checks with ``--device cpu``, one method, a short
SFT. Its GPU run is in ``scripts/gpu_check.md``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_dry_run_prints_one_line_per_check_and_passes(capsys):
    script = load_script()
    status = script.main(["--device", "cpu", "--methods", "grpo", "--compare", "grpo", "--sft-epochs", "40"])
    lines = capsys.readouterr().out.splitlines()
    checks = [line for line in lines if line.startswith("CHECK ")]
    names = [line.split(":")[0].removeprefix("CHECK ") for line in checks]
    assert names == ["device", "sft chat", "step grpo", "eval", "cpu vs cpu grpo", "memory"], lines
    assert all(": ok " in line for line in checks), lines
    assert status == 0 and lines[-1].startswith("OK: 6 checks on cpu")
    # the comparison on one device is exact: the same step on the same trees from the same weights
    assert "largest difference 0.00e+00" in next(line for line in checks if "vs cpu" in line)


def test_a_device_that_is_not_there_is_one_failed_check(monkeypatch, capsys):
    import torch

    script = load_script()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert script.main(["--device", "cuda"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("CHECK device: FAIL DeviceUnavailable: model.device=cuda: ")
    assert out[-1] == "FAILED: device"


@pytest.mark.parametrize("argv", [["--device", "gpu"]])
def test_a_device_setting_it_does_not_know_fails_the_device_check(argv, capsys):
    assert load_script().main(argv) == 1
    assert "must be auto, cpu, cuda or cuda:<index>" in capsys.readouterr().out
