"""The one device setting of the native path (``model.device``) and the precision it implies.

Training, rollouts, teacher scoring, the critic, SFT, warm-up, evaluation, benchmarks and studies all put the model
where :func:`resolve_device` says and read every other tensor's device from the model's parameters, so no code
names a device:

* ``auto`` (the default): the first CUDA GPU when torch sees one, else the CPU;
* ``cpu``;
* ``cuda`` / ``cuda:<i>``: that GPU; asking for it where torch sees none is a :class:`DeviceUnavailable` (a
  ``ValueError``: the CLI prints its one line and exits 2), never a silent fall-back to the CPU.

Precision (:func:`resolve_precision`): the trained weights stay in ``model.dtype`` (float32 by default: the fp32
master weights AdamW needs, as bf16 keeps 8 bits of mantissa and a step under ~0.2% of a weight rounds away there);
``model.autocast_bf16`` and ``model.rollout_dtype`` default to ``auto``, which on a CUDA GPU with native bf16 means
bf16 autocast for every forward and backward (mixed precision: fp32 parameters, bf16 compute) and a bf16 copy of
the policy for the rollouts, and on the CPU means neither: there fp32 is faster on CPUs without native bf16 matmul,
and today's numbers stay bit-identical.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

#: What ``model.device`` accepts.
DEVICE_PATTERN = r"^(auto|cpu|cuda(:[0-9]+)?)$"


class DeviceUnavailable(ValueError):
    """The configured device does not exist on this machine."""


def _no_cuda_reason() -> str:
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is built without CUDA"
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU"


def resolve_device(setting: str, *, field: str = "model.device") -> torch.device:
    """The ``torch.device`` of ``setting`` (``auto`` / ``cpu`` / ``cuda[:i]``); raises :class:`DeviceUnavailable`
    naming ``field`` when it asks for a GPU torch cannot see, and ``ValueError`` for anything else."""
    if not re.match(DEVICE_PATTERN, setting or ""):
        raise ValueError(f"{field}={setting!r}: must be auto, cpu, cuda or cuda:<index>")
    if setting == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if setting == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DeviceUnavailable(f"{field}={setting}: {_no_cuda_reason()}; set {field}=cpu (or auto)")
    index = int(setting.partition(":")[2] or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise DeviceUnavailable(
            f"{field}={setting}: torch sees {count} GPU(s) (cuda:0..cuda:{count - 1}); pick one of them"
        )
    return torch.device("cuda", index)


def model_device(model: torch.nn.Module) -> torch.device:
    """Where ``model``'s weights live (the CPU for a model without parameters)."""
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


@dataclass(frozen=True)
class Precision:
    """What the native path computes in on one device."""

    weights: torch.dtype  # the trained (master) weights
    autocast: bool  # bf16 autocast around every forward (and so backward) of the policy, critic and teacher
    rollout: torch.dtype  # the weights the rollout engine generates with (a synced copy when not ``weights``)

    def describe(self) -> str:
        name = {torch.float32: "fp32", torch.bfloat16: "bf16"}
        return (
            f"weights {name.get(self.weights, self.weights)}, autocast {'bf16' if self.autocast else 'off'}, "
            f"rollouts {name.get(self.rollout, self.rollout)}"
        )


def bf16_native(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 matmuls natively (a CUDA GPU of compute capability >= 8.0)."""
    return device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)


def resolve_precision(
    device: torch.device, dtype: str = "float32", autocast_bf16: Any = "auto", rollout_dtype: str = "auto"
) -> Precision:
    """The precision of ``model.dtype`` / ``model.autocast_bf16`` / ``model.rollout_dtype`` on ``device``: an
    explicit value is kept; ``auto`` is bf16 where the device computes it natively (see the module docstring)."""
    weights = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    native = bf16_native(device)
    autocast = native if autocast_bf16 == "auto" else bool(autocast_bf16)
    if rollout_dtype == "auto":
        rollout = torch.bfloat16 if native else weights
    else:
        rollout = torch.bfloat16 if rollout_dtype == "bfloat16" else torch.float32
    return Precision(weights=weights, autocast=autocast, rollout=rollout)


def config_device(cfg: Any) -> torch.device:
    """The device of a :class:`~agentcredit.config.Config` (its ``model.device``)."""
    return resolve_device(cfg.model.device)


def config_precision(cfg: Any, device: torch.device | None = None) -> Precision:
    """The precision of a :class:`~agentcredit.config.Config` on ``device`` (default: its own device)."""
    m = cfg.model
    return resolve_precision(
        config_device(cfg) if device is None else device, m.dtype, m.autocast_bf16, m.rollout_dtype
    )


def peak_gpu_memory_gib(device: torch.device | None = None) -> float | None:
    """The CUDA allocator's peak since the process started (or its last reset), in GiB; None off CUDA."""
    if device is not None and device.type != "cuda":
        return None
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.max_memory_allocated(device) / 1024**3
