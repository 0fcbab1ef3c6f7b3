from pathlib import Path

import pytest
import yaml

from agentcredit.config import CONFIG_DIR, ConfigError, load_config, preset_names, validate_config
from agentcredit.credit.methods import BUILT_IN

PRESETS = preset_names()
METHODS = list(BUILT_IN)  # every built-in method (its file in agentcredit/credit/methods/)
TASKS = ["arith-tools", "kb-multihop", "gsm8k", "hotpotqa"]
VARIANTS = [
    "portool-shifted-outcome"
]  # a method's variant that is not the paper's method, under its own name


def test_every_method_has_a_preset_on_every_task():
    assert {f"{m}-{t}" for m in METHODS for t in TASKS} <= set(PRESETS)


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_load_and_validate(preset):
    config = load_config(preset)
    assert config.method in METHODS + VARIANTS
    # every preset file says where its values come from; a composed preset is its method and task files
    file = CONFIG_DIR / f"{preset}.yaml"
    if file.is_file():
        assert file.read_text().startswith("#")
        assert set(yaml.safe_load(file.read_text())) != {"base"}, "a base-only preset file is composed anyway"


def test_a_composed_preset_is_its_method_then_its_task():
    # no file: methods/grpo.yaml, then tasks/kb-multihop.yaml (whose protocol and caps win)
    assert not (CONFIG_DIR / "grpo-kb-multihop.yaml").exists()
    c = load_config("grpo-kb-multihop")
    assert (c.method, c.task.name, c.protocol.name, c.rollout.max_turns, c.rollout.n) == (
        "grpo",
        "kb-multihop",
        "tags",
        6,
        4,
    )
    # a file wins over composition (carl-critical on kb-multihop has its own protocol options)
    assert load_config("carl-critical-kb-multihop").protocol.options["style"] == "asearcher"
    with pytest.raises(ConfigError, match="presets: <method>-<task> with a method of"):
        load_config("grpo-kb-multi")


def test_paper_hyperparameters_of_carl_segment():
    c = load_config("carl-segment-arith-tools")
    a = c.algorithm
    assert (a.method, a.critic, a.carl_segment.lam, a.carl_segment.gamma, a.loss_agg) == (
        "carl-segment",
        "boundary",
        0.0,
        1.0,
        "segment-mean",
    )
    assert (a.kl_coef, a.kl_estimator, a.entropy_coef, a.value_coef, a.clip_eps) == (
        0.001,
        "k3",
        0.001,
        0.5,
        0.2,
    )
    assert c.optim.head_weight_decay == 0.0 and c.optim.epochs == 4


def test_unknown_key_names_the_key_and_the_allowed_keys():
    with pytest.raises(ConfigError) as info:
        load_config("grpo-arith-tools", ["algorithm.clip_epsilon=0.3"])
    msg = str(info.value)
    assert "algorithm.clip_epsilon" in msg and "clip_eps" in msg


def test_bad_value_names_the_key_and_the_allowed_values():
    with pytest.raises(ConfigError) as info:
        load_config("grpo-arith-tools", ["algorithm.loss_agg=mean"])
    msg = str(info.value)
    assert "algorithm.loss_agg" in msg and "segment-mean" in msg and "'mean'" in msg
    with pytest.raises(ConfigError, match="rollout.n"):
        load_config("grpo-arith-tools", ["rollout.n=0"])


def test_incompatible_settings_are_rejected_with_the_reason():
    with pytest.raises(ConfigError, match="shaping cancels"):
        validate_config({"algorithm": {"method": "grpo+tips"}})
    with pytest.raises(ConfigError, match="entropy_guided"):
        validate_config({"algorithm": {"method": "carl-critical"}})
    with pytest.raises(ConfigError, match="critic_model='separate' needs a method with a critic, not grpo"):
        validate_config({"algorithm": {"method": "grpo", "critic_model": "separate"}})


def test_overrides_are_parsed_as_yaml_and_bases_merge(tmp_path: Path):
    c = load_config("ppo-kb-multihop", ["train.steps=7", "model.lora.enabled=true", "optim.betas=[0.8, 0.9]"])
    assert c.train.steps == 7 and c.model.lora.enabled and c.optim.betas == (0.8, 0.9)
    assert c.protocol.name == "tags" and c.algorithm.method == "ppo"  # task base + method base
    loop = tmp_path / "a.yaml"
    loop.write_text("base: [a.yaml]\n")
    with pytest.raises(ConfigError, match="loop"):
        load_config(loop)
    with pytest.raises(ConfigError, match="neither a file nor a preset"):
        load_config("no-such-preset")
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config("grpo-arith-tools", ["train.steps"])


def test_a_config_from_before_the_method_sections_says_where_its_keys_moved():
    """issue 37: algorithm.gamma / lam / grpo_eps / grpo_scale became the method sections ppo (then gae), carl_segment and
    grpo; a run directory's config.yaml written before says where, in one line."""
    with pytest.raises(
        ConfigError,
        match=r"unknown key 'algorithm\.lam' \(algorithm\.lam moved to algorithm\.carl_segment\.lam or algorithm\.ppo\.lam",
    ) as e:
        load_config("ppo-arith-tools", ["algorithm.lam=0.95"])
    assert "\n" not in str(e.value)


def test_tips_potential_is_one_option_spelt_the_same_in_both_trainers():
    """Issue 37: the native `potential: paper|code` and verl's `reduce / aggregate` were two spellings of one
    option; both blocks now take `potential` from the shared TipsSettings, and verl's old keys are refused."""
    from pydantic import ValidationError

    from agentcredit.credit.methods.tips import TipsVerlSettings as VerlTips

    native = type(load_config("tips-arith-tools").algorithm.tips)
    for settings in (native, VerlTips):
        assert settings().reduce == "sum"  # the paper's Eq. 15-16
        assert settings(potential="code").reduce == "mean"  # the released code
        # issue 48: which tokens Phi scores is one option of both trainers too, the paper's by default
        assert settings().potential_scope == "answer_only"
        assert settings(potential_scope="full").potential_scope == "full"
    for old_key in ("reduce", "aggregate"):
        with pytest.raises(ValidationError, match=old_key):
            VerlTips(**{old_key: "sum"})


def test_a_config_with_the_old_strategy_name_fails_naming_the_field_and_the_new_value():
    """PORTool's tree rollout was ``rollout.strategy: portool`` before issue 53; the error is one line."""
    with pytest.raises(ConfigError, match=r"rollout\.strategy: .*'step_forks' \(got 'portool'\)") as err:
        load_config("portool-kb-multihop", ["rollout.strategy=portool"])
    assert "\n" not in str(err.value)
