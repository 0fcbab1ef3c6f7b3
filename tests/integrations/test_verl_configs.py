"""The shipped Hydra configs compose with verl's own tree for every method, and unknown keys fail loudly."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")

from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.errors import ConfigCompositionException  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from agentcredit.credit.methods import BUILT_IN  # noqa: E402
from agentcredit.integrations.verl import (  # noqa: E402
    GENERIC_CONFIG,
    METHOD_CONFIGS,
    TRAINER_NAME,
    config_dir,
)
from agentcredit.integrations.verl.settings import load_settings  # noqa: E402
from agentcredit.integrations.verl.trainer import check_trainer_config  # noqa: E402

pytestmark = pytest.mark.verl


@pytest.fixture(scope="module")
def hydra_ctx():
    with initialize_config_dir(str(config_dir()), version_base=None):
        yield


@pytest.mark.parametrize("method", sorted(METHOD_CONFIGS))
def test_every_method_config_composes_with_verls_tree(hydra_ctx, method):
    cfg = compose(METHOD_CONFIGS[method])
    OmegaConf.resolve(cfg)
    # verl's own defaults are there (nothing was copied), with ours merged on top
    assert cfg.actor_rollout_ref.actor.strategy in ("fsdp", "fsdp2")
    assert "rollout_correction" in cfg.algorithm
    assert cfg.trainer.use_v1 is True and cfg.trainer.v1.trainer_mode == TRAINER_NAME
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "agentcredit_agent"
    # registration comes from the verl.plugins entry point, not from a variable the config forwards
    assert "VERL_USE_EXTERNAL_MODULES" not in (cfg.ray_kwargs.ray_init.get("runtime_env") or {}).get(
        "env_vars", {}
    )
    # absolute, per-method data paths (verl's parquet loader does not expand `~`)
    for path in (cfg.data.train_files, cfg.data.val_files, cfg.agentcredit.tools.get("suite_corpus") or "/"):
        assert path.startswith("/") and "~" not in path
    assert f"/search_r1/{method}/" in cfg.data.train_files
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-3B-Instruct"
    assert cfg.trainer.n_gpus_per_node == 8
    settings = check_trainer_config(cfg)
    assert settings.method == method


def test_paper_hyperparameters_land_in_verls_keys(hydra_ctx):
    tips = compose("tips")
    assert (tips.algorithm.gamma, tips.algorithm.lam, tips.critic.optim.lr) == (1.0, 1.0, 1.0e-5)
    assert tips.actor_rollout_ref.actor.optim.lr == 1.0e-6 and tips.agentcredit.format_bonus == 0.2
    carl = compose("carl_segment")
    assert (
        carl.actor_rollout_ref.actor.ppo_epochs == 4
        and carl.actor_rollout_ref.actor.ppo_mini_batch_size == 16
    )
    assert carl.actor_rollout_ref.rollout.n == 5 and carl.agentcredit.carl_segment.lam == 0.0
    gear = compose("gear")
    assert gear.actor_rollout_ref.rollout.n == 8 and gear.data.train_batch_size == 128
    assert gear.agentcredit.gear.lambda_kl == 0.1 and gear.agentcredit.gear.lambda_h == 1.5
    portool = compose("portool")
    assert portool.actor_rollout_ref.actor.use_kl_loss is False
    assert portool.actor_rollout_ref.actor.loss_agg_mode == "seq-mean-token-mean"
    assert portool.actor_rollout_ref.model.lora_rank == 16 and portool.actor_rollout_ref.rollout.n == 8
    grpo = compose("grpo")
    assert grpo.actor_rollout_ref.actor.optim.lr == 5.0e-7 and grpo.actor_rollout_ref.rollout.n == 5


@pytest.mark.parametrize(
    "override", ["agentcredit.bogus=1", "agentcredit.carl_segment.lamda=0.5", "algorithm.bogus=1"]
)
def test_unknown_key_on_the_command_line_fails_in_hydra(hydra_ctx, override):
    with pytest.raises(ConfigCompositionException, match="Could not override"):
        compose("carl_segment", overrides=[override])


def test_forced_unknown_key_fails_in_our_validation(hydra_ctx):
    cfg = compose("carl_segment", overrides=["+agentcredit.carl_segment.lamda=0.5"])
    with pytest.raises(ValueError, match=r"agentcredit\.carl_segment\.lamda: Extra inputs are not permitted"):
        check_trainer_config(cfg)
    with pytest.raises(
        ValueError,
        match=r"agentcredit\.method: Value error, unknown credit method .carl_segment.; known methods: .*grpo",
    ):
        load_settings({"method": "carl_segment"})


def test_inconsistent_settings_are_rejected(hydra_ctx):
    with pytest.raises(ValueError, match="needs a critic: set critic.enable=True"):
        check_trainer_config(compose("tips", overrides=["critic.enable=false"]))
    with pytest.raises(ValueError, match="calculate_log_probs=True"):
        check_trainer_config(
            compose("gear", overrides=["actor_rollout_ref.rollout.calculate_log_probs=false"])
        )
    with pytest.raises(ValueError, match="use_kl_in_reward=True is not supported"):
        check_trainer_config(compose("ppo", overrides=["algorithm.use_kl_in_reward=true"]))


@pytest.mark.parametrize("method", sorted(METHOD_CONFIGS))
def test_verls_own_validation_accepts_critic_free_configs(hydra_ctx, method, monkeypatch):
    """verl's validate_config on CPU for every critic-free method without LoRA (the critic methods need the
    model's files, a LoRA one vLLM)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from agentcredit.credit import get_method

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = compose(METHOD_CONFIGS[method])
    OmegaConf.resolve(cfg)
    assert need_critic(cfg) == (get_method(method).all_needs.critic != "none"), method
    if need_critic(cfg) or cfg.actor_rollout_ref.model.get("lora_rank", 0) > 0:
        pytest.skip(f"{method}: a critic needs the model's files, LoRA needs vLLM")
    # raises on any inconsistency verl itself checks (batch sizes, micro batches, rollout n, ...)
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


