"""BM25 search over a JSONL passage corpus: carl-segment's ``search()``, Search-R1's retriever, PORTool's
``knowledge_search``.

Corpus rows are ``{"id", "title", "text"}`` (extra fields are kept as metadata) or Search-R1's
``{"id", "contents"}`` where ``contents`` is ``"<title>"\\n<text>``. Scoring is ``bm25s`` with Lucene's BM25
(idf = ln(1 + (N - df + 0.5) / (df + 0.5)), tf part = tf / (tf + k1 (1 - b + b |d| / avgdl))) and Pyserini's
defaults k1 = 0.9, b = 0.4 (carl-segment spec A17). Text analysis follows Lucene's English analyzer: lower-case,
word tokens, Lucene's 33 English stopwords, Porter stemming.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import bm25s
import numpy as np
import Stemmer
from bm25s.stopwords import STOPWORDS_EN

from agentcredit.tools.base import ToolFn, unavailable

log = logging.getLogger(__name__)

# Pyserini's BM25 defaults, used by carl-segment (spec A17) and Search-R1's BM25 index.
DEFAULT_K1 = 0.9
DEFAULT_B = 0.4
DEFAULT_TOPK = 3
# Bump when the analysis or the on-disk layout changes, so old caches are never read.
_INDEX_FORMAT = 1
_TOKEN_PATTERN = re.compile(r"(?u)\b\w+\b")
_STEMMER_ALGORITHM = (
    "porter"  # Lucene's PorterStemFilter is Porter's original algorithm, not Snowball's "english"
)

FormatStyle = Literal["default", "search-r1", "verl"]


def default_cache_dir() -> Path:
    """Where indexes live: ``$AGENTCREDIT_HOME/index``, or ``~/.cache/agentcredit/index``."""
    home = os.environ.get("AGENTCREDIT_HOME")
    base = Path(home).expanduser() if home else Path.home() / ".cache" / "agentcredit"
    return base / "index"


@dataclass(frozen=True)
class Passage:
    """One retrievable passage. ``contents`` is the Search-R1 form (``"<title>"\\n<text>``) served over HTTP."""

    id: str
    title: str
    text: str
    contents: str
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_document(self) -> dict[str, Any]:
        """The document dict of Search-R1's retrieval server: id, title, text, contents (+ extra fields)."""
        return {
            **self.extra,
            "id": self.id,
            "title": self.title,
            "text": self.text,
            "contents": self.contents,
        }


@dataclass(frozen=True)
class Hit:
    """A retrieved passage with its score and 1-based rank."""

    passage: Passage
    score: float
    rank: int


# --------------------------------------------------------------------------------------------- corpus


def passage_from_row(row: Any, *, where: str, default_id: str) -> Passage:
    """Validate one corpus row. ``where`` ("file:line") prefixes every error so the user can find the row."""
    if not isinstance(row, dict):
        raise ValueError(
            f"{where}: expected a JSON object with fields id, title, text (or id, contents), "
            f"got {type(row).__name__}"
        )
    if "id" in row:
        raw_id = row["id"]
        if isinstance(raw_id, bool) or not isinstance(raw_id, str | int):
            raise ValueError(
                f"{where}: field 'id' must be a string or an integer, got {type(raw_id).__name__}"
            )
        pid = str(raw_id)
    else:
        pid = default_id
    for name in ("title", "text", "contents"):
        if name in row and not isinstance(row[name], str):
            raise ValueError(f"{where}: field {name!r} must be a string, got {type(row[name]).__name__}")
    if "text" in row:
        title, text = row.get("title", ""), row["text"]
        # Search-R1's wiki-18 quotes the title on the first line of contents; we write the same form so
        # clients that parse contents (Search-R1, verl) render our passages exactly like theirs.
        contents = row.get("contents", f'"{title}"\n{text}')
    elif "contents" in row:
        contents = row["contents"]
        first, _, rest = contents.partition("\n")
        title, text = first.strip().strip('"'), rest
    elif "title" in row:
        raise ValueError(f"{where}: missing field 'text' (a passage needs 'text', or Search-R1's 'contents')")
    else:
        raise ValueError(f"{where}: missing field 'text' (expected fields id, title, text, or id, contents)")
    if not title.strip() and not text.strip():
        raise ValueError(f"{where}: passage {pid!r} has an empty title and an empty text; nothing to index")
    extra = {k: v for k, v in row.items() if k not in ("id", "title", "text", "contents")}
    return Passage(id=pid, title=title, text=text, contents=contents, extra=extra)


