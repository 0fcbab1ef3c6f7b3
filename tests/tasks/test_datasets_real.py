"""Every loader on the real files of ../shared/data (skipped when they are absent)."""

import json
from collections import Counter

import pytest

from agentcredit.tasks import load_task, score, task_corpus
from agentcredit.tasks.registry import TASKS

# Counts from shared/data/README.md.
EXPECTED = {
    ("gsm8k", "train"): 7473,
    ("gsm8k", "test"): 1319,
    ("hotpotqa", "dev"): 868,
    ("hotpotqa", "dev_full"): 7405,
    ("musique", "dev"): 200,
    ("2wiki", "dev"): 164,
    ("2wiki", "dev_all"): 200,
    ("bamboogle", "test"): 125,
    ("nq", "dev"): 3610,
    ("nq", "efficientqa"): 1800,
    ("deepresearcher", "test"): 3197,
    ("deepresearcher", "dev"): 875,
    ("convfinqa", "dev"): 421,
    ("tatqa", "dev"): 1668,
}


def test_every_real_split_is_covered():
    real = {(name, split) for name, spec in TASKS.items() if spec.loader for split in spec.splits}
    assert real == set(EXPECTED)


@pytest.mark.parametrize(("name", "split"), sorted(EXPECTED))
def test_loader_counts_and_invariants(shared_data, name, split):
    examples = load_task(name, split, data_dir=shared_data)
    assert len(examples) == EXPECTED[name, split]
    assert len({ex.id for ex in examples}) == len(examples)
    for ex in examples:
        assert ex.task == name
        assert ex.question.strip() and ex.answers and all(a.strip() for a in ex.answers)
        assert "from_sample" not in ex.info
        # Each gold scores 1 against itself under the task's metric (so the metric fits the gold's form).
        assert score(ex.answers[0], ex.answers, metric=ex.metric) == 1.0


def _corpus(path):
    return [json.loads(line) for line in path.open(encoding="utf-8")]


@pytest.mark.parametrize("name", ["hotpotqa", "musique", "2wiki"])
def test_supporting_passages_are_in_the_corpus(shared_data, name):
    examples = load_task(name, data_dir=shared_data)
    corpus_path = task_corpus(name, data_dir=shared_data)
    assert corpus_path == shared_data / TASKS[name].corpus
    rows = _corpus(corpus_path)
    assert all({"id", "title", "text"} <= set(r) for r in rows)
    titles = {r["title"] for r in rows}
    covered = {str(q) for r in rows for q in r["question_ids"]}
    for ex in examples:
        assert ex.id in covered
        assert ex.info["supporting_titles"], ex.id
        assert set(ex.info["supporting_titles"]) <= titles, ex.id
        assert len(ex.info["supporting_passages"]) == len(ex.info["supporting_titles"])


def test_gsm8k_gold_is_the_number_after_hashes(shared_data):
    first = load_task("gsm8k", "test", data_dir=shared_data)[0]
    assert first.id == "gsm8k-test-1"
    assert first.answers == ["18"]
    assert first.question.startswith("Janet’s ducks lay 16 eggs per day.")
    assert first.info["solution"].endswith("#### 18")
    assert score("She makes $18.00 every day", first.answers, metric=first.metric) == 1.0
    train = load_task("gsm8k", "train", data_dir=shared_data)
    assert any("," in ex.answers[0] for ex in train)  # e.g. "1,080": commas kept, numeric metric copes


def test_hotpotqa_record_from_readme(shared_data):
    examples = {ex.id: ex for ex in load_task("hotpotqa", data_dir=shared_data)}
    ircot = examples["5a8c7595554299585d9e36b6"]
    assert ircot.answers == ["Chief of Protocol"]
    assert ircot.info["supporting_titles"] == ["Shirley Temple", "Kiss and Tell (1945 film)"]
    assert ircot.info["supporting_passages"][0]["text"].startswith("Shirley Temple Black (April 23, 1928")
    aflow = examples["5a7613c15542994ccc9186bf"]
    assert aflow.answers == ["Gesellschaft mit beschränkter Haftung"]
    assert aflow.info["supporting_titles"] == ["VIVA Media", "Gesellschaft mit beschränkter Haftung"]
    assert "37" in examples  # integer ids in the AFlow file become strings
    assert (
        Counter(ex.info["source"] for ex in examples.values())["hotpotqa/ircot_dev_subsampled_500.jsonl"]
        == 500
    )


