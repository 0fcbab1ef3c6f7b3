"""A resume from checkpoint k forgets the metrics logged after k (they are logged again), so no step counts twice."""

from __future__ import annotations

import json

from agentcredit.train.logging import MetricsLogger


def test_drop_after_keeps_rows_up_to_the_checkpoint_step(tmp_path):
    logger = MetricsLogger(tmp_path, tensorboard=False)
    for step in (1, 2, 2, 3, 4):  # step 2 has a training row and a held-out evaluation row
        logger.log(step, {"x": float(step)})
    assert logger.drop_after(2) == 2
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 2]
    logger.log(3, {"x": 30.0})  # the redone step appends after the kept rows
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["x"]) for r in rows] == [(1, 1.0), (2, 2.0), (2, 2.0), (3, 30.0)]
    assert logger.drop_after(10) == 0
    logger.close()


def test_resume_drops_the_rows_of_redone_steps(fitted_codefence, tmp_path):
    from train_helpers import SMALL

    from agentcredit.config import load_config
    from agentcredit.train.trainer import Trainer

    model, tokenizer = fitted_codefence
    config = load_config("grpo-arith-tools", [*SMALL, "train.steps=1"])
    first = Trainer(config, run_dir=tmp_path, model=model, tokenizer=tokenizer)
    first.train(progress=False)  # saves a checkpoint at step 1
    first.logger.log(
        2, {"x": 1.0}
    )  # as if step 2 was logged and the process was killed before its checkpoint
    first.close()
    again = Trainer(config, run_dir=tmp_path, model=model, tokenizer=tokenizer)
    again.resume(tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert again.step == 1 and max(r["step"] for r in rows) == 1
    again.close()
