"""BM25 search: corpus validation, Lucene BM25 scores by hand, formatting, caching, determinism, threads."""

from __future__ import annotations

import json
import logging
import math
import shutil
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.tools.search import (
    EMPTY_QUERY_TEXT,
    BM25Search,
    Passage,
    corpus_fingerprint,
    default_cache_dir,
    format_passages,
    passage_from_row,
    read_corpus,
    top_k,
)
from agentcredit.tools.search import bm25 as bm25_module

HOTPOT = (
    Path(__file__).resolve().parents[3]
    / "shared"
    / "data"
    / "corpora"
    / "hotpotqa_dev_pooled_paragraphs.jsonl"
)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def P(pid: str, text: str, title: str = "") -> Passage:
    return passage_from_row({"id": pid, "title": title, "text": text}, where="test", default_id=pid)


@pytest.fixture
def tiny() -> list[Passage]:
    # Lengths after analysis: 2, 3, 1 -> avgdl = 2 (the hand-worked numbers below use these).
    return [P("d0", "cat dog"), P("d1", "cat cat fish"), P("d2", "bird")]


@pytest.fixture
def index(tiny: list[Passage], tmp_path: Path) -> BM25Search:
    return BM25Search(tiny, cache_dir=tmp_path)


# ----------------------------------------------------------------------------------------- BM25 maths


def lucene_bm25(tf: int, df: int, n: int, dl: int, avgdl: float, k1: float = 0.9, b: float = 0.4) -> float:
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
    return idf * tf / (tf + k1 * (1 - b + b * dl / avgdl))


def test_scores_match_hand_worked_lucene_bm25(index: BM25Search) -> None:
    # "cat": df = 2 of N = 3, idf = ln(1.6) = 0.470004.
    # d1: tf = 2, dl = 3 -> 2 / (2 + 0.9 * 1.2) = 0.649351 -> 0.305197
    # d0: tf = 1, dl = 2 -> 1 / (1 + 0.9 * 1.0) = 0.526316 -> 0.247371
    hits = index.retrieve("cat", k=3)
    assert [h.passage.id for h in hits] == ["d1", "d0"]  # d2 has no "cat": no zero-score filler
    assert hits[0].score == pytest.approx(0.305197, abs=1e-5)
    assert hits[1].score == pytest.approx(0.247371, abs=1e-5)
    assert hits[0].score == pytest.approx(lucene_bm25(2, 2, 3, 3, 2.0), rel=1e-5)
    assert [h.rank for h in hits] == [1, 2]


def test_multi_term_query_sums_term_scores(index: BM25Search) -> None:
    # "bird": df = 1, idf = ln(1 + 2.5 / 1.5) = 0.980829; d2: dl = 1 -> 1 / (1 + 0.9 * 0.8) = 0.581395 -> 0.570249
    hits = index.retrieve("cat bird", k=3)
    assert [h.passage.id for h in hits] == ["d2", "d1", "d0"]
    assert hits[0].score == pytest.approx(0.570249, abs=1e-5)


def test_a_repeated_query_term_is_scored_once_with_its_count_as_weight(
    index: BM25Search, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each occurrence of a term was scored again: a 1 MiB query of one word read that word's postings 200,000
    # times (1 s on 3k passages, minutes on a large corpus; issue 52). Anserini's bag-of-words query (Pyserini,
    # Search-R1's BM25) scores each distinct term once, boosted by its count, and so does this now.
    # "cat cat cat bird": d1 = 3 x 0.305197 = 0.915591, d0 = 3 x 0.247371 = 0.742113, d2 = 0.570249 (above)
    hits = index.retrieve("cat cat bird cat", k=3)
    assert [h.passage.id for h in hits] == ["d1", "d0", "d2"]
    assert [h.score for h in hits] == pytest.approx([0.915591, 0.742113, 0.570249], abs=1e-5)
    read: list[int] = []  # term ids whose postings were read
    plain, weighted = index._bm25.get_scores_from_ids, getattr(bm25_module, "_weighted_scores", None)
    monkeypatch.setattr(index._bm25, "get_scores_from_ids", lambda ids: read.extend(ids) or plain(ids))
    monkeypatch.setattr(
        bm25_module, "_weighted_scores", lambda s, c: read.extend(c) or weighted(s, c), raising=False
    )
    assert [h.passage.id for h in index.retrieve("cats " * 200_000 + "bird", k=3)] == ["d1", "d0", "d2"]
    assert len(read) == 2


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(["cat", "dog", "fish", "bird", "zebra"]), min_size=1, max_size=12))
def test_weighted_scores_equal_scoring_every_occurrence(words: list[str]) -> None:
    index = BM25Search([P("d0", "cat dog"), P("d1", "cat cat fish"), P("d2", "bird")], use_cache=False)
    ids = index._bm25.get_tokens_ids(words)
    if ids:
        weighted = bm25_module._weighted_scores(index._bm25.scores, Counter(ids))
        np.testing.assert_allclose(weighted, index._bm25.get_scores_from_ids(ids), rtol=1e-6)