def test_method_settings_are_the_native_ones(hydra_ctx):
    """Every method's section, in both trainers, is (a subclass of) the settings class of its method file
    (issue 37: one schema per method), and TIPS's alpha target follows the paper in both trainers (issue 14: the two
    sides' settings had drifted apart)."""
    from agentcredit.config import AlgorithmConfig, load_config
    from agentcredit.credit import METHODS
    from agentcredit.credit.methods.tips import TipsSettings as TipsShapingConfig
    from agentcredit.integrations.verl.settings import AgentCreditSettings

    for method in METHODS.values():
        for block in (AgentCreditSettings, AlgorithmConfig):
            assert issubclass(block.model_fields[method.section].annotation, method.settings), (block, method)
    tips_native = load_config("tips-arith-tools").algorithm.tips
    tips_verl = check_trainer_config(compose("tips")).tips
    # the CPU preset sets the fallback alpha before a batch has a tool turn (0.02) and a refresh interval its few
    # dozen steps reach (10); verl's config keeps the paper's (200)
    for name in TipsShapingConfig.model_fields:
        if name not in ("alpha", "refresh_every"):
            assert getattr(tips_verl, name) == getattr(tips_native, name), name
    assert tips_verl.refresh_every == 200 and tips_native.refresh_every == 10
    gear = check_trainer_config(compose("gear"))
    native_gear = load_config("gear-arith-tools").algorithm.gear
    assert gear.gear.template == native_gear.template and gear.gear.lambda_kl == native_gear.lambda_kl
    tips = check_trainer_config(compose("tips"))
    assert tips.tips.target_mean_abs == load_config("tips-arith-tools").algorithm.tips.target_mean_abs == 0.2


@pytest.mark.parametrize("method", sorted(BUILT_IN))
def test_every_method_runs_from_the_generic_config(hydra_ctx, method):
    """issue 37: a method needs no Hydra file of its own. agentcredit.yaml with agentcredit.method=<name> gets the
    verl keys the method's Needs decide (critic, adv_estimator, loss_agg_mode, the rollout tree); a paper recipe,
    where one ships, agrees on the critic and the tree."""
    from agentcredit.credit import get_method
    from agentcredit.integrations.verl.settings import verl_keys

    cfg = compose(GENERIC_CONFIG, overrides=[f"agentcredit.method={method}"])
    OmegaConf.resolve(cfg)
    needs, keys = get_method(method).all_needs, verl_keys(method)
    assert cfg.critic.enable is (needs.critic != "none")
    assert cfg.algorithm.adv_estimator == keys["algorithm.adv_estimator"]
    assert cfg.actor_rollout_ref.actor.loss_agg_mode == keys["actor_rollout_ref.actor.loss_agg_mode"]
    assert cfg.agentcredit.tree.strategy == (needs.rollout or "independent")
    if method in METHOD_CONFIGS:
        recipe = compose(METHOD_CONFIGS[method])
        OmegaConf.resolve(recipe)
        assert recipe.critic.enable is cfg.critic.enable, method
        assert recipe.agentcredit.tree.strategy == cfg.agentcredit.tree.strategy, method
    # a tree method also sizes its tree to rollout.n, and TIPS's lagged teacher (refresh_every > 1) needs a weight
    # transport (checkpoint_engine.backend): settings of a run, which the trainer's check names (its recipe sets them)
    if needs.rollout in (None, "independent") and "potentials" not in needs.signals:
        assert check_trainer_config(cfg).method == method


def test_gigpo_ships_no_verl_file():
    """GiGPO is its method file, its native preset and its tests: verl runs it from the generic config."""
    from agentcredit.integrations.verl import config_name

    assert "gigpo" not in METHOD_CONFIGS and config_name("gigpo") == GENERIC_CONFIG
    assert not (config_dir() / "gigpo.yaml").exists()


