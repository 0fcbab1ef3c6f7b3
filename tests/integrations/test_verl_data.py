"""prepare-data writes parquet that verl's own RLHFDataset reads, with what the agent loop needs in each row."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")

from hydra import compose, initialize_config_dir  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402

from agentcredit.integrations.verl import AGENT_LOOP_NAME, config_dir  # noqa: E402
from agentcredit.integrations.verl.__main__ import main  # noqa: E402
from agentcredit.integrations.verl.agent_loop import sample_fields  # noqa: E402
from agentcredit.integrations.verl.data import parse_task_list  # noqa: E402
from agentcredit.protocols import get_protocol  # noqa: E402

pytestmark = pytest.mark.verl


def test_parse_task_list():
    assert parse_task_list("nq:dev, hotpotqa,jsonl:/a/b:c.jsonl") == [
        ("nq", "dev"),
        ("hotpotqa", None),
        ("jsonl:/a/b:c.jsonl", None),
    ]
    with pytest.raises(ValueError, match="no task"):
        parse_task_list(" , ")


def test_prepare_data_round_trips_through_verls_dataset(tmp_path, byte_tokenizer):
    questions = tmp_path / "qa.jsonl"
    questions.write_text(
        '{"id": "a", "question": "who wrote X", "golden_answers": ["Jane Doe", "J. Doe"]}\n'
        '{"id": "b", "question": "capital of Y", "golden_answers": ["Z"]}\n'
    )
    rc = main(
        [
            "prepare-data",
            "--train",
            f"jsonl:{questions}",
            "--val",
            "",
            "--out",
            str(tmp_path / "out"),
            "--task-option",
            "answer_field=golden_answers",
        ]
    )
    assert rc == 0
    with initialize_config_dir(str(config_dir()), version_base=None):
        cfg = compose("grpo", overrides=["data.dataloader_num_workers=0"])
    ds = RLHFDataset(str(tmp_path / "out" / "train.parquet"), byte_tokenizer, cfg.data)
    assert len(ds) == 2
    row = ds[0]
    assert row["agent_name"] == AGENT_LOOP_NAME and row["index"] == 0
    proto = get_protocol("tags", style="search-r1")
    assert list(row["raw_prompt"]) == proto.messages(proto.new_episode("who wrote X"))
    # what the agent loop reads from a dataset row
    messages, question, golds = sample_fields(row)
    assert question == "who wrote X" and golds == ["Jane Doe", "J. Doe"]
    assert messages == proto.messages(proto.new_episode("who wrote X"))


def test_the_examples_info_reaches_the_agent_loops_example(tmp_path):
    """GEAR's tau* on verl plays the task's demonstration, which reads the example's info (kb-multihop's chain):
    prepare-data writes it as JSON (rows' info dicts differ in shape) and the agent loop's Example has it back."""
    from agentcredit.integrations.verl.agent_loop import _example
    from agentcredit.tasks import load_task

    rc = main(
        ["prepare-data", "--train", "kb-multihop:train", "--val", "", "--out", str(tmp_path), "--limit", "3"]
    )
    assert rc == 0
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    examples = load_task("kb-multihop", split="train", limit=3, seed=0)
    for row, example in zip(rows, examples, strict=True):
        extra = row["extra_info"]
        got = _example({**row, "extra_info": extra}, extra["question"], list(extra["answers"]))
        assert got.info["chain"] == example.info["chain"] and got.task == "kb-multihop"
        assert {k: got.info[k] for k in example.info} == example.info


def test_prepare_data_rejects_questions_without_answers(tmp_path):
    questions = tmp_path / "qa.jsonl"
    questions.write_text('{"id": "a", "question": "q", "answers": []}\n')
    with pytest.raises(ValueError):
        main(["prepare-data", "--train", f"jsonl:{questions}", "--val", "", "--out", str(tmp_path / "o")])


@pytest.mark.parametrize(
    "method", ["grpo", "ppo", "carl-segment", "carl-critical", "tips", "gear", "portool", "gigpo"]
)
def test_prepare_data_renders_each_methods_protocol(method, monkeypatch, tmp_path):
    """issue 51: prepare-data rendered every prompt with the tags protocol; --method takes the protocol (and options)
    the method's config parses with, and writes where that config's data.train_files looks."""
    from agentcredit.integrations.verl import config_name
    from agentcredit.integrations.verl.data import check_data_files, method_protocol

    with initialize_config_dir(str(config_dir()), version_base=None):
        cfg = compose(config_name(method), overrides=[f"agentcredit.method={method}"])
    block = cfg.agentcredit
    assert method_protocol(method) == (block.protocol, dict(block.get("protocol_options") or {}))
    monkeypatch.setenv("HOME", str(tmp_path))
    questions = tmp_path / "qa.jsonl"
    questions.write_text('{"id": "a", "question": "who wrote X", "answers": ["Jane Doe"]}\n')
    assert main(["prepare-data", "--method", method, "--train", f"jsonl:{questions}", "--val", ""]) == 0
    from omegaconf import OmegaConf

    OmegaConf.resolve(cfg)  # ${oc.env:HOME}/data/agentcredit/search_r1/<method>/train.parquet
    check_data_files(cfg.data.train_files, block.protocol, dict(block.get("protocol_options") or {}))


def test_prepare_data_refuses_an_unknown_method_in_one_line(capsys, tmp_path):
    assert main(["prepare-data", "--method", "grpoo", "--train", "nq", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("--method: ") and len(err.strip().splitlines()) == 1
