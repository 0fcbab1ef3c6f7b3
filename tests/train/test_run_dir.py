"""Run directories (issue 34): a run killed in its first checkpoint write, a torn metrics line, two writers."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
from train_helpers import SMALL
from typer.testing import CliRunner

from agentcredit.cli import app
from agentcredit.config import dump_config, load_config
from agentcredit.locks import claim
from agentcredit.run import RunDirError, config_for_resume, run_train
from agentcredit.train import trainer as trainer_module
from agentcredit.train.logging import MetricsLogger

SETTINGS = [
    *SMALL,
    "train.steps=2",
    "task.eval_limit=1",
    "rollout.max_new_tokens=16",
    "rollout.prompts_per_step=1",
    "rollout.n=2",
]


class _Killed(BaseException):
    """Stands for a kill -9 in the middle of the first checkpoint write."""


def _steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_run_killed_in_its_first_checkpoint_write(tmp_path, monkeypatch):
    # A kill during the first save left metrics rows and no complete checkpoint: `--resume` refused ("no complete
    # checkpoint") and a plain restart with the same --run-dir appended, logging step 1 twice.
    run_dir = tmp_path / "run"
    config = load_config("grpo-arith-tools", [*SETTINGS, "train.save_every=1"])

    def killed(*args, **kwargs):
        raise _Killed

    with monkeypatch.context() as patch:
        patch.setattr(trainer_module, "save_checkpoint", killed)
        with pytest.raises(_Killed):
            run_train(config, run_dir=run_dir, progress=False, log=lambda line: None)
    assert _steps(run_dir) == [1]
    # a kill can also tear the row being written
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 2, "ti')

    # a plain restart into it is refused with one line, and nothing is appended
    with pytest.raises(
        RunDirError, match=r"already holds a run \(metrics.jsonl\); continue it with --resume"
    ):
        run_train(config, run_dir=run_dir, progress=False, log=lambda line: None)
    result = CliRunner().invoke(
        app, ["train", "--config", "grpo-arith-tools", "--run-dir", str(run_dir), *_sets(SETTINGS)]
    )
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "--resume" in result.output
    assert "Traceback" not in result.output

    # --resume starts it over from step 0: one row per step, the torn line dropped with a warning naming the file
    lines: list[str] = []
    with pytest.warns(UserWarning, match=r"metrics\.jsonl line 2: dropped a malformed last line"):
        run_train(config_for_resume(run_dir, []), resume=run_dir, progress=False, log=lines.append)
    assert _steps(run_dir) == [1, 2]
    assert any(
        "no complete checkpoint: starting over from step 0 (1 logged rows dropped)" in ln for ln in lines
    )


def _sets(settings: list[str]) -> list[str]:
    return [arg for s in settings for arg in ("--set", s)]


def test_torn_last_metrics_line_is_dropped_with_a_warning(tmp_path):
    logger = MetricsLogger(tmp_path, tensorboard=False)
    for step in (1, 2, 3):
        logger.log(step, {"x": float(step)})
    path = tmp_path / "metrics.jsonl"
    with open(path, "a") as fh:
        fh.write('{"step": 4, "x": 4.')  # the write a kill cut off
    with pytest.warns(UserWarning, match=rf"{path} line 4: dropped a malformed last line"):
        assert logger.drop_after(2) == 1  # step 3's row; the torn line is not a row
    logger.log(3, {"x": 30.0})
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
    logger.close()


def test_torn_row_without_its_newline_gets_one(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}')  # cut off just before the newline: valid JSON, kept
    logger = MetricsLogger(tmp_path, tensorboard=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert logger.drop_after(5) == 0
    logger.log(3, {})
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
    logger.close()


def test_bad_metrics_line_before_the_end_names_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{oops\n{"step": 2}\n')
    logger = MetricsLogger(tmp_path, tensorboard=False)
    with pytest.raises(ValueError, match=rf"{path} line 2: invalid JSON"):
        logger.drop_after(1)
    logger.close()


def test_a_run_directory_in_use_is_refused(tmp_path):
    # Two `--resume` of one run both finished and logged step 6 twice. The run directory is now locked with the
    # studies' claim (an flock: a second open of the lock file cannot take it, in this process or another).
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = load_config("grpo-arith-tools", SETTINGS)
    (run_dir / "config.yaml").write_text(dump_config(config))
    with claim(run_dir / ".lock") as mine:
        assert mine
        with pytest.raises(RunDirError, match=rf"{run_dir} is in use by another agentcredit process \(\d+@"):
            run_train(config, resume=run_dir, progress=False, log=lambda line: None)
        result = CliRunner().invoke(app, ["train", "--resume", str(run_dir)])
        assert result.exit_code == 2 and result.output.count("\n") == 1
        assert "is in use by another agentcredit process" in result.output
    assert not (run_dir / "metrics.jsonl").exists()


# ---- the lock file (issue 52) -------------------------------------------------------------------------------------


def test_a_symlinked_lock_is_refused_and_its_target_kept(tmp_path):
    # The lock followed a symlink and truncated its target before the run was refused: `.lock` -> a victim file
    # was overwritten with "pid@host". It is now opened without following links.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (run_dir / ".lock").symlink_to(victim)
    with pytest.raises(ValueError, match=rf"{run_dir / '.lock'} is a symbolic link"):
        with claim(run_dir / ".lock"):
            pass
    assert victim.read_text() == "precious\n"
    result = CliRunner().invoke(
        app, ["train", "--config", "grpo-arith-tools", "--run-dir", str(run_dir), *_sets(SETTINGS)]
    )
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "symbolic link" in result.output
    assert victim.read_text() == "precious\n"


def test_a_lock_that_is_not_a_plain_file_is_refused(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.link(victim, tmp_path / ".lock")  # a hard link: the same inode under two names
    with pytest.raises(ValueError, match=r"\.lock has 2 links"):
        with claim(tmp_path / ".lock"):
            pass
    assert victim.read_text() == "precious\n"
    os.mkfifo(tmp_path / "fifo.lock")
    with pytest.raises(ValueError, match=r"fifo\.lock is not a regular file"):
        with claim(tmp_path / "fifo.lock"):
            pass


# ---- resume's metrics reader (issue 52) ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "last",
    [b"[1, 2]\n", b"42", b'"step"', b'{"step": "3"}\n', b'{"x": 1}', b'{"step": 3, "x": \xff\xfe', b"\xff\n"],
    ids=["list", "number", "string", "step-not-an-int", "no-step", "torn-bad-byte", "bad-byte"],
)
def test_every_malformed_last_metrics_line_is_dropped_with_a_warning(tmp_path, last):
    # A non-object JSON last line crashed resume with a traceback (AttributeError), and a bad byte gave a
    # UnicodeDecodeError that did not name the file.
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n{"step": 2}\n' + last)
    logger = MetricsLogger(tmp_path, tensorboard=False)
    with pytest.warns(UserWarning, match=rf"{path} line 3: dropped a malformed last line"):
        assert logger.drop_after(1) == 1  # step 2's row; the malformed line is not a row
    assert path.read_bytes() == b'{"step": 1}\n'
    logger.close()


@pytest.mark.parametrize(
    ("middle", "why"),
    [
        (b"[1]", "expected a JSON object with an integer step, got list"),
        (b'{"step": 2, "x": "\xff"}', "not UTF-8"),
    ],
)
def test_a_malformed_metrics_line_before_the_end_names_file_and_line(tmp_path, middle, why):
    path = tmp_path / "metrics.jsonl"
    original = b'{"step": 1}\n' + middle + b'\n{"step": 3}\n'
    path.write_bytes(original)
    logger = MetricsLogger(tmp_path, tensorboard=False)
    with pytest.raises(ValueError, match=rf"{path} line 2: .*{why}"):
        logger.drop_after(1)
    assert path.read_bytes() == original  # nothing is repaired that is not a torn last line
    logger.close()
