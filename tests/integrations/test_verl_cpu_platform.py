"""issue 51, first piece of verl's own loop on the CPU: agentcredit's "cpu" platform in verl's platform registry.

What is tested: in a fresh process with ``VERL_PLATFORM=cpu`` and the module in ``VERL_USE_EXTERNAL_MODULES`` (as
every Ray process of such a run would get them), verl's own device helpers answer for the CPU; without
``VERL_PLATFORM`` the platform is never auto-detected. What is not here yet (the rest of the issue's item): the FSDP
engines for device "cpu", a CPU rollout server, the three rebinds, and the 2-step ``main_ppo`` runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("verl")

pytestmark = pytest.mark.verl

PROBE = """
import json
import torch
from verl.plugin.platform import get_platform
from verl.utils import device
print(json.dumps({
    "platform": type(get_platform()).__name__,
    "name": device.get_device_name(),
    "module": device.get_torch_device().__name__,
    "id": device.get_device_id(),
    "backend": device.get_nccl_backend(),
    "ray": device.get_resource_name(),
}))
"""


WHICH = """
import json
from verl.plugin.platform import get_platform
print(json.dumps({"platform": type(get_platform()).__name__}))
"""


def _probe(env_extra: dict[str, str], code: str = PROBE) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES")}
    env.update(env_extra)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_verls_device_helpers_answer_for_the_cpu_platform():
    found = _probe({"VERL_PLATFORM": "cpu", "VERL_USE_EXTERNAL_MODULES": "agentcredit.integrations.verl.cpu"})
    assert found == {
        "platform": "PlatformCPU",
        "name": "cpu",
        "module": "agentcredit_verl_cpu_device",  # torch.cpu and the torch.cuda calls verl makes on it
        "id": "cpu",  # a string: verl reads an int as an accelerator index
        "backend": "gloo",
        "ray": "GPU",  # verl's single controller counts GPU slots: a run gives Ray fake ones
    }


def test_the_cpu_platform_is_never_auto_detected():
    found = _probe({"VERL_USE_EXTERNAL_MODULES": "agentcredit.integrations.verl.cpu"}, WHICH)
    assert found["platform"] != "PlatformCPU"
