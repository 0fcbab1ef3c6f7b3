"""Registration reaches a fresh process through verl's plugin entry points (no variable to export); agentcredit's
core never imports verl."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("verl")

from agentcredit.integrations.verl import (  # noqa: E402
    AGENT_LOOP_NAME,
    ESTIMATOR_NAMES,
    REGISTER_MODULE,
    TRAINER_NAME,
)

pytestmark = pytest.mark.verl

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_GROUP = "verl.plugins"  # verl/__init__.py loads every entry point of it at `import verl`

PROBE = """
import json
import verl  # loads the verl.plugins entry points, as in every Ray worker
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.trainer.ppo.v1 import get_trainer_cls
print(json.dumps({
    "estimators": {n: get_adv_estimator_fn(n).__module__ for n in %(estimators)r},
    "agent_loop": _agent_loop_registry.get(%(agent)r),
    "trainer": get_trainer_cls(%(trainer)r).__module__ + "." + get_trainer_cls(%(trainer)r).__name__,
}))
"""


def _entry_points() -> dict[str, dict[str, str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["entry-points"]


def _run(
    code: str, env_extra: dict[str, str], plugin_dir: Path | None = None, argv: list[str] = ()
) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter without VERL_USE_EXTERNAL_MODULES. ``plugin_dir``: a folder holding this
    checkout's entry points as installed metadata (pyproject's, not the ones of whatever install the venv has)."""
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"}
    env.update(env_extra)
    if plugin_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT), str(plugin_dir), env.get("PYTHONPATH")) if p
        )
        env["VERL_USE_EXTERNAL_PLUGINS"] = (
            "agentcredit"  # only this checkout's (a stale install may list it too)
        )
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory) -> Path:
    """pyproject's ``verl.plugins`` entry points as the metadata an install writes (what importlib finds)."""
    where = tmp_path_factory.mktemp("plugin")
    info = where / "agentcredit_checkout-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: agentcredit-checkout\nVersion: 0\n")
    lines = [f"[{PLUGIN_GROUP}]"] + [f"{k} = {v}" for k, v in _entry_points()[PLUGIN_GROUP].items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return where


def test_pyproject_declares_the_register_module_as_a_verl_plugin():
    assert _entry_points()[PLUGIN_GROUP] == {"agentcredit": REGISTER_MODULE}


def test_fresh_process_registers_everything_by_name(plugin_dir):
    code = PROBE % {"estimators": ESTIMATOR_NAMES, "agent": AGENT_LOOP_NAME, "trainer": TRAINER_NAME}
    proc = _run(code, {}, plugin_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["estimators"] == {n: "agentcredit.integrations.verl.estimators" for n in ESTIMATOR_NAMES}
    assert found["agent_loop"] == {
        "_target_": "agentcredit.integrations.verl.agent_loop.AgentCreditAgentLoop"
    }
    assert found["trainer"] == "agentcredit.integrations.verl.trainer.AgentCreditTrainer"


LAUNCH_DRIVER = """
import json, sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
import verl.trainer.main_ppo  # what `python -m verl.trainer.main_ppo` imports before Hydra composes
from verl.trainer.ppo.utils import need_critic
from agentcredit.integrations.verl import config_dir
with initialize_config_dir(str(config_dir()), version_base=None):
    cfg = compose(sys.argv[1])
critic = need_critic(cfg)  # main_ppo's validate_config reads it in the driver
OmegaConf.resolve(cfg)
print(json.dumps({"critic": critic, "train_files": cfg.data.train_files, "adv": cfg.algorithm.adv_estimator}))
"""


@pytest.mark.parametrize(
    "config_name", ["agentcredit"]
)  # the generic config: critic.enable is the resolver's
def test_the_driver_resolves_the_config_without_an_exported_variable(plugin_dir, config_name, tmp_path):
    """issue 51: the `agentcredit_needs` resolver was registered only where VERL_USE_EXTERNAL_MODULES was set, so
    main_ppo's driver raised UnsupportedInterpolationType unless the user exported it. The data paths are absolute
    (verl's parquet loader does not expand `~`)."""
    proc = _run(LAUNCH_DRIVER, {"HOME": str(tmp_path)}, plugin_dir, argv=[config_name])
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    method = "grpo" if config_name == "agentcredit" else "ppo"
    assert found["critic"] is (config_name == "ppo")
    assert found["train_files"] == f"{tmp_path}/data/agentcredit/search_r1/{method}/train.parquet"
    assert "~" not in found["train_files"]


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
