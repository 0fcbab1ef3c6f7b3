"""Registration reaches a fresh process through VERL_USE_EXTERNAL_MODULES; agentcredit's core never imports verl."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("verl")

from agentcredit.integrations.verl import (  # noqa: E402
    AGENT_LOOP_NAME,
    ESTIMATOR_NAMES,
    REGISTER_MODULE,
    TRAINER_NAME,
)

pytestmark = pytest.mark.verl

PROBE = """
import json
import verl  # imports the modules named in VERL_USE_EXTERNAL_MODULES, as in every Ray worker
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.trainer.ppo.v1 import get_trainer_cls
print(json.dumps({
    "estimators": {n: get_adv_estimator_fn(n).__module__ for n in %(estimators)r},
    "agent_loop": _agent_loop_registry.get(%(agent)r),
    "trainer": get_trainer_cls(%(trainer)r).__module__ + "." + get_trainer_cls(%(trainer)r).__name__,
}))
"""


def _run(code: str, env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_fresh_process_registers_everything_by_name():
    code = PROBE % {"estimators": ESTIMATOR_NAMES, "agent": AGENT_LOOP_NAME, "trainer": TRAINER_NAME}
    proc = _run(code, {"VERL_USE_EXTERNAL_MODULES": REGISTER_MODULE})
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["estimators"] == {n: "agentcredit.integrations.verl.estimators" for n in ESTIMATOR_NAMES}
    assert found["agent_loop"] == {
        "_target_": "agentcredit.integrations.verl.agent_loop.AgentCreditAgentLoop"
    }
    assert found["trainer"] == "agentcredit.integrations.verl.trainer.AgentCreditTrainer"


def test_without_the_variable_nothing_is_registered():
    code = f"import verl\nfrom verl.trainer.ppo.v1 import get_trainer_cls\nget_trainer_cls({TRAINER_NAME!r})"
    proc = _run(code, {})
    assert proc.returncode != 0 and f"Unknown trainer '{TRAINER_NAME}'" in proc.stderr


def test_core_and_integration_package_do_not_import_verl():
    code = (
        "import sys\nimport agentcredit, agentcredit.credit, agentcredit.rollout, agentcredit.protocols, "
        "agentcredit.tools, agentcredit.tasks, agentcredit.integrations, agentcredit.integrations.verl\n"
        "import agentcredit.integrations.verl.settings, agentcredit.integrations.verl.fields\n"
        "import agentcredit.integrations.verl.episode, agentcredit.integrations.verl.data\n"
        "print(sorted(m for m in sys.modules if m == 'verl' or m.startswith('verl.')))"
    )
    proc = _run(code, {})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
