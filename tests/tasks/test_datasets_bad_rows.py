"""Malformed data must fail with an error that names the file, the line (or record) and the field."""

import json
import re

import pytest

from agentcredit.tasks import datasets, load_task
from agentcredit.tasks.example import Example


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8"
    )
    return path


def test_user_jsonl_roundtrip_and_fields(tmp_path):
    path = write_jsonl(
        tmp_path / "qa.jsonl",
        [
            {"id": "a", "question": "Capital of France?", "answer": "Paris", "level": 1},
            {"question": "2+2?", "answers": [4, "four"]},
            "",  # blank lines are skipped
            {"id": 7, "question": "Who?", "golden_answers": ["Ada", "Ada Lovelace"], "metric": "f1"},
        ],
    )
    examples = load_task(f"jsonl:{path}")
    assert [ex.id for ex in examples] == ["a", "qa-2", "7"]
    assert examples[0].answers == ["Paris"] and examples[0].info == {"level": 1, "metric": "em"}
    assert examples[1].answers == ["4", "four"]
    assert examples[2].answers == ["Ada", "Ada Lovelace"] and examples[2].metric == "f1"
    assert all(ex.task == f"jsonl:{path}" for ex in examples)


def test_user_jsonl_custom_fields(tmp_path):
    path = write_jsonl(tmp_path / "custom.jsonl", [{"q": "Why?", "gold": "because", "uid": "x1"}])
    (example,) = load_task(
        f"jsonl:{path}", question_field="q", answer_field="gold", id_field="uid", metric="f1"
    )
    assert (example.id, example.question, example.answers, example.metric) == (
        "x1",
        "Why?",
        ["because"],
        "f1",
    )


def test_query_only_rows_when_answers_not_required(tmp_path):
    path = write_jsonl(tmp_path / "queries.jsonl", [{"question": "what's 70 days from march 21"}])
    (example,) = load_task(f"jsonl:{path}", require_answers=False)
    assert example.answers == []


@pytest.mark.parametrize(
    ("rows", "kwargs", "message"),
    [
        (
            [{"question": "q", "answer": "a"}, {"question": "q2"}],
            {"answer_field": "answer"},
            "line 2: field 'answer' is missing",
        ),
        ([{"question": "q"}], {}, "line 1: field 'answers', 'answer', 'golden_answers' is missing"),
        ([{"answer": "a"}], {}, "line 1: field 'question' is missing"),
        ([{"question": "   ", "answer": "a"}], {}, "line 1: field 'question' is empty"),
        ([{"question": 5, "answer": "a"}], {}, "line 1: field 'question' must be str, got int"),
        (
            [{"question": "q", "answer": {"x": 1}}],
            {},
            "line 1: field 'answer' must be a string or a number, got dict",
        ),
        (
            [{"question": "q", "answers": ["a", None]}],
            {},
            "line 1: field 'answers' item 1 must be a string or a number",
        ),
        (
            [{"question": "q", "answers": [True]}],
            {},
            "field 'answers' item 0 must be a string or a number, got bool",
        ),
        ([{"question": "q", "answers": []}], {}, "line 1: field 'answers' holds no answer"),
        ([{"question": "q", "answer": "a"}, "{not json"], {}, "line 2: invalid JSON"),
        ([{"question": "q", "answer": "a"}, "[1, 2]"], {}, "line 2: expected a JSON object, got list"),
        ([{"id": "x", "question": "q", "answer": "a"}] * 2, {}, "duplicate id 'x'"),
        ([{"id": ["x"], "question": "q", "answer": "a"}], {}, "line 1: field 'id' must be str or int"),
    ],
)
def test_user_jsonl_bad_rows(tmp_path, rows, kwargs, message):
    path = write_jsonl(tmp_path / "data" / "x.jsonl", rows)
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        datasets.load_jsonl(path, **kwargs)
    assert str(info.value).startswith(str(path))


def test_error_message_format_matches_the_convention(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [{"question": "q", "answer": "a"}] * 16 + [{"question": "q"}])
    with pytest.raises(ValueError) as info:
        datasets.load_jsonl(path, answer_field="answer")
    assert str(info.value).startswith(f"{path} line 17: field 'answer' is missing")


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_task(f"jsonl:{tmp_path / 'nope.jsonl'}")
    with pytest.raises(ValueError, match="needs a path"):
        load_task("jsonl:")


