"""Time BM25 indexing and querying on the 8,396-passage HotpotQA pool (and, with --dense, MiniLM retrieval).

    .venv/bin/python benchmarks/bench_search.py [--corpus FILE] [--queries N] [--repeats R] [--dense]

Cold = parse the JSONL + analyse + index + write the cache, into a fresh empty cache directory.
Warm = parse the JSONL + fingerprint it + load the cached index. Query latency is ``search(question, k=3)``
(retrieval + formatting) for HotpotQA dev questions, one at a time; throughput with several threads is also
reported. Numbers depend on the machine and on its load: say which when you quote them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agentcredit.tools.search import BM25Search, read_corpus

SHARED = Path(os.environ.get("AGENTCREDIT_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "data"
DEFAULT_CORPUS = SHARED / "corpora" / "hotpotqa_dev_pooled_paragraphs.jsonl"
QUESTIONS = SHARED / "hotpotqa" / "ircot_dev_subsampled_500.jsonl"


def load_questions(n: int, corpus: Path) -> list[str]:
    if QUESTIONS.is_file():
        with QUESTIONS.open() as fh:
            questions = [json.loads(line)["question_text"] for line in fh if line.strip()]
    else:  # without the shared data: passage titles make plausible short queries
        questions = [p.title for p in read_corpus(corpus)]
    return (questions * (n // max(1, len(questions)) + 1))[:n]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency_report(name: str, seconds: list[float]) -> None:
    ms = [s * 1000 for s in seconds]
    print(
        f"{name}: n={len(ms)}  mean={statistics.fmean(ms):.2f} ms  p50={percentile(ms, 0.5):.2f} ms  "
        f"p95={percentile(ms, 0.95):.2f} ms  max={max(ms):.2f} ms"
    )


def bench_bm25(corpus: Path, questions: list[str], repeats: int) -> None:
    cold, warm = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as cache:
            start = time.perf_counter()
            index = BM25Search.from_jsonl(corpus, cache_dir=cache)
            cold.append(time.perf_counter() - start)
            assert not index.from_cache
            start = time.perf_counter()
            index = BM25Search.from_jsonl(corpus, cache_dir=cache)
            warm.append(time.perf_counter() - start)
            assert index.from_cache
    print(f"corpus: {corpus} ({len(index)} passages)")
    print(
        f"BM25 index cold (parse + build + save): {', '.join(f'{s:.2f}' for s in cold)} s  (median {statistics.median(cold):.2f} s)"
    )
    print(
        f"BM25 index warm (parse + load cache):   {', '.join(f'{s:.2f}' for s in warm)} s  (median {statistics.median(warm):.2f} s)"
    )

    for q in questions[:10]:  # warm-up: first-call costs are not query latency
        index.search(q, k=3)
    times = []
    for q in questions:
        start = time.perf_counter()
        index.search(q, k=3)
        times.append(time.perf_counter() - start)
    latency_report("BM25 search(k=3), 1 thread", times)
    for workers in (4,):
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(lambda q: index.search(q, k=3), questions))
        elapsed = time.perf_counter() - start
        print(f"BM25 search(k=3), {workers} threads: {len(questions) / elapsed:.0f} queries/s")


def bench_dense(corpus: Path, questions: list[str]) -> None:
    from agentcredit.tools.search.dense import DenseSearch, get_embedder

    start = time.perf_counter()
    get_embedder()
    print(f"dense: model load {time.perf_counter() - start:.2f} s")
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        index = DenseSearch.from_jsonl(corpus, cache_dir=cache)
        print(f"dense index cold (parse + embed all passages + save): {time.perf_counter() - start:.1f} s")
        start = time.perf_counter()
        index = DenseSearch.from_jsonl(corpus, cache_dir=cache)
        print(f"dense index warm (parse + load embeddings): {time.perf_counter() - start:.2f} s")
    for q in questions[:5]:
        index.search(q, k=3)
    times = []
    for q in questions:
        start = time.perf_counter()
        index.search(q, k=3)
        times.append(time.perf_counter() - start)
    latency_report("dense search(k=3), 1 thread", times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--queries", type=int, default=500, help="number of timed queries (>= 100)")
    parser.add_argument("--repeats", type=int, default=3, help="cold/warm index builds to time")
    parser.add_argument(
        "--dense", action="store_true", help="also time dense retrieval (minutes on a laptop CPU)"
    )
    args = parser.parse_args()
    if args.queries < 100:
        parser.error("--queries must be at least 100")
    if not args.corpus.is_file():
        parser.error(f"corpus not found: {args.corpus}")
    print(f"machine: {os.cpu_count()} CPUs, load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    questions = load_questions(args.queries, args.corpus)
    bench_bm25(args.corpus, questions, args.repeats)
    if args.dense:
        bench_dense(args.corpus, questions)


if __name__ == "__main__":
    main()
