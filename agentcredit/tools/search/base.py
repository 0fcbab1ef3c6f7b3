"""What every retriever shares: passages and hits, reading a JSONL corpus, the text the model reads, and
:class:`RetrieverBase` (validation, ranking, formatting, title lookup, the tool wrapper). BM25
(:mod:`~agentcredit.tools.search.bm25`) and dense retrieval (:mod:`~agentcredit.tools.search.dense`) subclass it.

Corpus rows are ``{"id", "title", "text"}`` (extra fields are kept as metadata) or Search-R1's
``{"id", "contents"}`` where ``contents`` is ``"<title>"\\n<text>``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from agentcredit.tools.base import ToolFn, unavailable

DEFAULT_TOPK = 3

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


def check_unique_ids(passages: Sequence[Passage]) -> None:
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


def check_k(k: Any) -> int:
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


class RetrieverBase:
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
        k = check_k(k)
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


def index_text(p: Passage) -> str:
    return f"{p.title}\n{p.text}"
