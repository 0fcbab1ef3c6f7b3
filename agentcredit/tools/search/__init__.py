"""Passage retrieval for the search tools: BM25 (default) and dense, over a JSONL corpus, and the HTTP server
that gives verl and Search-R1 clients the same index.

    retriever = load_retriever("corpus.jsonl")          # BM25Search; dense=True for DenseSearch
    print(retriever.search("who portrayed Corliss Archer", k=3))
"""

from __future__ import annotations

import os

from agentcredit.tools.search.base import (
    DEFAULT_TOPK,
    EMPTY_QUERY_TEXT,
    FormatStyle,
    Hit,
    Passage,
    Retriever,
    RetrieverBase,
    corpus_fingerprint,
    default_cache_dir,
    format_passages,
    no_results_text,
    passage_from_row,
    read_corpus,
    top_k,
)
from agentcredit.tools.search.bm25 import DEFAULT_B, DEFAULT_K1, BM25Search

__all__ = [
    "BM25Search",
    "DEFAULT_B",
    "DEFAULT_K1",
    "DEFAULT_TOPK",
    "EMPTY_QUERY_TEXT",
    "FormatStyle",
    "Hit",
    "Passage",
    "Retriever",
    "RetrieverBase",
    "corpus_fingerprint",
    "default_cache_dir",
    "format_passages",
    "load_retriever",
    "no_results_text",
    "passage_from_row",
    "read_corpus",
    "top_k",
]


def load_retriever(
    corpus: str | os.PathLike[str],
    *,
    dense: bool = False,
    model_path: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> RetrieverBase:
    """BM25 (default) or dense retrieval over a JSONL corpus; the dense import stays lazy."""
    if dense:
        from agentcredit.tools.search.dense import DenseSearch

        return DenseSearch.from_jsonl(corpus, model_path=model_path, cache_dir=cache_dir)
    if model_path is not None:
        raise ValueError("model_path only applies to dense retrieval (dense=True)")
    return BM25Search.from_jsonl(corpus, cache_dir=cache_dir)