def test_musique_hops_and_aliases(shared_data):
    examples = load_task("musique", data_dir=shared_data)
    assert Counter(ex.info["hops"] for ex in examples) == {2: 145, 3: 32, 4: 23}  # README's hop mix
    first = examples[0]
    assert first.id == "2hop__574419_270105" and first.answers == ["Stanley"]
    assert any(len(ex.answers) > 1 for ex in examples)  # answer_aliases are merged in


def test_2wiki_context_split(shared_data):
    everything = load_task("2wiki", "dev_all", data_dir=shared_data)
    assert Counter(ex.info["has_context"] for ex in everything) == {True: 164, False: 36}
    no_context = next(ex for ex in everything if not ex.info["has_context"])
    assert no_context.info["supporting_titles"]  # parsed from the string-encoded list


def test_deepresearcher_sources(shared_data):
    examples = load_task("deepresearcher", "test", data_dir=shared_data)
    counts = Counter(ex.info["data_source"] for ex in examples)
    assert counts == {s: 512 for s in ("nq", "tq", "hotpotqa", "2wiki", "musique", "popqa")} | {
        "Bamboogle": 125
    }


def test_finance_questions_carry_table_and_text(shared_data):
    conv = load_task("convfinqa", data_dir=shared_data)
    first = conv[0]
    assert first.id == "Single_MRO/2007/page_134.pdf-1"
    assert first.answers == ["1.42403"] and first.metric == "finqa"
    assert "Table:\n- | 2007 | 2006 | 2005" in first.question
    assert "Earlier questions in this conversation:" in first.question
    assert first.question.endswith(
        "Question: and how much does that change represent in relation to this 2005 weighted average exercise price?"
    )
    assert Counter(ex.metric for ex in conv) == {"finqa": 418, "em": 3}  # three yes/no answers
    tatqa = load_task("tatqa", data_dir=shared_data)
    assert Counter(ex.info["answer_type"] for ex in tatqa) == {
        "arithmetic": 718,
        "span": 701,
        "multi-span": 217,
        "count": 32,
    }
    multi = next(ex for ex in tatqa if ex.info["answer_type"] == "multi-span")
    assert multi.answers == ["fixed-price type, cost-plus type, time-and-material type"]
    assert multi.metric == "f1"


def test_nq_and_bamboogle(shared_data):
    nq = load_task("nq", data_dir=shared_data)
    assert nq[0].answers == ["14 December 1972 UTC", "December 1972"]
    bamboogle = load_task("bamboogle", data_dir=shared_data)
    assert bamboogle[0].id == "bamboogle-1" and bamboogle[0].answers == ["james madison"]
    # Full dates, not the spreadsheet-mangled "29-May-32" of the FireAct CSV copy.
    assert any(ex.answers == ["May 29, 1932"] for ex in bamboogle)


def test_limit_is_a_seeded_subset_in_file_order(shared_data):
    full = load_task("nq", data_dir=shared_data)
    order = {ex.id: i for i, ex in enumerate(full)}
    a = load_task("nq", limit=50, seed=3, data_dir=shared_data)
    b = load_task("nq", limit=50, seed=3, data_dir=shared_data)
    c = load_task("nq", limit=50, seed=4, data_dir=shared_data)
    assert [ex.id for ex in a] == [ex.id for ex in b]
    assert [ex.id for ex in a] != [ex.id for ex in c]
    positions = [order[ex.id] for ex in a]
    assert positions == sorted(positions)
    assert len(load_task("bamboogle", limit=10_000, data_dir=shared_data)) == 125


def test_default_root_is_shared_data(shared_data, monkeypatch):
    monkeypatch.delenv("AGENTCREDIT_DATA", raising=False)
    examples = load_task("bamboogle")
    assert len(examples) == 125 and "from_sample" not in examples[0].info
    assert task_corpus("musique") == shared_data / "corpora" / "musique_dev200_pooled_paragraphs.jsonl"
