"""The one device setting (``model.device``) and the precision it implies (issue 50), on a CPU-only machine:
``auto`` resolves to the CPU, ``cuda`` is one error naming the field, and the CPU's precision is today's fp32."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from agentcredit.config import ConfigError, load_config
from agentcredit.models import device as dev
from agentcredit.models.device import (
    DeviceUnavailable,
    Precision,
    config_precision,
    model_device,
    peak_gpu_memory_gib,
    resolve_device,
    resolve_precision,
)


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def one_gpu(monkeypatch):
    """torch sees one GPU with native bf16 (only the answers; nothing is allocated on it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)


def test_auto_is_the_cpu_where_torch_sees_no_gpu(no_cuda):
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


def test_auto_is_the_first_gpu_where_torch_sees_one(one_gpu):
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)


@pytest.mark.parametrize("setting", ["cuda", "cuda:0", "cuda:3"])
def test_asking_for_a_gpu_where_there_is_none_names_the_field_and_what_to_do(no_cuda, setting):
    with pytest.raises(DeviceUnavailable) as info:
        resolve_device(setting)
    message = str(info.value)
    assert message.startswith(f"model.device={setting}: ") and "model.device=cpu" in message
    assert "\n" not in message
    assert isinstance(info.value, ValueError)  # every CLI command turns a ValueError into one line and exit 2


def test_a_gpu_index_past_the_last_one_is_refused(one_gpu):
    with pytest.raises(
        DeviceUnavailable, match=r"model.device=cuda:1: torch sees 1 GPU\(s\) \(cuda:0..cuda:0\)"
    ):
        resolve_device("cuda:1")


@pytest.mark.parametrize("bad", ["gpu", "cuda:", "CUDA", "cuda:x", "mps", ""])
def test_the_config_refuses_a_device_it_does_not_know_naming_the_key(bad):
    with pytest.raises(ConfigError, match="model.device"):
        load_config("grpo-arith-tools", [f"model.device={bad}"])
    with pytest.raises(ValueError, match="must be auto, cpu, cuda or cuda:<index>"):
        resolve_device(bad)


def test_the_default_is_auto_and_a_gpu_config_loads_anywhere():
    assert load_config("grpo-arith-tools").model.device == "auto"
    # loading never checks the hardware: a study file written for a GPU can be read (and priced) on a laptop
    assert load_config("grpo-arith-tools", ["model.device=cuda:1"]).model.device == "cuda:1"


# ----------------------------------------------------------------------------------------------- precision
def test_on_the_cpu_auto_precision_is_todays_fp32(no_cuda):
    cfg = load_config("grpo-arith-tools")
    assert config_precision(cfg) == Precision(torch.float32, False, torch.float32)


def test_on_a_gpu_with_bf16_auto_is_mixed_precision_with_fp32_master_weights(one_gpu):
    cfg = load_config("grpo-arith-tools", ["model.device=cuda"])
    p = config_precision(cfg)
    assert p == Precision(weights=torch.float32, autocast=True, rollout=torch.bfloat16)
    assert p.describe() == "weights fp32, autocast bf16, rollouts bf16"


def test_a_gpu_without_native_bf16_stays_fp32(monkeypatch, one_gpu):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert resolve_precision(torch.device("cuda", 0)) == Precision(torch.float32, False, torch.float32)


@pytest.mark.parametrize(
    ("device", "args", "expected"),
    [
        # explicit values win over auto on either device
        ("cuda", ("float32", False, "float32"), (torch.float32, False, torch.float32)),
        ("cpu", ("float32", True, "bfloat16"), (torch.float32, True, torch.bfloat16)),
        # bf16 weights: rollouts read them as they are unless told otherwise
        ("cpu", ("bfloat16", "auto", "auto"), (torch.bfloat16, False, torch.bfloat16)),
        ("cuda", ("bfloat16", "auto", "float32"), (torch.bfloat16, True, torch.float32)),
    ],
)
def test_explicit_precision_is_kept(one_gpu, device, args, expected):
    assert resolve_precision(torch.device(device), *args) == Precision(*expected)


def test_the_old_boolean_autocast_setting_still_loads():
    cfg = load_config("grpo-arith-tools", ["model.autocast_bf16=false", "model.rollout_dtype=float32"])
    assert config_precision(cfg, torch.device("cpu")) == Precision(torch.float32, False, torch.float32)


# ----------------------------------------------------------------------------------------------- misc
def test_model_device_and_gpu_memory_on_the_cpu():
    assert model_device(torch.nn.Linear(2, 2)) == torch.device("cpu")
    assert model_device(torch.nn.ReLU()) == torch.device("cpu")  # no parameters
    assert peak_gpu_memory_gib(torch.device("cpu")) is None
    assert peak_gpu_memory_gib() is None  # CUDA never initialised here


def test_no_cuda_reason_names_the_torch_build(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    assert "built without CUDA" in dev._no_cuda_reason()
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert "sees no GPU" in dev._no_cuda_reason()


@pytest.mark.parametrize("command", ["train", "sft", "warmup"])
def test_the_cli_asking_for_cuda_without_one_is_one_line_and_exit_2(no_cuda, tmp_path, command):
    from agentcredit.cli import app

    args = [command, "--config", "grpo-arith-tools", "--set", "model.device=cuda", "--set", "model.name=tiny"]
    if command != "train":
        args += ["--out", str(tmp_path / "out")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: model.device=cuda: "), result.output
    assert not (tmp_path / "out").exists()  # stopped before anything was written