def test_a_method_registered_outside_the_package_runs_from_the_generic_config(hydra_ctx):
    """A method registered from user code (here, this test) needs no verl YAML: its critic-free Needs give verl's
    keys, and its settings section is +agentcredit.<its name in snake_case>."""
    from pydantic import Field

    from agentcredit.credit import METHODS, Estimate, Method, Needs, Settings, register_method
    from agentcredit.credit.methods import grpo, unregister_method

    class Halved(Settings):
        factor: float = Field(0.5, description="the multiplier of GRPO's advantage (a test method).")

    def halved_grpo(batch, s):
        est = grpo.estimate(batch, grpo.GrpoSettings())
        return Estimate(est.advantages * s.factor, est.loss_mask)

    register_method(
        Method("halved-grpo", Halved, Needs(loss_agg="seq-mean-token-mean"), "a test", estimate=halved_grpo)
    )
    try:
        cfg = compose(
            GENERIC_CONFIG,
            overrides=["agentcredit.method=halved-grpo", "+agentcredit.halved_grpo.factor=0.25"],
        )
        OmegaConf.resolve(cfg)
        assert (
            cfg.critic.enable is False and cfg.actor_rollout_ref.actor.loss_agg_mode == "seq-mean-token-mean"
        )
        settings = check_trainer_config(cfg)
        assert METHODS["halved-grpo"].settings_from(settings)["halved_grpo"].factor == 0.25
    finally:
        unregister_method("halved-grpo")


@pytest.mark.parametrize(
    ("method", "key"),
    [
        ("portool", r"set actor_rollout_ref\.rollout\.n=\d+"),
        ("tips", r"actor_rollout_ref\.rollout\.checkpoint_engine\.backend=nccl"),
    ],
)
def test_the_generic_config_refuses_portool_and_tips_naming_the_key(hydra_ctx, method, key):
    """issue 51: the generic config does not run PORTool (its tree's leaves vs the base's n = 5) or TIPS (its
    lagged teacher's transport); it stays so (their recipes set both, docs/scaling-out-with-verl.md), and the
    refusal names the key to change."""
    cfg = compose(GENERIC_CONFIG, overrides=[f"agentcredit.method={method}"])
    with pytest.raises(ValueError, match=key):
        check_trainer_config(cfg)


def _launch_commands() -> list[list[str]]:
    """The shell commands of the doc's Launch section (continuations joined, comments dropped), tokenised."""
    import re
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "scaling-out-with-verl.md").read_text(
        encoding="utf-8"
    )
    start = text.index("## Launch (")
    block = re.search(r"```bash\n(.*?)```", text[start:], re.S).group(1)
    return [shlex.split(c, comments=True) for c in block.replace("\\\n", " ").splitlines() if c.strip()]


def test_the_documented_launch_is_what_runs(hydra_ctx, monkeypatch, tmp_path):
    """issue 51: the recipe had `~` data paths (verl's parquet loader does not expand them) and an export the docs
    called optional; the resolver it needs was only registered with that export. Every command of the doc's
    recipe: no `~`, no export; prepare-data per method, written where that method's config reads it; each
    main_ppo line composes with verl's tree and passes agentcredit's checks."""
    from agentcredit.integrations.verl.__main__ import main as verl_main

    commands = [c for c in _launch_commands() if c and not c[0].startswith("#")]
    assert commands and not any(c[0] == "export" for c in commands)
    assert not any("~" in token for c in commands for token in c)
    monkeypatch.setenv("HOME", str(tmp_path))
    prepared, launched = {}, []
    for c in commands:
        if c[:3] == ["python", "-m", "agentcredit.integrations.verl"] and c[3] == "prepare-data":
            args = c[4:]
            method = args[args.index("--method") + 1]
            prepared[method] = args
        elif c[:3] == ["python", "-m", "verl.trainer.main_ppo"]:
            name = c[c.index("--config-name") + 1]
            overrides = [t for t in c[c.index("--config-name") + 2 :] if "=" in t]
            launched.append((name, overrides))
    assert prepared and launched
    for name, overrides in launched:
        cfg = compose(name, overrides=overrides)
        OmegaConf.resolve(cfg)
        settings = check_trainer_config(cfg)
        assert (
            cfg.data.train_files == f"{tmp_path}/data/agentcredit/search_r1/{settings.method}/train.parquet"
        )
        if settings.method in prepared:  # written for this method, with the run's protocol options
            args = prepared[settings.method]
            options = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--protocol-option")
            from agentcredit.integrations.verl.data import method_protocol

            protocol, defaults = method_protocol(settings.method)
            assert (protocol, options or defaults) == (settings.protocol, settings.protocol_options)
    # a prepare-data line runs as written (a local JSONL in place of Search-R1's export)
    questions = tmp_path / "data" / "search_r1" / "nq_hotpotqa_train.jsonl"
    questions.parent.mkdir(parents=True)
    questions.write_text('{"id": "a", "question": "who wrote X", "golden_answers": ["Jane Doe"]}\n')
    method, args = next(iter(prepared.items()))
    args = [a.replace("$HOME", str(tmp_path)) for a in args]
    args[args.index("--val") + 1] = ""
    assert verl_main(["prepare-data", *args]) == 0
    assert (tmp_path / "data" / "agentcredit" / "search_r1" / method / "train.parquet").is_file()
