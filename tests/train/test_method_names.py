"""One name per method (issues 34 and 37): ``algorithm.method`` names what trains, and everything else follows.

``--set method=magic-credit`` once trained GRPO labelled "magic-credit" in every log and report (issue 34). Since
issue 37 the name *is* the method: ``algorithm.method: <method>[+<modifier>...][-<label>]``, resolved against the
registered methods (:func:`agentcredit.credit.resolve_method`); the critic, the loss aggregation and the section of
its settings (the name in snake_case) follow from it, and the keys that used to name its parts are one error line
saying where they went.
"""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from agentcredit.cli import app
from agentcredit.config import (
    CONFIG_DIR,
    MOVED_TO_SECTIONS,
    ConfigError,
    dump_config,
    load_config,
    preset_names,
    read_yaml_with_bases,
    validate_config,
)
from agentcredit.credit.methods import BUILT_IN, METHODS, modifier_names, resolve_method


def test_a_name_that_names_no_method_is_refused():
    with pytest.raises(
        ConfigError, match=r"algorithm.method: 'magic-credit' names no registered method: use one of .*grpo"
    ):
        load_config("grpo-arith-tools", ["algorithm.method=magic-credit"])


def test_a_modifier_the_method_does_not_allow_says_why():
    with pytest.raises(ConfigError, match=r"tips needs a method with a critic .*shaping cancels"):
        load_config("grpo-arith-tools", ["algorithm.method=grpo+tips"])


def test_cli_refuses_a_wrong_name_in_one_line():
    result = CliRunner().invoke(
        app, ["train", "--config", "grpo-arith-tools", "--set", "algorithm.method=magic-credit"]
    )
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "'magic-credit' names no registered method" in result.output


@pytest.mark.parametrize(
    ("key", "value", "moved_to"),
    [
        ("method", "grpo", "algorithm.method"),
        ("algorithm.estimator", "segment", "algorithm.method"),
        ("algorithm.critic", "boundary", "algorithm.method"),
        ("algorithm.shaping", "tips", "algorithm.method"),
        ("algorithm.reweight", "gear", "algorithm.method"),
        ("algorithm.gae", "{gamma: 1.0}", "algorithm.ppo"),
        ("algorithm.critical", "{update_rule: multi_child}", "algorithm.carl_critical"),
        ("algorithm.gamma", "1.0", "algorithm.carl_segment.gamma or algorithm.ppo.gamma"),
    ],
)
def test_an_old_key_is_one_line_naming_where_it_moved(key, value, moved_to):
    result = CliRunner().invoke(app, ["train", "--config", "grpo-arith-tools", "--set", f"{key}={value}"])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1, result.output
    assert (
        f"'{key}'" in result.output
        and f"moved to {moved_to}" in result.output
        and "issue 37" in result.output
    )
    assert key in MOVED_TO_SECTIONS


def test_an_old_run_config_names_the_file_and_key(tmp_path):
    """A run directory's config.yaml from before issue 37 (top-level method, algorithm parts)."""
    old = tmp_path / "config.yaml"
    old.write_text(
        yaml.safe_dump(
            {
                "method": "carl-segment",
                "algorithm": {"estimator": "segment", "critic": "boundary", "loss_agg": "segment-mean"},
            }
        )
    )
    with pytest.raises(
        ConfigError, match=rf"{tmp_path}.*unknown key 'method' \(method moved to algorithm.method"
    ):
        load_config(old)