def test_gzip_jsonl(tmp_path):
    import gzip

    path = tmp_path / "q.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(json.dumps({"question": "q", "answer": "a"}) + "\n")
    assert load_task(f"jsonl:{path}")[0].id == "q-1"


# ---------------------------------------------------------------------------------------------------
# Benchmark loaders on tiny broken copies


def test_gsm8k_bad_rows(tmp_path):
    path = write_jsonl(
        tmp_path / "gsm8k" / "test.jsonl",
        [{"question": "q", "answer": "x = 3\n#### 3"}, {"question": "q", "answer": "no final line"}],
    )
    with pytest.raises(ValueError, match=re.escape(f"{path} line 2: field 'answer' has no '#### <number>'")):
        datasets.load_gsm8k(tmp_path, "test")
    write_jsonl(path, [{"question": "q", "answer": "#### three"}])
    with pytest.raises(
        ValueError, match="line 1: field 'answer' ends in '#### three', which is not a number"
    ):
        datasets.load_gsm8k(tmp_path, "test")
    with pytest.raises(ValueError, match="gsm8k has no split 'dev'; available: train, test"):
        datasets.load_gsm8k(tmp_path, "dev")


def _hotpot_row(**overrides):
    row = {
        "_id": "h1",
        "question": "Which?",
        "answer": "A",
        "supporting_facts": [["T1", 0], ["T2", 0]],
        "context": [["T1", ["One.", " Two."]], ["T2", ["Three."]]],
        "type": "bridge",
        "level": "hard",
    }
    row.update(overrides)
    return row


def _hotpot_root(tmp_path, official_rows):
    write_jsonl(tmp_path / "hotpotqa" / "ircot_dev_subsampled_500.jsonl", [])
    write_jsonl(tmp_path / "hotpotqa" / "migres_hotpot_dev_200.jsonl", [])
    return write_jsonl(tmp_path / "hotpotqa" / "aflow_hotpotqa_validate_200.jsonl", official_rows)


def test_hotpotqa_official_rows(tmp_path):
    _hotpot_root(tmp_path, [_hotpot_row()])
    (example,) = datasets.load_hotpotqa(tmp_path, "dev")
    assert example.info["supporting_passages"] == [
        {"title": "T1", "text": "One. Two."},
        {"title": "T2", "text": "Three."},
    ]

    path = _hotpot_root(tmp_path, [_hotpot_row(), _hotpot_row(_id="h2", supporting_facts=[["T9", 0]])])
    with pytest.raises(
        ValueError, match=re.escape(f"{path} line 2: supporting title(s) ['T9'] not in field 'context'")
    ):
        datasets.load_hotpotqa(tmp_path, "dev")
    _hotpot_root(tmp_path, [_hotpot_row(context=[["T1"]])])
    with pytest.raises(
        ValueError, match="line 1: field 'context' item 0 must be \\[title, \\[sentences\\]\\]"
    ):
        datasets.load_hotpotqa(tmp_path, "dev")
    _hotpot_root(tmp_path, [_hotpot_row(_id=None)])
    with pytest.raises(ValueError, match="line 1: field '_id' must be str or int, got NoneType"):
        datasets.load_hotpotqa(tmp_path, "dev")


def test_hotpotqa_ircot_rows(tmp_path):
    _hotpot_root(tmp_path, [])
    path = write_jsonl(
        tmp_path / "hotpotqa" / "ircot_dev_subsampled_500.jsonl",
        [{"question_id": "i1", "question_text": "Q?", "answers_objects": [{"spans": []}], "contexts": []}],
    )
    with pytest.raises(
        ValueError, match=re.escape(f"{path} line 1: field 'answers_objects' holds no answer span")
    ):
        datasets.load_hotpotqa(tmp_path, "dev")
    write_jsonl(
        path,
        [
            {
                "question_id": "i1",
                "question_text": "Q?",
                "answers_objects": [{"spans": ["x"]}],
                "contexts": [{"title": "T"}],
            }
        ],
    )
    with pytest.raises(
        ValueError, match=re.escape(f"{path} line 1 contexts[0]: field 'is_supporting' is missing")
    ):
        datasets.load_hotpotqa(tmp_path, "dev")


