"""BM25 search over a JSONL passage corpus: carl-segment's ``search()``, Search-R1's retriever, PORTool's
``knowledge_search``.

Scoring is ``bm25s`` with Lucene's BM25 (idf = ln(1 + (N - df + 0.5) / (df + 0.5)), tf part = tf / (tf + k1 (1 -
b + b |d| / avgdl))) and Pyserini's defaults k1 = 0.9, b = 0.4 (carl-segment.md A17). Text analysis follows
Lucene's English analyzer: lower-case, word tokens, Lucene's 33 English stopwords, Porter stemming.

The index is built once per corpus and cached on disk (``$AGENTCREDIT_HOME/index``, default
``~/.cache/agentcredit/index``), keyed by a hash of the parsed corpus content and the analysis settings, so an
edited corpus never reuses a stale index. Queries only read the index, so one instance serves many threads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bm25s
import numpy as np
import Stemmer
from bm25s.stopwords import STOPWORDS_EN

from agentcredit.tools.search.base import (
    Passage,
    RetrieverBase,
    check_unique_ids,
    corpus_fingerprint,
    default_cache_dir,
    index_text,
    read_corpus,
)

log = logging.getLogger(__name__)

# Pyserini's BM25 defaults, used by carl-segment (spec A17) and Search-R1's BM25 index.
DEFAULT_K1 = 0.9
DEFAULT_B = 0.4
# Bump when the analysis or the on-disk layout changes, so old caches are never read.
_INDEX_FORMAT = 1
_TOKEN_PATTERN = re.compile(r"(?u)\b\w+\b")
_STEMMER_ALGORITHM = (
    "porter"  # Lucene's PorterStemFilter is Porter's original algorithm, not Snowball's "english"
)


class _Analyzer:
    """Lucene-English-like analysis. PyStemmer objects are not thread-safe, so each thread gets its own."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._stop = frozenset(STOPWORDS_EN)

    def _stemmer(self) -> Stemmer.Stemmer:
        stemmer = getattr(self._local, "stemmer", None)
        if stemmer is None:
            stemmer = self._local.stemmer = Stemmer.Stemmer(_STEMMER_ALGORITHM)
        return stemmer

    def __call__(self, text: str) -> list[str]:
        words = [w for w in _TOKEN_PATTERN.findall(text.lower()) if w not in self._stop]
        return self._stemmer().stemWords(words) if words else []

    @staticmethod
    def settings() -> dict[str, Any]:
        return {
            "pattern": _TOKEN_PATTERN.pattern,
            "stopwords": sorted(STOPWORDS_EN),
            "stemmer": _STEMMER_ALGORITHM,
            "lower": True,
        }


