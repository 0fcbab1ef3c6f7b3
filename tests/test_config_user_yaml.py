"""A user's YAML: ``base:`` on a packaged preset by name, and duplicate keys rejected with file and line."""

from pathlib import Path

import pytest

from agentcredit.config import ConfigError, load_config
from agentcredit.lab.study import StudyError, load_study


def test_base_names_a_packaged_method_preset(tmp_path: Path):
    user = tmp_path / "mine.yaml"
    user.write_text("base: grpo\ntrain:\n  steps: 3\n")
    c = load_config(user)
    grpo = load_config("grpo-arith-tools")
    assert c.algorithm.method == grpo.algorithm.method == "grpo"
    assert c.train.steps == 3


def test_base_names_a_composed_preset_and_a_task(tmp_path: Path):
    user = tmp_path / "mine.yaml"
    user.write_text("base: [grpo-arith-tools]\nrollout:\n  n: 3\n")
    c, packaged = load_config(user), load_config("grpo-arith-tools")
    assert c.task.name == "arith-tools" and c.protocol.name == packaged.protocol.name
    assert c.rollout.n == 3 and c.rollout.max_turns == packaged.rollout.max_turns
    user.write_text("base: [gigpo, arith-tools]\n")
    c = load_config(user)
    assert (c.method, c.task.name) == (load_config("gigpo-arith-tools").method, "arith-tools")


def test_a_local_file_wins_over_a_packaged_name(tmp_path: Path):
    (tmp_path / "grpo.yaml").write_text("train:\n  steps: 11\n")
    user = tmp_path / "mine.yaml"
    user.write_text("# mine\nbase: grpo.yaml\n")
    assert load_config(user).train.steps == 11


def test_a_missing_base_names_the_file_and_line(tmp_path: Path):
    user = tmp_path / "mine.yaml"
    user.write_text("# my run\ntrain:\n  steps: 3\nbase: gpro\n")
    with pytest.raises(ConfigError) as info:
        load_config(user)
    msg = str(info.value)
    assert f"{user} line 4" in msg and "'gpro'" in msg and "grpo" in msg  # the methods it could have meant


def test_duplicate_top_level_key_names_file_and_both_lines(tmp_path: Path):
    user = tmp_path / "mine.yaml"
    user.write_text("train:\n  steps: 3\nrollout:\n  n: 2\ntrain:\n  steps: 5\n")
    with pytest.raises(ConfigError, match=rf"{user} line 5: key 'train' appears twice .*first on line 1"):
        load_config(user)


def test_duplicate_nested_key_is_rejected(tmp_path: Path):
    user = tmp_path / "mine.yaml"
    user.write_text("base: grpo\nalgorithm:\n  clip_eps: 0.2\n  kl_coef: 0.0\n  clip_eps: 0.3\n")
    with pytest.raises(ConfigError, match=r"line 5: key 'clip_eps' appears twice"):
        load_config(user)


def test_yaml_merge_keys_still_override(tmp_path: Path):
    user = tmp_path / "mine.yaml"
    user.write_text("x: &d {steps: 2, seed: 1}\ntrain:\n  <<: *d\n  steps: 4\n")
    from agentcredit.config import load_yaml_file

    data, lines = load_yaml_file(user)
    assert data["train"] == {"steps": 4, "seed": 1} and lines == {"x": 1, "train": 2}


def test_a_study_file_rejects_duplicate_keys(tmp_path: Path):
    study = tmp_path / "s.yaml"
    study.write_text("name: a\nname: b\n")
    with pytest.raises(StudyError, match=rf"{study} line 2: key 'name' appears twice"):
        load_study(study)


def test_cli_exits_2_with_one_line(tmp_path: Path):
    from typer.testing import CliRunner

    from agentcredit.cli import app

    user = tmp_path / "mine.yaml"
    user.write_text("train:\n  steps: 3\ntrain:\n  steps: 5\n")
    result = CliRunner().invoke(app, ["train", "--config", str(user)])
    assert result.exit_code == 2
    assert "line 3: key 'train' appears twice" in result.output and "Traceback" not in result.output