@pytest.mark.parametrize(
    ("preset", "overrides", "method", "trains"),
    [
        ("grpo-arith-tools", ["algorithm.method=gear"], "gear", ("grpo", "gear")),
        (
            "grpo-arith-tools",
            ["algorithm.method=grpo+gear"],
            "gear",
            ("grpo", "gear"),
        ),  # GEAR is published on GRPO
        (
            "carl-segment-arith-tools",
            ["algorithm.method=carl-segment+tips"],
            "carl-segment+tips",
            ("carl-segment", "tips"),
        ),
        ("portool-arith-tools", ["algorithm.method=portool+gear"], "portool+gear", ("portool", "gear")),
        ("carl-critical-arith-tools", ["algorithm.method=grpo"], "grpo", ("grpo",)),
        (
            "grpo-arith-tools",
            ["algorithm.method=grpo-seqmean", "algorithm.loss_agg=seq-mean-token-mean"],
            "grpo-seqmean",
            ("grpo",),
        ),
        ("grpo-arith-tools", ["algorithm.method=grpo+gear-a"], "gear-a", ("grpo", "gear")),
        ("portool-shifted-outcome-arith-tools", [], "portool-shifted-outcome", ("portool",)),
    ],
)
def test_names_resolve_to_what_trains(preset, overrides, method, trains):
    config = load_config(preset, overrides)
    assert config.method == config.algorithm.method == method
    assert tuple(p.name for p in config.algorithm.credit_method.parts) == trains
    # what a run directory's config.yaml holds loads back unchanged (resume, evaluation)
    assert validate_config(yaml.safe_load(dump_config(config))).model_dump() == config.model_dump()


def test_the_critic_and_loss_aggregation_follow_from_the_method():
    for name in BUILT_IN:
        a = load_config(f"{name}-arith-tools").algorithm
        needs = METHODS[name].all_needs
        assert (a.critic, a.loss_agg) == (needs.critic, needs.loss_agg), name
    # an ablation may set the aggregation; the method stays
    a = load_config("gear-arith-tools", ["algorithm.loss_agg=token-mean"]).algorithm
    assert (a.method, a.loss_agg) == ("gear", "token-mean")


def test_a_method_preset_names_only_the_method_and_its_settings():
    for name in BUILT_IN:
        data = read_yaml_with_bases(CONFIG_DIR / "methods" / f"{name}.yaml")
        assert "method" not in data
        assert data["algorithm"]["method"] == name
        assert not {"estimator", "critic", "shaping", "reweight", "loss_agg"} & set(data["algorithm"]), name
        sections = {m.section for m in METHODS.values()}
        assert set(data["algorithm"]) & sections <= {p.section for p in METHODS[name].parts}, name
    for name in preset_names():
        config = load_config(name)
        assert resolve_method(config.method)[0] is config.algorithm.credit_method or (
            resolve_method(config.method)[0].name == config.algorithm.credit_method.name
        )


def test_a_section_is_the_method_name_in_snake_case():
    for method in METHODS.values():
        assert method.section == method.name.replace("-", "_")


@given(
    base=st.sampled_from([m.name for m in METHODS.values() if m.estimate is not None]),
    modifiers=st.lists(
        st.sampled_from(modifier_names("shaping") + modifier_names("reweight")), max_size=2, unique=True
    ),
    label=st.one_of(st.just(""), st.text(alphabet="abz09.-", min_size=1, max_size=8).map("-".__add__)),
)
@settings(deadline=None)
def test_a_name_resolves_to_its_parts_and_back(base, modifiers, label):
    try:
        method, got = resolve_method("+".join([base, *modifiers]) + label)
    except ValueError as exc:  # a modifier the method does not allow (TIPS without a critic) says why
        assert "needs a method with a critic" in str(exc)
        return
    assert [p.name for p in method.parts] == [base, *modifiers] and got == label[1:]
    assert resolve_method(method.name)[0].parts == method.parts


@pytest.mark.parametrize("name", ["", "magic", "grpo-", "grpo+", "grpo+nope", "ppo+tips+x", "-grpo", "GRPO"])
def test_names_that_name_nothing(name):
    with pytest.raises(ValueError, match="names no registered method"):
        resolve_method(name)


@pytest.mark.parametrize("name", ["Bad", "a--b", "-a", "a-", "1a", "a_b", "a+b", ""])
def test_a_method_name_is_lower_case_words_joined_by_hyphens(name):
    """So that its config section (the name in snake_case) and the +modifier / -label syntax stay unambiguous."""
    from agentcredit.credit import Method, Needs, Settings

    with pytest.raises(ValueError, match="lower-case letters and digits"):
        Method(name, Settings, Needs(), "a test", estimate=lambda batch, settings: None)