class BM25Search(RetrieverBase):
    """BM25 over passages, built with ``bm25s`` and cached on disk.

    >>> index = BM25Search.from_jsonl("corpus.jsonl")  # doctest: +SKIP
    >>> print(index.search("who portrayed Corliss Archer", k=3))  # doctest: +SKIP
    """

    def __init__(
        self,
        passages: Sequence[Passage],
        *,
        k1: float = DEFAULT_K1,
        b: float = DEFAULT_B,
        cache_dir: str | os.PathLike[str] | None = None,
        use_cache: bool = True,
    ):
        if not passages:
            raise ValueError("BM25Search needs at least one passage")
        if k1 < 0 or not 0 <= b <= 1:
            raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        check_unique_ids(passages)
        self.passages = list(passages)
        self.k1, self.b = float(k1), float(b)
        self._analyzer = _Analyzer()
        self._init_titles()
        self.fingerprint = corpus_fingerprint(self.passages)
        self.cache_path: Path | None = None
        self.from_cache = False
        start = time.perf_counter()
        if use_cache:
            self.cache_path = Path(cache_dir) if cache_dir is not None else default_cache_dir()
            self.cache_path = self.cache_path / f"bm25-{self._cache_key()[:32]}"
            self._bm25 = self._load_or_build(self.cache_path)
        else:
            self._bm25 = self._build()
        self.build_seconds = time.perf_counter() - start

    @classmethod
    def from_jsonl(
        cls,
        path: str | os.PathLike[str],
        *,
        k1: float = DEFAULT_K1,
        b: float = DEFAULT_B,
        cache_dir: str | os.PathLike[str] | None = None,
        use_cache: bool = True,
    ) -> BM25Search:
        return cls(read_corpus(path), k1=k1, b=b, cache_dir=cache_dir, use_cache=use_cache)

    # -- index lifecycle

    def _cache_key(self) -> str:
        settings = {
            "format": _INDEX_FORMAT,
            "corpus": self.fingerprint,
            "k1": self.k1,
            "b": self.b,
            "method": "lucene",
            "analysis": _Analyzer.settings(),
        }
        return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()

    def _build(self) -> bm25s.BM25:
        tokens = [self._analyzer(index_text(p)) for p in self.passages]
        model = bm25s.BM25(k1=self.k1, b=self.b, method="lucene")
        model.index(tokens, show_progress=False)
        return model

    def _load_or_build(self, path: Path) -> bm25s.BM25:
        if (path / "meta.json").is_file():
            try:
                model = bm25s.BM25.load(str(path), show_progress=False)
                meta = json.loads((path / "meta.json").read_text())
                if model.scores["num_docs"] == len(self.passages) and meta.get("corpus") == self.fingerprint:
                    self.from_cache = True
                    return model
                log.warning("index cache %s does not match the corpus; rebuilding it", path)
            except (OSError, ValueError, KeyError) as exc:
                log.warning("index cache %s is unreadable (%s); rebuilding it", path, exc)
            shutil.rmtree(path, ignore_errors=True)
        model = self._build()
        self._save(model, path)
        return model

    def _save(self, model: bm25s.BM25, path: Path) -> None:
        # Write into a private temporary directory, then rename: a concurrent reader never sees half an index,
        # and when two processes build the same index at once the loser just discards its copy.
        tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            model.save(str(tmp), show_progress=False)
            meta = {"corpus": self.fingerprint, "passages": len(self.passages), "k1": self.k1, "b": self.b}
            (tmp / "meta.json").write_text(json.dumps(meta))
            try:
                os.rename(tmp, path)
            except OSError:
                if not (path / "meta.json").is_file():
                    raise
        except OSError as exc:
            log.warning("could not write the index cache to %s (%s); continuing without a cache", path, exc)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    # -- scoring

    def _scores(self, query: str) -> np.ndarray | None:
        ids = self._bm25.get_tokens_ids(self._analyzer(query))
        if not ids:
            return None
        counts = Counter(ids)
        if len(counts) == len(ids):  # no term repeats (nearly every query): bm25s's own scoring
            return self._bm25.get_scores_from_ids(ids)
        return _weighted_scores(self._bm25.scores, counts)


def _weighted_scores(index: dict[str, Any], counts: Counter[int]) -> np.ndarray:
    """sum over distinct terms t of count(t) x score(t, d), reading each term's postings once.

    bm25s scores a term once per occurrence, so a query's cost grew with its length (a 1 MiB query of one word
    read that word's postings 200,000 times); this is at most one pass over the index whatever the query. The
    count as a weight is Anserini's bag-of-words query (Pyserini and Search-R1's BM25): the same ranking as
    scoring every occurrence, in one step.
    """
    indptr, indices, data = index["indptr"], index["indices"], index["data"]
    terms = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
    weights = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
    starts, lengths = indptr[terms], indptr[terms + 1] - indptr[terms]
    offsets = np.cumsum(lengths) - lengths  # where each term's postings start in the gathered arrays
    positions = np.arange(lengths.sum()) - np.repeat(offsets - starts, lengths)
    contributions = data[positions] * np.repeat(weights, lengths)
    return np.bincount(indices[positions], contributions, minlength=index["num_docs"]).astype(data.dtype)