def test_analysis_stems_and_drops_stopwords(index: BM25Search) -> None:
    assert [h.passage.id for h in index.retrieve("the CATS", k=1)] == ["d1"]  # Porter: cats -> cat
    assert index.retrieve("the of and", k=3) == []  # only Lucene stopwords
    assert index.search("the of and") == "No search results found for the query 'the of and'."


def test_empty_query_and_no_hit_give_text_not_exceptions(index: BM25Search) -> None:
    assert index.retrieve("   ", k=3) == []
    assert index.search("") == EMPTY_QUERY_TEXT
    assert index.search("zebra") == "No search results found for the query 'zebra'."
    with pytest.raises(ValueError, match="k must be a positive integer"):
        index.retrieve("cat", k=0)
    with pytest.raises(TypeError, match="query must be a string"):
        index.retrieve(3, k=1)  # type: ignore[arg-type]


def test_k_larger_than_corpus_returns_all_matches(index: BM25Search) -> None:
    assert len(index.retrieve("cat bird fish dog", k=100)) == 3


def test_ties_break_by_corpus_order(tmp_path: Path) -> None:
    same = [P("x", "alpha beta"), P("y", "alpha beta"), P("z", "alpha beta")]
    hits = BM25Search(same, cache_dir=tmp_path).retrieve("alpha", k=2)
    assert [h.passage.id for h in hits] == ["x", "y"]
    assert hits[0].score == hits[1].score


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5]), min_size=1, max_size=30), st.integers(1, 10))
def test_top_k_equals_full_sort(scores: list[float], k: int) -> None:
    arr = np.asarray(scores, dtype=np.float32)
    expected = sorted((i for i in range(len(arr)) if arr[i] > 0), key=lambda i: (-arr[i], i))[:k]
    assert [i for i, _ in top_k(arr, k, positive_only=True)] == expected
    everything = sorted(range(len(arr)), key=lambda i: (-arr[i], i))[:k]
    assert [i for i, _ in top_k(arr, k, positive_only=False)] == everything


def test_batch_retrieve_matches_single_queries(index: BM25Search) -> None:
    queries = ["cat", "bird", "", "zebra"]
    assert index.batch_retrieve(queries, k=2) == [index.retrieve(q, k=2) for q in queries]
    texts = index.batch_search(queries, k=2)
    assert texts[2] == EMPTY_QUERY_TEXT and texts[3].startswith("No search results")
    with pytest.raises(TypeError):
        index.batch_retrieve("cat")  # a bare string is not a batch


def test_concurrent_queries_equal_sequential(index: BM25Search) -> None:
    queries = ["cat", "bird", "fish dog", "cats and birds", "zebra"] * 40
    sequential = [index.search(q, k=2) for q in queries]
    with ThreadPoolExecutor(max_workers=8) as pool:
        parallel = list(pool.map(lambda q: index.search(q, k=2), queries))
    assert parallel == sequential


# ----------------------------------------------------------------------------------------- formats


