"""The method registry, the package exports, and the purity rule of agentcredit/credit (no model/tool/I/O)."""

import ast
from pathlib import Path

import pytest

import agentcredit.credit as credit
from agentcredit.credit import LOSS_AGGREGATIONS, METHODS, get_method
from agentcredit.credit.methods import BUILT_IN

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


EIGHT = {"grpo", "ppo", "carl-segment", "carl-critical", "portool", "tips", "gear", "gigpo"}


def test_all_eight_methods():
    assert set(BUILT_IN) >= EIGHT  # a method added later is found too (test_every_method_file_is_registered)
    for name, method in METHODS.items():
        assert method.name == name
        assert method.needs.loss_agg in LOSS_AGGREGATIONS
        for (
            field
        ) in method.settings.model_fields.values():  # every setting says what it is and where it is from
            assert field.description, (name, field)
    assert {n for n in EIGHT if METHODS[n].all_needs.critic != "none"} == {"ppo", "carl-segment", "tips"}
    assert [p.name for p in get_method("gear").parts] == ["grpo", "gear"]
    assert [p.name for p in get_method("tips").parts] == ["ppo", "tips"]
    assert get_method("carl-segment").needs.loss_agg == "segment-mean"  # Eq. 3
    assert get_method("portool").needs.loss_agg == "seq-mean-token-mean"  # Eq. 1, required by Theorem 3.1
    assert get_method("carl-critical").needs.loss_agg == "token-mean"  # Eq. 2, 1/|D|


def test_needs_name_only_the_step_inputs_the_layouts_fill():
    from agentcredit.credit import Needs

    with pytest.raises(ValueError, match=r"unknown step input\(s\) \['anchor'\]; the layouts provide"):
        Needs(step_inputs=frozenset({"anchor"}))


def test_unknown_method():
    with pytest.raises(ValueError, match="unknown credit method 'carl'.*grpo"):
        get_method("carl")


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
    "pydantic",  # a method's typed settings (agentcredit.credit.methods)
    "abc",  # the signal providers' interface a trainer implements (agentcredit.credit.signals)
    "agentcredit",
    # agentcredit.credit.methods finds its method files (the import system only: no other I/O)
    "importlib",
    "pkgutil",
}


def test_credit_modules_are_pure():
    package = Path(credit.__file__).parent
    for path in sorted(package.rglob("*.py")):
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

    for name, method in METHODS.items():
        a = load_config(f"{name}-arith-tools").algorithm
        assert a.loss_agg == method.all_needs.loss_agg, name
        assert [p.name for p in a.credit_method.parts] == [p.name for p in method.parts], name
        assert a.critic == method.all_needs.critic, name
