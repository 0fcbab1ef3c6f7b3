"""The preset registry, the package exports, and the purity rule of agentcredit/credit (no model/tool/I/O)."""

import ast
from pathlib import Path

import pytest

import agentcredit.credit as credit
from agentcredit.credit import ESTIMATORS, LOSS_AGGREGATIONS, PRESETS, get_preset

CONTRACT = [
    "grpo_advantages",
    "gae_advantages",
    "segment_advantages",
    "critical_action_advantages",
    "portool_advantages",
    "tips_turn_rewards",
    "gear_advantages",
    "policy_loss",
]


def test_all_seven_presets():
    assert set(PRESETS) == {
        "grpo",
        "ppo",
        "carl-segment",
        "carl-critical",
        "portool",
        "tips",
        "gear",
        "gigpo",
    }
    for name, preset in PRESETS.items():
        assert preset.name == name
        assert preset.estimator in ESTIMATORS
        assert preset.loss_agg in LOSS_AGGREGATIONS
    assert {n for n, p in PRESETS.items() if p.needs_critic} == {"ppo", "carl-segment", "tips"}
    assert (get_preset("gear").estimator, get_preset("gear").reweight) == ("grpo", "gear")
    assert (get_preset("tips").estimator, get_preset("tips").shaping) == ("gae", "tips")
    assert get_preset("carl-segment").loss_agg == "segment-mean"  # Eq. 3
    assert get_preset("portool").loss_agg == "seq-mean-token-mean"  # Eq. 1, required by Theorem 3.1
    assert get_preset("carl-critical").loss_agg == "token-mean"  # Eq. 2, 1/|D|


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown credit preset 'carl'.*grpo"):
        get_preset("carl")


def test_contract_names_exported():
    for name in CONTRACT:
        assert name in credit.__all__ and callable(getattr(credit, name))
    for name in credit.__all__:
        assert hasattr(credit, name)


# pure maths only: no engine, I/O or trainer (numpy for the critic-quality metrics of credit/metrics.py)
ALLOWED_ROOTS = {
    "__future__",
    "numpy",
    "collections",
    "dataclasses",
    "math",
    "types",
    "typing",
    "torch",
    "agentcredit",
}


def test_credit_modules_are_pure():
    package = Path(credit.__file__).parent
    for path in sorted(package.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in ALLOWED_ROOTS, f"{path.name} imports {name}"
                if name.startswith("agentcredit"):
                    assert name.startswith("agentcredit.credit"), f"{path.name} imports {name}"


def test_method_configs_agree_with_the_registry():
    """The registry and the method presets used to disagree (grpo: seq-mean-token-mean vs token-mean, issue 14);
    the settings the trainer really uses must be what the registry declares."""
    from agentcredit.config import load_config

    for name, preset in PRESETS.items():
        a = load_config(f"{name}-arith-tools").algorithm
        assert a.loss_agg == preset.loss_agg, name
        assert (a.estimator, a.shaping, a.reweight) == (preset.estimator, preset.shaping, preset.reweight), (
            name
        )
        assert (a.critic != "none") == preset.needs_critic, name


def test_config_estimators_are_the_registry_entries():
    """agentcredit.config sits below credit in the layers, so it spells the estimator names itself; they must be
    exactly the registry's entries."""
    import typing

    from agentcredit.config import AlgorithmConfig

    names = typing.get_args(AlgorithmConfig.model_fields["estimator"].annotation)
    assert set(names) == set(ESTIMATORS)