def test_format_styles_exact() -> None:
    a = passage_from_row({"id": "1", "title": "Alpha", "text": "first text"}, where="t", default_id="1")
    b = passage_from_row({"id": "2", "contents": '"Beta"\nsecond\ntext'}, where="t", default_id="2")
    assert format_passages([a, b]) == "Doc 1 (Title: Alpha) first text\nDoc 2 (Title: Beta) second\ntext"
    # Search-R1 generation.py::_passages2string: no space before "(", quoted wiki-18 title, "\n" after each.
    assert (
        format_passages([a, b], "search-r1")
        == 'Doc 1(Title: "Alpha") first text\nDoc 2(Title: "Beta") second\ntext\n'
    )
    # verl search_r1_like_utils._passages2string: title line, text on the next line, blank line between docs.
    assert (
        format_passages([a, b], "verl")
        == 'Doc 1 (Title: "Alpha")\nfirst text\n\nDoc 2 (Title: "Beta")\nsecond\ntext'
    )
    with pytest.raises(ValueError, match="unknown format style"):
        format_passages([a], "html")  # type: ignore[arg-type]


def test_search_returns_formatted_top_k(index: BM25Search) -> None:
    assert index.search("cat", k=2) == "Doc 1 (Title: ) cat cat fish\nDoc 2 (Title: ) cat dog"
    assert index("cat", 1) == "Doc 1 (Title: ) cat cat fish"  # the retriever is carl-segment's search(query)


def test_as_tool_accepts_query_and_verl_query_list(index: BM25Search) -> None:
    tool = index.as_tool(k=1)
    assert tool({"query": "bird"}) == "Doc 1 (Title: ) bird"
    assert tool({"query_list": ["bird", "fish"]}) == "Doc 1 (Title: ) bird\n---\nDoc 1 (Title: ) cat cat fish"
    assert tool({"query_list": []}).startswith("ERROR:")
    assert tool({"q": "bird"}).startswith("ERROR:")


def test_by_title_is_case_insensitive_page_lookup(tmp_path: Path) -> None:
    idx = BM25Search([P("1", "x y", "Kiss and Tell"), P("2", "z", "Other")], cache_dir=tmp_path)
    assert [p.id for p in idx.by_title("kiss AND tell ")] == ["1"]
    assert idx.by_title("missing") == []


# ----------------------------------------------------------------------------------------- corpus files


def test_read_corpus_both_formats_and_blank_lines(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "c.jsonl",
        [
            {"id": "a", "title": "T1", "text": "one", "question_ids": ["q1"]},
            "",
            {"id": 7, "contents": '"T2"\nline one\nline two'},
            {"title": "T3", "text": "three"},
        ],
    )
    ps = read_corpus(path)
    assert [(p.id, p.title, p.text) for p in ps] == [
        ("a", "T1", "one"),
        ("7", "T2", "line one\nline two"),
        ("2", "T3", "three"),
    ]
    assert ps[0].contents == '"T1"\none' and ps[0].extra == {"question_ids": ["q1"]}
    assert ps[1].to_document() == {
        "id": "7",
        "title": "T2",
        "text": "line one\nline two",
        "contents": '"T2"\nline one\nline two',
    }


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (['{"id": "a", "text": "x"}', "{not json"], r"c\.jsonl:2: invalid JSON"),
        ([{"id": "a", "title": "t"}], r"c\.jsonl:1: missing field 'text'"),
        ([{"id": "a"}], r"c\.jsonl:1: missing field 'text'"),
        ([{"id": "a", "text": 5}], r"c\.jsonl:1: field 'text' must be a string, got int"),
        ([{"id": True, "text": "x"}], r"c\.jsonl:1: field 'id' must be a string or an integer"),
        (
            [{"id": "a", "title": " ", "text": ""}],
            r"c\.jsonl:1: passage 'a' has an empty title and an empty text",
        ),
        (
            [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}],
            r"c\.jsonl:2: duplicate passage id 'a' \(first seen on line 1\)",
        ),
        (['["a", "b"]'], r"c\.jsonl:1: this looks like a JSON array"),
        (["[1]", "[2]"], r"c\.jsonl:1: this looks like a JSON array"),
        (['"just a string"'], r"c\.jsonl:1: expected a JSON object"),
        ([""], r"c\.jsonl: the corpus has no passages"),
    ],
)
def test_bad_rows_name_file_line_and_field(tmp_path: Path, rows: list, message: str) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    with pytest.raises(ValueError, match=message):
        read_corpus(path)


