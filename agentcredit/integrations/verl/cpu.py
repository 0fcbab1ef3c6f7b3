"""A "cpu" platform for verl 0.9.1's platform registry: the first piece of running verl's own loop without a GPU.

verl picks its accelerator through ``verl.plugin.platform`` (``PlatformRegistry``; ``verl.utils.device`` asks the
platform for the device name, the torch device module, the collective backend and the Ray resource). This module
registers a platform named ``cpu``, chosen only by name (``VERL_PLATFORM=cpu``): it never claims a machine in
verl's auto-detection, so importing it changes nothing elsewhere. Load it in every process with
``VERL_USE_EXTERNAL_MODULES=agentcredit.integrations.verl.cpu`` (forwarded to Ray in
``ray_kwargs.ray_init.runtime_env.env_vars``, values as strings). What it answers, and why:

* ``current_device()`` is the string ``"cpu"``: verl treats an integer id as an accelerator index;
* the collective backend is gloo;
* the Ray resource is ``"GPU"``: verl's single controller counts only GPU / NPU resources, so a run gives Ray fake
  slots (``+ray_kwargs.ray_init.num_gpus=N``) that its workers take;
* the device module is ``torch.cpu``, and seeds go to ``torch.manual_seed``.

Not yet here (issue 51, "verl's real main_ppo loop on the CPU"): the FSDP engines registered for device ``cpu`` in
verl's engine registry, a CPU rollout server behind verl's replica interface, and the three places verl 0.9.1 has no
plugin point for (``utils/distributed.py``'s ``cpu:gloo,cpu:gloo`` process group, the reference model's
``CPUOffloadPolicy(pin_memory=True)``, the critic loader's hard-coded ``flash_attention_2``).
"""

from __future__ import annotations

import contextlib
import os
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform import PlatformRegistry
from verl.plugin.platform.platform_base import PlatformBase

__all__ = ["PLATFORM", "PlatformCPU"]

#: the name ``VERL_PLATFORM`` selects this platform by
PLATFORM = "cpu"


@PlatformRegistry.register(platform=PLATFORM)
class PlatformCPU(PlatformBase):
    """verl's platform interface answered for the host CPU (one "device" per process)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return torch.cpu

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # never auto-detected: a machine without a GPU keeps verl's own fallback unless the user asks for the CPU
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM

    def current_device(self) -> str:  # type: ignore[override]  # verl reads an int as an accelerator index
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "AGENTCREDIT_VERL_CPU_VISIBLE_DEVICES"  # nothing to hide: no process owns a device

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
