"""Build the benchmark samples shipped in ``agentcredit/data/samples/`` from the full files in ``../shared/data``.

    .venv/bin/python scripts/make_samples.py [--data ../shared/data] [--out agentcredit/data/samples]

Each sample is a seeded random subset (seed 0, kept in file order) of one split, read with the package's
own loaders and written as ``<task>-<split>.jsonl.gz`` in :class:`agentcredit.tasks.Example` form; tasks
with a BM25 corpus also get ``corpora/<task>.jsonl.gz``, the ``{id, title, text}`` passages of the pooled
corpus whose ``question_ids`` include a sampled question. The output is byte-for-byte reproducible
(gzip with mtime 0). ``NOTICE.md`` lists every sample's source, commit and licences.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
from collections import defaultdict
from pathlib import Path

from agentcredit.tasks.example import Example, iter_jsonl, seeded_subset
from agentcredit.tasks.registry import get_spec, load_task

REPO = Path(__file__).resolve().parents[1]

# (task, split, how many questions); deepresearcher takes this many per data source.
SAMPLES: tuple[tuple[str, str, int], ...] = (
    ("gsm8k", "test", 200),
    ("gsm8k", "train", 200),
    ("hotpotqa", "dev", 200),
    ("musique", "dev", 100),
    ("2wiki", "dev", 100),
    ("bamboogle", "test", 125),
    ("nq", "dev", 200),
    ("deepresearcher", "test", 25),
    ("convfinqa", "dev", 50),
    ("tatqa", "dev", 100),
)
SEED = 0

# Licences as ../shared/data/README.md states them: (repository licence, dataset licence).
LICENCES: dict[str, tuple[str, str]] = {
    "gsm8k": ("MIT", "MIT"),
    "hotpotqa": ("Apache-2.0 (IRCoT fork), MIT (MASArena), none (MIGRES)", "CC BY-SA 4.0"),
    "musique": ("none (MIGRES has no LICENSE file)", "CC BY 4.0"),
    "2wiki": ("none (MIGRES has no LICENSE file)", "Apache-2.0"),
    "bamboogle": ("MIT", "Press et al. 2022 (self-ask); no separate data licence was found"),
    "nq": ("Apache-2.0", "CC BY-SA 3.0"),
    "deepresearcher": (
        "Apache-2.0",
        "per source dataset: NQ CC BY-SA 3.0, HotpotQA CC BY-SA 4.0, 2Wiki Apache-2.0, MuSiQue CC BY 4.0, "
        "Bamboogle as above; TriviaQA and PopQA rows as distributed in that Apache-2.0 repository",
    ),
    "convfinqa": ("MIT", "MIT"),
    "tatqa": ("MIT", "CC BY 4.0"),
}


def _gzip_lines(rows: list[dict], path: Path) -> int:
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as handle:
        for row in rows:
            handle.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())
    return len(buffer.getvalue())


def _select(task: str, split: str, count: int, data: Path) -> list[Example]:
    if task != "deepresearcher":
        return load_task(task, split, limit=count, seed=SEED, data_dir=data)
    by_source: dict[str, list[Example]] = defaultdict(list)
    for example in load_task(task, split, data_dir=data):
        by_source[example.info["data_source"]].append(example)
    chosen = {ex.id for group in by_source.values() for ex in seeded_subset(group, count, SEED)}
    return [ex for group in by_source.values() for ex in group if ex.id in chosen]


def _corpus_rows(corpus: Path, ids: set[str]) -> list[dict]:
    rows = []
    for _, row in iter_jsonl(corpus):
        if ids & {str(q) for q in row.get("question_ids", [])}:
            rows.append({"id": row["id"], "title": row["title"], "text": row["text"]})
    return rows


def _sources(data: Path) -> dict[str, dict]:
    return {entry["file"]: entry for entry in json.loads((data / "sources.json").read_text())}


# Derived files of shared/data and the upstream file each was flattened from.
UPSTREAM = {
    "search_agent_evalsets/deepresearcher_test.jsonl": "search_agent_evalsets/deepresearcher_test.parquet",
    "search_agent_evalsets/deepresearcher_dev.jsonl": "search_agent_evalsets/deepresearcher_dev.parquet",
}


def _origin(file: str, sources: dict[str, dict]) -> str:
    entry = sources.get(file)
    if entry is None:
        raise ValueError(f"{file} is not listed in sources.json")
    if "repo" in entry:
        return f"{entry['repo']} `{entry['path']}` @ {entry['snapshot_head'][:12]}"
    upstream = UPSTREAM.get(file)
    suffix = (
        f", flattened from {_origin(upstream, sources)}" if upstream else " (pooled from the files above)"
    )
    return f"shared/data `{file}`{suffix}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=REPO / "agentcredit" / "data" / "samples")
    args = parser.parse_args()
    sources = _sources(args.data)
    notice = [
        "# Benchmark samples shipped with agentcredit",
        "",
        "Small seeded subsets (seed 0) of public benchmarks, so the package runs without the full files.",
        "They were made by `scripts/make_samples.py` from the copies described in `shared/data/README.md`",
        "and converted to agentcredit's Example JSONL (`id, question, answers, task, info`); question and",
        "passage texts are unchanged except that runs of whitespace in passages were collapsed. The",
        "licence of each original dataset applies to its sample (the package's own Apache-2.0 licence",
        "covers the code, not these files); CC BY-SA samples are redistributed under the same licence.",
        "Numbers measured on these samples are not comparable with full-benchmark results.",
        "",
        "| file | questions | passages | source (repository, path @ snapshot commit) | repository licence | data licence |",
        "|---|---:|---:|---|---|---|",
    ]
    total = 0
    for task, split, count in SAMPLES:
        examples = _select(task, split, count, args.data)
        size = _gzip_lines([ex.to_dict() for ex in examples], args.out / f"{task}-{split}.jsonl.gz")
        passages = ""
        spec = get_spec(task)
        if spec.corpus:
            rows = _corpus_rows(args.data / spec.corpus, {ex.id for ex in examples})
            size += _gzip_lines(rows, args.out / "corpora" / f"{task}.jsonl.gz")
            passages = str(len(rows))
        total += size
        files = sorted({ex.info["source"] for ex in examples}) + ([spec.corpus] if spec.corpus else [])
        origin = "; ".join(_origin(f, sources) for f in files)
        repo_licence, data_licence = LICENCES[task]
        notice.append(
            f"| `{task}-{split}.jsonl.gz` | {len(examples)} | {passages or '-'} | {origin} | "
            f"{repo_licence} | {data_licence} |"
        )
        print(f"{task}/{split}: {len(examples)} questions, {passages or 0} passages, {size:,} bytes")
    (args.out / "NOTICE.md").write_text("\n".join(notice) + "\n", encoding="utf-8")
    print(f"total {total:,} bytes in {args.out}")


if __name__ == "__main__":
    main()
