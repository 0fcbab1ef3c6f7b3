"""issue 51: agentcredit's "cpu" platform in verl's platform registry, and what else VERL_PLATFORM=cpu loads.

What is tested: in a fresh process with ``VERL_PLATFORM=cpu`` (as every Ray process of such a run gets it), verl's
own device helpers answer for the CPU, the FSDP engines are found for device "cpu", the CPU rollout is a registered
backend and the three rebinds are in place; without ``VERL_PLATFORM`` the platform is never auto-detected and verl's
functions are untouched. ``test_verl_cpu_loop.py`` runs main_ppo with all of it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("verl")

pytestmark = pytest.mark.verl

PROBE = """
import json
import math
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
import math
from verl.plugin.platform import get_platform
print(json.dumps({"platform": type(get_platform()).__name__}))
"""


REBINDS = """
import json
import math
import verl.utils.distributed as distributed
import verl.utils.model as model_utils
import verl.workers.engine.fsdp.transformer_impl as fsdp_impl
from verl.workers.engine.base import EngineRegistry
from verl.workers.rollout.base import get_rollout_class
from verl.workers.rollout.replica import get_rollout_replica_class

rebinds = {
    "process_group": distributed.initialize_global_process_group_ray.__module__,
    "offload": fsdp_impl.CPUOffloadPolicy().pin_memory,
    "value_head": model_utils.load_valuehead_model.__module__,
}
try:
    engines = [EngineRegistry.get_engine_cls(t, "fsdp2").__name__ for t in ("language_model", "value_model")]
except (ValueError, AssertionError):
    engines = None
try:
    rollout = [get_rollout_class("agentcredit_cpu").__name__, get_rollout_replica_class("agentcredit_cpu").__name__]
except Exception:
    rollout = None
print(json.dumps({"rebinds": rebinds, "engines": engines, "rollout": rollout}))
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


def test_cpu_selected_loads_engines_rollout_and_the_three_rebinds():
    found = _probe({"VERL_PLATFORM": "cpu"}, REBINDS)  # the entry point loads the module: no other variable
    assert found == {
        "rebinds": {
            "process_group": "agentcredit.integrations.verl.cpu",  # backend "gloo", not "cpu:gloo,cpu:gloo"
            "offload": False,  # the reference's CPUOffloadPolicy(pin_memory=True) pins nothing
            "value_head": "agentcredit.integrations.verl.cpu",  # the critic with the config's attention
        },
        "engines": ["FSDPEngineWithLMHead", "FSDPEngineWithValueHead"],
        "rollout": ["CPURollout", "CPUReplica"],
    }


def test_without_verl_platform_verls_functions_are_untouched():
    found = _probe({}, REBINDS)
    assert found["rebinds"] == {
        "process_group": "verl.utils.distributed",
        "offload": True,
        "value_head": "verl.utils.model",
    }


# ------------------------------------------------------------------------------- the CPU rollout server
@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from agentcredit.integrations.verl.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def test_cpu_server_samples_scores_and_takes_weights(tiny_model_dir):
    """verl's server interface as the agent loop and the teacher scorer call it: sampled tokens with their
    log-probs (the model's own, recomputed here by a forward pass), a seed that repeats, prompt log-probs in vLLM's
    layout that agentcredit's scorer reads, and synced weights that change what it says."""
    import asyncio

    from agentcredit.integrations.verl.cpu import CPUServer
    from agentcredit.integrations.verl.scoring import prompt_rows

    server = CPUServer(str(tiny_model_dir))
    prompt = [60, 61, 62, 63, 64]
    params = {"max_tokens": 8, "temperature": 1.0, "logprobs": True, "seed": 7}
    out = asyncio.run(server.generate(prompt, dict(params), "r1"))
    again = asyncio.run(server.generate(prompt, dict(params), "r2"))
    assert out.token_ids == again.token_ids and 1 <= len(out.token_ids) <= 8
    ids = prompt + out.token_ids
    with torch.no_grad():
        logits = server.model(torch.tensor([ids])).logits[0].float()
    expected = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].gather(
        1, torch.tensor(out.token_ids)[:, None]
    )
    assert out.log_probs == pytest.approx(expected[:, 0].tolist(), abs=1e-4)

    scored = asyncio.run(server.generate(ids, {"max_tokens": 1, "prompt_logprobs": 0}, "r3"))
    first, rows = prompt_rows(scored.extra_fields, ids)
    assert first == 0 and len(rows) == len(ids) - 1
    whole = torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert rows == pytest.approx(whole.tolist(), abs=1e-4)

    zeros = {name: torch.zeros_like(t) for name, t in server.model.state_dict().items()}
    assert server.load_weights(zeros, global_steps=3) == len(zeros)
    flat = asyncio.run(
        server.generate(prompt, {"max_tokens": 2, "logprobs": True, "seed": 7, "ignore_eos": True}, "r4")
    )
    assert flat.log_probs == pytest.approx([-math.log(len(server.model.get_input_embeddings().weight))] * 2)
    assert flat.extra_fields["global_steps"] == 3
    with pytest.raises(KeyError, match="does not have"):
        server.load_weights({"no.such.weight": torch.zeros(1)})