def read_corpus(path: str | os.PathLike[str]) -> list[Passage]:
    """Read a JSONL corpus. Blank lines are skipped; any bad row raises ValueError naming file, line and field."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    passages: list[Passage] = []
    first_line: dict[str, int] = {}
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{where}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
            if not line.strip():
                continue
            if lineno == 1 and line.lstrip().startswith("["):
                raise ValueError(
                    f"{where}: this looks like a JSON array; a corpus is JSONL (one passage object per line)"
                )
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
            passage = passage_from_row(row, where=where, default_id=str(len(passages)))
            if passage.id in first_line:
                raise ValueError(
                    f"{where}: duplicate passage id {passage.id!r} (first seen on line {first_line[passage.id]})"
                )
            first_line[passage.id] = lineno
            passages.append(passage)
    if not passages:
        raise ValueError(f"{path}: the corpus has no passages")
    return passages


def corpus_fingerprint(passages: Sequence[Passage]) -> str:
    """sha256 of the parsed corpus (ids, titles, texts, contents, in order): the cache key of every index."""
    digest = hashlib.sha256()
    for p in passages:
        digest.update(json.dumps([p.id, p.title, p.text, p.contents], ensure_ascii=False).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def _check_unique_ids(passages: Sequence[Passage]) -> None:
    seen: set[str] = set()
    for i, p in enumerate(passages):
        if p.id in seen:
            raise ValueError(f"passages[{i}]: duplicate passage id {p.id!r}")
        seen.add(p.id)


# --------------------------------------------------------------------------------------------- formatting


def format_passages(hits: Sequence[Hit | Passage], style: FormatStyle = "default") -> str:
    """Render retrieved passages for the model.

    * ``default``: ``Doc 1 (Title: <title>) <text>`` lines joined by newlines (carl-segment spec, R).
    * ``search-r1``: Search-R1's ``_passages2string`` exactly: ``Doc 1(Title: <first line of contents>) <rest>``
      with a newline after each (note: no space before the parenthesis, quoted wiki-18 titles).
    * ``verl``: verl's ``search_r1_like_utils._passages2string``: ``Doc 1 (Title: <first line>)\\n<rest>``
      joined by blank lines.
    """
    passages = [h.passage if isinstance(h, Hit) else h for h in hits]
    if style == "default":
        return "\n".join(f"Doc {i} (Title: {p.title}) {p.text}" for i, p in enumerate(passages, start=1))
    if style == "search-r1":
        out = []
        for i, p in enumerate(passages, start=1):
            first, _, rest = p.contents.partition("\n")
            out.append(f"Doc {i}(Title: {first}) {rest}\n")
        return "".join(out)
    if style == "verl":
        out = []
        for i, p in enumerate(passages, start=1):
            first, _, rest = p.contents.partition("\n")
            out.append(f"Doc {i} (Title: {first})\n{rest}")
        return "\n\n".join(out).strip()
    raise ValueError(f"unknown format style {style!r}; expected 'default', 'search-r1' or 'verl'")


def no_results_text(query: str) -> str:
    return f"No search results found for the query {query!r}."


EMPTY_QUERY_TEXT = "ERROR: the search query is empty; write the words to search for."


# --------------------------------------------------------------------------------------------- retrievers


@runtime_checkable
class Retriever(Protocol):
    """What the HTTP server, the sandbox's ``search()`` and ``knowledge_search`` need from a retriever."""

    passages: Sequence[Passage]

    def retrieve(self, query: str, k: int = DEFAULT_TOPK) -> list[Hit]: ...

    def batch_retrieve(self, queries: Sequence[str], k: int = DEFAULT_TOPK) -> list[list[Hit]]: ...

    def search(self, query: str, k: int = DEFAULT_TOPK) -> str: ...

    def by_title(self, title: str) -> list[Passage]: ...


def _check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    return int(k)


def top_k(scores: np.ndarray, k: int, *, positive_only: bool) -> list[tuple[int, float]]:
    """Indices and scores of the k best entries, best first; ties go to the lower index (deterministic)."""
    candidates = np.flatnonzero(scores > 0) if positive_only else np.arange(len(scores))
    if len(candidates) == 0:
        return []
    cand_scores = scores[candidates]
    if len(candidates) > k:
        # Keep everything tied with the k-th best score, then sort exactly: argpartition alone breaks ties
        # arbitrarily, which would make rankings differ between runs.
        kth = np.partition(cand_scores, len(cand_scores) - k)[len(cand_scores) - k]
        keep = cand_scores >= kth
        candidates, cand_scores = candidates[keep], cand_scores[keep]
    order = np.lexsort((candidates, -cand_scores))[:k]
    return [(int(candidates[i]), float(cand_scores[i])) for i in order]


