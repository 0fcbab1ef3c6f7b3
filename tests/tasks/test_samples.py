"""The package samples: the fallback without ../shared, their corpora, size budget, notice and freshness."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentcredit.tasks import SampleDataWarning, load_task, task_corpus
from agentcredit.tasks.paths import PACKAGE_DIR, SAMPLES_DIR
from agentcredit.tasks.registry import TASKS

REPO = PACKAGE_DIR.parent
SHIPPED = {
    ("gsm8k", "test"): 200,
    ("gsm8k", "train"): 200,
    ("hotpotqa", "dev"): 200,
    ("musique", "dev"): 100,
    ("2wiki", "dev"): 100,
    ("bamboogle", "test"): 125,
    ("nq", "dev"): 200,
    ("deepresearcher", "test"): 175,
    ("convfinqa", "dev"): 50,
    ("tatqa", "dev"): 100,
}


@pytest.mark.parametrize(("name", "split"), sorted(SHIPPED))
def test_fallback_to_samples_without_shared_data(samples_only, name, split):
    with pytest.warns(SampleDataWarning, match=f"{name}/{split}: loading the small package sample because"):
        examples = load_task(name, split)
    assert len(examples) == SHIPPED[name, split]
    assert len({ex.id for ex in examples}) == len(examples)
    assert all(ex.task == name and ex.info["from_sample"] and ex.answers for ex in examples)


def test_every_real_task_default_split_has_a_sample():
    for name, spec in TASKS.items():
        if spec.loader is not None:
            assert (name, spec.default_split) in SHIPPED, name


def test_limit_and_seed_apply_to_samples(samples_only):
    with pytest.warns(SampleDataWarning):
        a = load_task("hotpotqa", limit=20, seed=1)
    with pytest.warns(SampleDataWarning):
        b = load_task("hotpotqa", limit=20, seed=1)
    assert len(a) == 20 and [ex.id for ex in a] == [ex.id for ex in b]


def test_fallback_when_no_data_folder_exists_at_all(monkeypatch, temp_home):
    # As in an installed package: no $AGENTCREDIT_DATA and no ../shared/data.
    monkeypatch.delenv("AGENTCREDIT_DATA", raising=False)
    monkeypatch.setattr("agentcredit.tasks.registry.data_root", lambda: None)
    with pytest.warns(SampleDataWarning, match="no data folder was found"):
        assert len(load_task("bamboogle")) == 125
    assert task_corpus("2wiki").is_relative_to(temp_home)


def test_split_without_a_sample_is_a_clear_error(samples_only):
    with pytest.raises(FileNotFoundError, match="'nq' split 'efficientqa'.*lacks.*ships no sample"):
        load_task("nq", "efficientqa")


def test_missing_data_dir_env_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTCREDIT_DATA", str(tmp_path / "typo"))
    with pytest.raises(ValueError, match="AGENTCREDIT_DATA=.*typo is not a directory"):
        load_task("nq")


@pytest.mark.parametrize("name", ["hotpotqa", "musique", "2wiki"])
def test_sample_corpus_holds_every_supporting_passage(samples_only, name):
    with pytest.warns(SampleDataWarning):
        examples = load_task(name)
    path = task_corpus(name)
    assert path.suffix == ".jsonl" and path.is_relative_to(samples_only.parent / "home")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert all(set(r) == {"id", "title", "text"} for r in rows)
    assert len({r["id"] for r in rows}) == len(rows)
    titles = {r["title"] for r in rows}
    for ex in examples:
        assert set(ex.info["supporting_titles"]) <= titles, ex.id
    mtime = path.stat().st_mtime_ns
    assert task_corpus(name) == path and path.stat().st_mtime_ns == mtime  # unpacked once


def test_tasks_without_retrieval_have_no_corpus(samples_only):
    for name in ("gsm8k", "nq", "bamboogle", "deepresearcher", "convfinqa", "tatqa", "arith-tools"):
        assert task_corpus(name) is None


def test_size_budget_and_notice():
    files = sorted(p for p in SAMPLES_DIR.rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in files)
    assert total < 3 * 1024 * 1024, total
    notice = (SAMPLES_DIR / "NOTICE.md").read_text(encoding="utf-8")
    for name, split in SHIPPED:
        line = next(line for line in notice.splitlines() if f"`{name}-{split}.jsonl.gz`" in line)
        assert f"| {SHIPPED[name, split]} |" in line
    assert {p.name for p in files if p.parent == SAMPLES_DIR} == {f"{n}-{s}.jsonl.gz" for n, s in SHIPPED} | {
        "NOTICE.md"
    }
    assert {p.name for p in (SAMPLES_DIR / "corpora").iterdir()} == {
        "hotpotqa.jsonl.gz",
        "musique.jsonl.gz",
        "2wiki.jsonl.gz",
    }
    for licence in ("CC BY-SA 4.0", "CC BY 4.0", "CC BY-SA 3.0", "MIT", "Apache-2.0"):
        assert licence in notice


def test_builder_reproduces_the_shipped_samples(shared_data, tmp_path):
    out = tmp_path / "samples"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "make_samples.py"),
            "--data",
            str(shared_data),
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    rebuilt = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    shipped = {p.relative_to(SAMPLES_DIR): p.read_bytes() for p in SAMPLES_DIR.rglob("*") if p.is_file()}
    assert rebuilt.keys() == shipped.keys()
    stale = [str(k) for k in rebuilt if rebuilt[k] != shipped[k]]
    assert stale == [], "run scripts/make_samples.py to refresh the package samples"


def test_samples_match_the_real_examples(shared_data, samples_only):
    real = {ex.id: ex for ex in load_task("musique", data_dir=shared_data)}
    with pytest.warns(SampleDataWarning):
        sampled = load_task("musique")
    for ex in sampled:
        info = dict(ex.info)
        info.pop("from_sample")
        assert (ex.question, ex.answers, info) == (
            real[ex.id].question,
            real[ex.id].answers,
            real[ex.id].info,
        )


def test_samples_dir_is_inside_the_package():
    assert SAMPLES_DIR.is_relative_to(PACKAGE_DIR)
    assert Path(SAMPLES_DIR / "NOTICE.md").is_file()


def test_holdout_parts_partition_a_split():
    from agentcredit.tasks import load_task

    whole = load_task("hotpotqa", split="dev")
    train = load_task("hotpotqa", split="dev@train")
    held = load_task("hotpotqa", split="dev@heldout")
    assert {e.id for e in train} | {e.id for e in held} == {e.id for e in whole}
    assert not {e.id for e in train} & {e.id for e in held}
    assert 0.1 < len(held) / len(whole) < 0.3
    with pytest.raises(ValueError, match="after '@'"):
        load_task("hotpotqa", split="dev@oops")