def test_non_utf8_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "c.jsonl"
    bad.write_bytes(b'{"id": "a", "text": "ok"}\n{"id": "b", "text": "\xff"}\n')
    with pytest.raises(ValueError, match=r"c\.jsonl:2: not valid UTF-8"):
        read_corpus(bad)
    with pytest.raises(FileNotFoundError, match="corpus file not found"):
        read_corpus(tmp_path / "nope.jsonl")


def test_constructor_validation(tiny: list[Passage], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one passage"):
        BM25Search([], cache_dir=tmp_path)
    with pytest.raises(ValueError, match="duplicate passage id 'd0'"):
        BM25Search([*tiny, tiny[0]], cache_dir=tmp_path)
    with pytest.raises(ValueError, match="k1 >= 0 and 0 <= b <= 1"):
        BM25Search(tiny, b=1.5, cache_dir=tmp_path)


# ----------------------------------------------------------------------------------------- cache


def test_index_is_cached_by_corpus_content(tiny: list[Passage], tmp_path: Path) -> None:
    first = BM25Search(tiny, cache_dir=tmp_path)
    assert (
        not first.from_cache and first.cache_path is not None and (first.cache_path / "meta.json").is_file()
    )
    second = BM25Search(tiny, cache_dir=tmp_path)
    assert second.from_cache and second.cache_path == first.cache_path
    assert second.retrieve("cat bird", 3) == first.retrieve("cat bird", 3)
    edited = [*tiny[:2], P("d2", "bird bird")]
    third = BM25Search(edited, cache_dir=tmp_path)
    assert not third.from_cache and third.cache_path != first.cache_path
    assert corpus_fingerprint(edited) != corpus_fingerprint(tiny)
    other_params = BM25Search(tiny, k1=1.2, cache_dir=tmp_path)
    assert not other_params.from_cache and other_params.cache_path != first.cache_path


def test_corrupt_cache_is_rebuilt(
    tiny: list[Passage], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = BM25Search(tiny, cache_dir=tmp_path)
    assert first.cache_path is not None
    (first.cache_path / "params.index.json").write_text("{broken")
    with caplog.at_level(logging.WARNING):
        again = BM25Search(tiny, cache_dir=tmp_path)
    assert not again.from_cache and "rebuilding" in caplog.text
    assert again.retrieve("cat", 2) == first.retrieve("cat", 2)
    assert BM25Search(tiny, cache_dir=tmp_path).from_cache  # the rebuilt cache is good


def test_no_temporary_directories_left(tiny: list[Passage], tmp_path: Path) -> None:
    BM25Search(tiny, cache_dir=tmp_path)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_cache_dir_follows_agentcredit_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny: list[Passage]
) -> None:
    monkeypatch.setenv("AGENTCREDIT_HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / "index"
    idx = BM25Search(tiny)
    assert idx.cache_path is not None and idx.cache_path.parent == tmp_path / "home" / "index"
    monkeypatch.delenv("AGENTCREDIT_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "agentcredit" / "index"


def test_unwritable_cache_dir_still_works(tiny: list[Passage], tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    idx = BM25Search(tiny, cache_dir=blocker / "sub")
    assert [h.passage.id for h in idx.retrieve("cat", 1)] == ["d1"]


def test_from_jsonl_and_no_cache(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "title": "Paris", "text": "capital of France"}])
    idx = BM25Search.from_jsonl(path, use_cache=False)
    assert idx.cache_path is None and idx.search("france capital") == "Doc 1 (Title: Paris) capital of France"
    shutil.rmtree(tmp_path / "nothing", ignore_errors=True)


# ----------------------------------------------------------------------------------------- real data


@pytest.fixture(scope="module")
def hotpot(tmp_path_factory: pytest.TempPathFactory) -> BM25Search:
    if not HOTPOT.is_file():
        pytest.skip("shared HotpotQA corpus not available")
    return BM25Search.from_jsonl(HOTPOT, cache_dir=tmp_path_factory.mktemp("index"))


def test_hotpotqa_corpus_retrieves_the_supporting_passage(hotpot: BM25Search) -> None:
    assert len(hotpot) == 8396
    hits = hotpot.retrieve("Corliss Archer in the film Kiss and Tell", k=3)
    assert hits[0].passage.title == "Kiss and Tell (1945 film)"
    assert "Shirley Temple" in hits[0].passage.text