class _RetrieverBase:
    """Shared plumbing: validation, ranking, formatting and title lookup. Subclasses score one query."""

    passages: list[Passage]
    _positive_only = True

    def _init_titles(self) -> None:
        self._titles: dict[str, list[int]] = {}
        for i, p in enumerate(self.passages):
            self._titles.setdefault(p.title.strip().casefold(), []).append(i)

    def __len__(self) -> int:
        return len(self.passages)

    def _scores(self, query: str) -> np.ndarray | None:
        raise NotImplementedError

    def _rank(self, scores: np.ndarray | None, k: int) -> list[Hit]:
        if scores is None:
            return []
        return [
            Hit(self.passages[i], score, rank)
            for rank, (i, score) in enumerate(top_k(scores, k, positive_only=self._positive_only), start=1)
        ]

    def retrieve(self, query: str, k: int = DEFAULT_TOPK) -> list[Hit]:
        """Top-k passages with scores, best first. An empty query or no matching term gives ``[]``."""
        if not isinstance(query, str):
            raise TypeError(f"query must be a string, got {type(query).__name__}")
        k = _check_k(k)
        if not query.strip():
            return []
        return self._rank(self._scores(query), k)

    def batch_retrieve(self, queries: Sequence[str], k: int = DEFAULT_TOPK) -> list[list[Hit]]:
        if isinstance(queries, str):
            raise TypeError("queries must be a sequence of strings, not one string")
        return [self.retrieve(q, k) for q in queries]

    def search(self, query: str, k: int = DEFAULT_TOPK, *, style: FormatStyle = "default") -> str:
        """The text the model reads: formatted top-k passages, or a clear message when there is none."""
        if not isinstance(query, str) or not query.strip():
            return EMPTY_QUERY_TEXT
        hits = self.retrieve(query, k)
        return format_passages(hits, style) if hits else no_results_text(query)

    def batch_search(
        self, queries: Sequence[str], k: int = DEFAULT_TOPK, *, style: FormatStyle = "default"
    ) -> list[str]:
        clean = [q if isinstance(q, str) else "" for q in queries]
        results = self.batch_retrieve(clean, k)
        return [
            format_passages(hits, style) if hits else (no_results_text(q) if q.strip() else EMPTY_QUERY_TEXT)
            for q, hits in zip(clean, results, strict=True)
        ]

    def __call__(self, query: str, k: int = DEFAULT_TOPK) -> str:
        """So the retriever itself is the ``search(query)`` function carl-segment's sandbox exposes."""
        return self.search(query, k)

    def by_title(self, title: str) -> list[Passage]:
        """Page lookup: passages whose title equals ``title`` (case-insensitive), in corpus order."""
        return [self.passages[i] for i in self._titles.get(title.strip().casefold(), [])]

    def as_tool(self, k: int = DEFAULT_TOPK, *, style: FormatStyle = "default") -> ToolFn:
        """A ToolFn taking ``{"query": str}`` or verl's ``{"query_list": [str, ...]}``.

        An index that cannot be read (an ``OSError``: its files vanished) gives an ``ERROR:`` text marked as an
        infrastructure failure (:func:`~agentcredit.tools.base.unavailable`), not a search answer.
        """

        def tool(arguments: dict[str, Any]) -> str:
            try:
                return answer(arguments)
            except OSError as exc:
                return unavailable(f"ERROR: the search index is unavailable: {type(exc).__name__}: {exc}")

        def answer(arguments: dict[str, Any]) -> str:
            if not isinstance(arguments, dict):
                return "ERROR: search arguments must be a JSON object with a 'query' string"
            if "query_list" in arguments:
                queries = arguments["query_list"]
                if (
                    not isinstance(queries, list)
                    or not queries
                    or not all(isinstance(q, str) for q in queries)
                ):
                    return "ERROR: 'query_list' must be a non-empty list of strings"
                return "\n---\n".join(self.batch_search(queries, k, style=style))
            query = arguments.get("query")
            if not isinstance(query, str):
                return "ERROR: search needs a 'query' string argument"
            return self.search(query, k, style=style)

        return tool


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


def _index_text(p: Passage) -> str:
    return f"{p.title}\n{p.text}"


class BM25Search(_RetrieverBase):
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
        _check_unique_ids(passages)
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
        tokens = [self._analyzer(_index_text(p)) for p in self.passages]
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
        return self._bm25.get_scores_from_ids(ids)


def load_retriever(
    corpus: str | os.PathLike[str],
    *,
    dense: bool = False,
    model_path: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> _RetrieverBase:
    """BM25 (default) or dense retrieval over a JSONL corpus; the dense import stays lazy."""
    if dense:
        from agentcredit.tools.dense import DenseSearch

        return DenseSearch.from_jsonl(corpus, model_path=model_path, cache_dir=cache_dir)
    if model_path is not None:
        raise ValueError("model_path only applies to dense retrieval (dense=True)")
    return BM25Search.from_jsonl(corpus, cache_dir=cache_dir)
