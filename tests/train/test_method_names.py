"""A method's name agrees with the parts it names or is derived from them (issue 34).

``--set method=magic-credit`` trained GRPO labelled "magic-credit" in every log and report, and ``--set
method=ppo`` on a GRPO preset reported "ppo". The names come from the method presets of configs/methods/, so the
check knows a new preset with no list to update.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from agentcredit.cli import app
from agentcredit.config import (
    CONFIG_DIR,
    ConfigError,
    derive_method,
    dump_config,
    load_config,
    method_parts,
    parts_named_by,
    preset_names,
    read_yaml_with_bases,
    validate_config,
)


def test_a_name_that_names_no_method_is_refused():
    with pytest.raises(ConfigError, match=r"method='magic-credit' names no method: use one of .*grpo"):
        load_config("grpo-arith-tools", ["method=magic-credit"])


def test_a_name_that_disagrees_with_the_parts_names_the_field():
    with pytest.raises(
        ConfigError,
        match=r"method='ppo' names algorithm.estimator='gae' but this config has algorithm.estimator='grpo'.*"
        r"method='grpo'",
    ):
        load_config("grpo-arith-tools", ["method=ppo"])
    with pytest.raises(ConfigError, match=r"method='grpo' names algorithm.reweight='none'.*method='gear'"):
        load_config("grpo-arith-tools", ["algorithm.reweight=gear", "method=grpo"])


def test_cli_refuses_a_wrong_name_in_one_line():
    result = CliRunner().invoke(
        app, ["train", "--config", "grpo-arith-tools", "--set", "method=magic-credit"]
    )
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "method='magic-credit' names no method" in result.output


@pytest.mark.parametrize(
    ("preset", "overrides", "method"),
    [
        ("grpo-arith-tools", ["algorithm.reweight=gear"], "gear"),  # the preset's own name no longer fits
        ("carl-segment-arith-tools", ["algorithm.shaping=tips"], "carl-segment+tips"),
        ("portool-arith-tools", ["algorithm.reweight=gear"], "portool+gear"),
        ("carl-critical-arith-tools", ["algorithm.estimator=grpo"], "grpo"),
        (
            "grpo-arith-tools",
            ["method=grpo-seqmean", "algorithm.loss_agg=seq-mean-token-mean"],
            "grpo-seqmean",
        ),
        ("grpo-arith-tools", ["method=grpo+gear-a", "algorithm.reweight=gear"], "grpo+gear-a"),
    ],
)
def test_names_are_derived_or_labelled(preset, overrides, method):
    config = load_config(preset, overrides)
    assert config.method == method
    assert load_config(preset, overrides).model_dump() == validate_config(config.model_dump()).model_dump()


def test_a_config_without_a_method_gets_its_parts_name():
    assert validate_config({}).method == "grpo"
    config = validate_config({"algorithm": {"estimator": "gae", "critic": "token"}})
    assert config.method == "ppo"
    # what a run directory's config.yaml holds loads back unchanged (resume, evaluation)
    assert validate_config(__import__("yaml").safe_load(dump_config(config))).method == "ppo"


def test_every_method_preset_is_named_after_its_parts():
    for stem, parts in method_parts().items():
        assert read_yaml_with_bases(CONFIG_DIR / "methods" / f"{stem}.yaml")["method"] == stem
        assert derive_method(parts) == stem and parts_named_by(stem) == parts
    for name in preset_names():
        config = load_config(name)
        assert parts_named_by(config.method) == {
            "estimator": config.algorithm.estimator,
            "shaping": config.algorithm.shaping,
            "reweight": config.algorithm.reweight,
        }


def _choices(field: str) -> list[str]:
    """The registered methods' names for one part (agentcredit.credit.METHODS)."""
    from agentcredit.credit.methods import estimator_names, modifier_names

    return estimator_names() if field == "estimator" else ["none", *modifier_names(field)]


@given(
    estimator=st.sampled_from(_choices("estimator")),
    shaping=st.sampled_from(_choices("shaping")),
    reweight=st.sampled_from(_choices("reweight")),
    label=st.one_of(st.just(""), st.text(alphabet="abz09.-", min_size=1, max_size=8).map("-".__add__)),
)
@settings(deadline=None)
def test_a_derived_name_names_exactly_its_parts(estimator, shaping, reweight, label):
    parts = {"estimator": estimator, "shaping": shaping, "reweight": reweight}
    assert parts_named_by(derive_method(parts) + label) == parts


@pytest.mark.parametrize("name", ["", "magic", "grpo-", "grpo+", "grpo+nope", "ppo+tips+x", "-grpo", "GRPO"])
def test_names_that_name_nothing(name):
    assert parts_named_by(name) is None