def test_musique_bad_id_and_paragraph(tmp_path):
    path = write_jsonl(
        tmp_path / "musique" / "migres_musique_dev_200.jsonl",
        [{"id": "abc", "question": "q", "answer": "a", "paragraphs": []}],
    )
    with pytest.raises(ValueError, match="line 1: field 'id' 'abc' does not start with '<n>hop'"):
        datasets.load_musique(tmp_path, "dev")
    write_jsonl(
        path,
        [
            {
                "id": "2hop__1",
                "question": "q",
                "answer": "a",
                "paragraphs": [{"title": "t", "is_supporting": "yes"}],
            }
        ],
    )
    with pytest.raises(
        ValueError, match=re.escape("line 1 paragraphs[0]: field 'is_supporting' must be bool, got str")
    ):
        datasets.load_musique(tmp_path, "dev")


def test_2wiki_unparseable_supporting_facts(tmp_path):
    write_jsonl(
        tmp_path / "2wikimultihopqa" / "migres_2wiki_dev_200.jsonl",
        [{"_id": "w", "type": "compositional", "question": "q", "answer": "a", "supporting_facts": "[[oops"}],
    )
    with pytest.raises(ValueError, match="line 1: field 'supporting_facts' is not a list"):
        datasets.load_2wiki(tmp_path, "dev_all")
    assert datasets.load_2wiki(tmp_path, "dev") == []  # no context -> not in the BM25 split


def test_json_list_files(tmp_path):
    path = tmp_path / "tatqa" / "pot_tatqa_dev.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"not": "a list"}))
    with pytest.raises(ValueError, match="expected a JSON list of records, got dict"):
        datasets.load_tatqa(tmp_path, "dev")
    good = {
        "question_id": "t",
        "question": "q",
        "answer": 3,
        "answer_type": "arithmetic",
        "text": "x",
        "table": "a | b",
    }
    path.write_text(json.dumps([good, {**good, "question_id": "u", "answer_type": "guess"}]))
    with pytest.raises(ValueError, match=re.escape(f"{path} record 1: field 'answer_type' is 'guess'")):
        datasets.load_tatqa(tmp_path, "dev")
    path.write_text("[{")
    with pytest.raises(ValueError, match="line 1: invalid JSON"):
        datasets.load_tatqa(tmp_path, "dev")


def test_convfinqa_bad_record(tmp_path):
    path = tmp_path / "convfinqa" / "pot_convfinqa_dev.json"
    path.parent.mkdir()
    path.write_text(json.dumps([{"id": "c", "questions": [], "answer": 1.0, "text": "t", "table": "x"}]))
    with pytest.raises(ValueError, match=re.escape(f"{path} record 0: field 'questions' is an empty list")):
        datasets.load_convfinqa(tmp_path, "dev")


def test_example_validation():
    with pytest.raises(ValueError, match="answers must be a list of strings"):
        Example("x", "q", "a", "t")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="question must be a non-empty string"):
        Example("x", "", ["a"], "t")
    with pytest.raises(ValueError, match="where: field 'info' is missing"):
        Example.from_dict({"id": "x", "question": "q", "answers": ["a"], "task": "t"}, "where")


def test_registry_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown task 'hotpot'; known: arith-tools, kb-multihop"):
        load_task("hotpot")
    with pytest.raises(ValueError, match="task 'nq' has no split 'train'; available: dev, efficientqa"):
        load_task("nq", "train")
    with pytest.raises(ValueError, match="task 'nq' takes no options"):
        load_task("nq", answer_field="x")
    # An explicit data_dir never falls back to the samples.
    with pytest.raises(FileNotFoundError, match="lacks nq/NQ-open.dev.jsonl"):
        load_task("nq", data_dir=tmp_path)
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(ValueError, match="limit must be >= 0"):
        load_task(f"jsonl:{path}", limit=-1)


def test_jsonl_path_with_split_reads_one_file_per_split(tmp_path):
    """``jsonl:.../{split}.jsonl``: task.split and task.eval_split pick files; without it they were ignored, so a
    run's final "held-out" evaluation read its own training file."""
    from agentcredit.config import load_config
    from agentcredit.tasks import load_examples

    write_jsonl(tmp_path / "train.jsonl", [{"question": "train q", "answer": "1"}])
    write_jsonl(tmp_path / "test.jsonl", [{"question": "test q", "answer": "2"}])
    name = f"jsonl:{tmp_path}/{{split}}.jsonl"
    assert [ex.question for ex in load_task(name, "test")] == ["test q"]
    config = load_config(None, [f"task.name={name}", "task.split=train", "task.eval_split=test"])
    assert [ex.question for ex in load_examples(config)] == ["train q"]
    assert [ex.question for ex in load_examples(config, split=config.task.eval_split)] == ["test q"]
    with pytest.raises(ValueError, match="one file per split"):
        load_task(name)
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_task(name, "dev")
