"""The task registry: ``load_task(name, split=..., limit=..., seed=...)`` and ``task_corpus(name)``.

Names: the synthetic ``arith-tools`` and ``kb-multihop``; the real benchmarks ``gsm8k``, ``hotpotqa``,
``musique``, ``2wiki``, ``bamboogle``, ``nq``, ``deepresearcher``, ``convfinqa``, ``tatqa``; ``bfcl:<category>``
(BFCL v4 from the installed bfcl-eval package, :mod:`agentcredit.tasks.bfcl`); and ``jsonl:<path>`` for any user file (keyword options go to :func:`~agentcredit.tasks.datasets.load_jsonl`).

A real benchmark is read from the data root (:func:`~agentcredit.tasks.paths.data_root`) when every file
its split needs is there; otherwise from the package sample of that split, with a :class:`SampleDataWarning`
that says why, because a number measured on a 200-question sample must never pass for a full-set number.
Examples from a sample carry ``info["from_sample"] = True``.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentcredit.tasks import arith, bfcl, datasets, kb
from agentcredit.tasks.example import Example, iter_jsonl, seeded_subset
from agentcredit.tasks.paths import SAMPLES_DIR, data_root, default_cache_dir

if TYPE_CHECKING:
    from agentcredit.config import Config


class SampleDataWarning(UserWarning):
    """A task was loaded from the small package sample instead of the full benchmark files."""


@dataclass(frozen=True)
class TaskSpec:
    """One registered task.

    Attributes:
        name: registry name, also ``Example.task``.
        description: one line for ``list_tasks``.
        splits: split -> files (relative to the data root) that split needs; empty for synthetic tasks.
        default_split: used when ``split`` is None.
        corpus: the BM25 corpus file (relative to the data root), or None if the task has none.
        loader: reads the real files (``loader(root, split)``); None for synthetic tasks.
        generator: makes examples (``generator(n, seed, split=...)``); None for real benchmarks.
        default_size: per split, how many examples a generator makes when ``limit`` is None; or a function of
            (split, seed, **options) when the options change it (kb-multihop's hop mix).
    """

    name: str
    description: str
    splits: dict[str, tuple[str, ...]]
    default_split: str
    corpus: str | None = None
    loader: datasets.Loader | None = None
    generator: Callable[..., list[Example]] | None = None
    default_size: dict[str, int] | Callable[..., int] | None = None


def _files(mapping: dict[str, str | tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    return {split: (files,) if isinstance(files, str) else tuple(files) for split, files in mapping.items()}


TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec(
            "arith-tools",
            "synthetic arithmetic, easy (mental) and hard (needs python) tiers; info['tier']",
            {"train": (), "test": ()},
            "train",
            generator=arith.generate,
            default_size={"train": 2000, "test": 200},
        ),
        TaskSpec(
            "kb-multihop",
            "synthetic fictional world, 1/2/3-hop questions answered by BM25 search; info['hops']; split 'novel':"
            " kinds, relations, phrasings and prose training never used; train hop mix: train_hop_fractions",
            {"train": (), "test": (), "novel": ()},
            "train",
            generator=kb.generate,
            default_size=kb.default_size,
        ),
        TaskSpec(
            "gsm8k",
            "GSM8K grade-school maths (numeric answer after ####)",
            _files(datasets.GSM8K_FILES),
            "test",
            loader=datasets.load_gsm8k,
        ),
        TaskSpec(
            "hotpotqa",
            "HotpotQA dev, distractor setting: 868 questions with paragraphs (dev) or 7,405 Q/A only (dev_full)",
            _files(datasets.HOTPOTQA_FILES),
            "dev",
            corpus="corpora/hotpotqa_dev_pooled_paragraphs.jsonl",
            loader=datasets.load_hotpotqa,
        ),
        TaskSpec(
            "musique",
            "MuSiQue-Ans dev, 200 answerable 2-4-hop questions with their 20 paragraphs",
            _files(datasets.MUSIQUE_FILES),
            "dev",
            corpus="corpora/musique_dev200_pooled_paragraphs.jsonl",
            loader=datasets.load_musique,
        ),
        TaskSpec(
            "2wiki",
            "2WikiMultihopQA dev sample: 164 questions with paragraphs (dev) or all 200 (dev_all)",
            _files(datasets.TWOWIKI_FILES),
            "dev",
            corpus="corpora/2wikimultihopqa_dev200_pooled_paragraphs.jsonl",
            loader=datasets.load_2wiki,
        ),
        TaskSpec(
            "bamboogle",
            "Bamboogle, all 125 two-hop questions (meant for open search; no corpus)",
            _files(datasets.BAMBOOGLE_FILES),
            "test",
            loader=datasets.load_bamboogle,
        ),
        TaskSpec(
            "nq",
            "NQ-open dev (the 3,610-question 'NQ test' of DPR/RAG papers) or EfficientQA dev",
            _files(datasets.NQ_FILES),
            "dev",
            loader=datasets.load_nq,
        ),
        TaskSpec(
            "deepresearcher",
            "DeepResearcher 7-dataset eval set (NQ, TQ, HotpotQA, 2Wiki, MuSiQue, PopQA, Bamboogle)",
            _files(datasets.DEEPRESEARCHER_FILES),
            "test",
            loader=datasets.load_deepresearcher,
        ),
        TaskSpec(
            "convfinqa",
            "ConvFinQA dev, a FinQA stand-in: table + text inline, numeric answer",
            _files(datasets.CONVFINQA_FILES),
            "dev",
            loader=datasets.load_convfinqa,
        ),
        TaskSpec(
            "tatqa",
            "TAT-QA dev, a FinQA stand-in: table + text inline, numeric or span answers",
            _files(datasets.TATQA_FILES),
            "dev",
            loader=datasets.load_tatqa,
        ),
    )
}


def list_tasks() -> dict[str, str]:
    """Registry name -> one-line description (``jsonl:<path>`` is accepted too)."""
    return {name: spec.description for name, spec in TASKS.items()}


def get_spec(name: str) -> TaskSpec:
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(TASKS)}, or jsonl:<path>") from None


def _split_of(spec: TaskSpec, split: str | None) -> str:
    split = split or spec.default_split
    if split not in spec.splits:
        raise ValueError(f"task {spec.name!r} has no split {split!r}; available: {', '.join(spec.splits)}")
    return split


def sample_path(name: str, split: str) -> Path:
    """The package sample of ``name``/``split`` (it may not exist: not every split ships a sample)."""
    return SAMPLES_DIR / f"{name}-{split}.jsonl.gz"


def sample_corpus_path(name: str) -> Path:
    return SAMPLES_DIR / "corpora" / f"{name}.jsonl.gz"


def _real_root(spec: TaskSpec, split: str, data_dir: str | Path | None) -> tuple[Path | None, str]:
    """``(root, "")`` if every file of the split (and the corpus) is under the root, else ``(None, why not)``."""
    root = Path(data_dir) if data_dir is not None else data_root()
    if root is None:
        return None, "no data folder was found ($AGENTCREDIT_DATA is unset and ../shared/data is absent)"
    needed = list(spec.splits[split]) + ([spec.corpus] if spec.corpus else [])
    missing = [f for f in needed if not (root / f).is_file()]
    if missing:
        return None, f"{root} lacks {', '.join(missing)}"
    return root, ""


def _load_sample(name: str, split: str, reason: str) -> list[Example]:
    path = sample_path(name, split)
    if not path.is_file():
        raise FileNotFoundError(
            f"task {name!r} split {split!r}: {reason}, and the package ships no sample of it"
        )
    warnings.warn(
        f"{name}/{split}: loading the small package sample because {reason}; results on it are not "
        "comparable with full-benchmark numbers",
        SampleDataWarning,
        stacklevel=3,
    )
    examples = []
    for where, row in iter_jsonl(path):
        example = Example.from_dict(row, where)
        example.info["from_sample"] = True
        examples.append(example)
    return examples


def _check_options(
    name: str, fn: Callable[..., Any], options: dict[str, Any], exclude: tuple[str, ...]
) -> None:
    """A ValueError naming the options ``fn`` (a task's loader or generator) does not take, and those it does,
    instead of a TypeError from deep inside the call (task.options written for another task)."""
    import inspect

    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [
        p for p in params if p not in exclude and params[p].kind is not inspect.Parameter.VAR_POSITIONAL
    ]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"task.options {unknown} are not options of task {name!r} (it takes {', '.join(accepted) or 'none'}); "
            "options written for another task do not carry over"
        )


def _jsonl_path(name: str, split: str | None) -> str:
    """The file of task ``jsonl:<path>`` for ``split`` (``{split}`` in the path names one file per split)."""
    path = name.removeprefix("jsonl:")
    if not path:
        raise ValueError("task 'jsonl:' needs a path, e.g. jsonl:data/questions.jsonl")
    if "{split}" in path:
        if not split:
            raise ValueError(f"task {name!r} has one file per split ('{{split}}' in its path): give a split")
        path = path.replace("{split}", split)
    return path


def example_locations(name: str, split: str | None = None, **options: Any) -> dict[str, str]:
    """Example id -> ``"<file> line <n>"`` for a ``jsonl:<path>`` task (what an error about a row names); empty
    for the other tasks, whose rows the user did not write."""
    if not name.startswith("jsonl:"):
        return {}
    rows = datasets.jsonl_rows(_jsonl_path(name, split), task=name, **options)
    return {example.id: where for where, example in rows}


def load_task(
    name: str,
    split: str | None = None,
    limit: int | None = None,
    seed: int = 0,
    *,
    data_dir: str | Path | None = None,
    **options: Any,
) -> list[Example]:
    """Examples of task ``name``.

    Args:
        name: a registry name (:func:`list_tasks`), ``bfcl:<category>`` (``bfcl:simple_python,multiple``,
            ``bfcl:all``; any split, ``limit`` per category) or ``jsonl:<path>``; a path containing ``{split}`` names one
            file per split (``jsonl:data/{split}.jsonl`` reads ``data/test.jsonl`` for split ``test``), any other
            path is read whatever the split.
        split: the split; None means the task's default (``test`` for GSM8K and Bamboogle, ``dev`` for the
            dev-only benchmarks, ``train`` for the synthetic tasks).
        limit: at most this many examples. Real data: a seeded random subset, kept in file order (the whole
            set if ``limit`` is None or larger). Synthetic: how many to generate (default 2000 / 200
            train / test for arith-tools, 1500 / 300 / 300 train / test / novel for kb-multihop, fewer train
            questions when its ``train_hop_fractions`` cannot fill 1500).
        seed: the subset seed for real data; the generation seed (and kb-multihop's world) for synthetic.
        data_dir: read real files from here instead of the default data root (no sample fallback then).
        options: extra keyword arguments for the generator (``easy_fraction=`` for arith-tools,
            ``train_hop_fractions=`` for kb-multihop: the hop mix of its train split only) or for
            :func:`~agentcredit.tasks.datasets.load_jsonl` (``question_field=``, ``answer_field=``, ...).
    """
    if name.startswith("jsonl:"):
        path = _jsonl_path(name, split)
        _check_options(name, datasets.load_jsonl, options, exclude=("path", "task"))
        return seeded_subset(datasets.load_jsonl(path, task=name, **options), limit, seed)
    if name.startswith(bfcl.PREFIX):
        # BFCL has no splits: a category is trained on or held out whole (bfcl.TRAIN_CATEGORIES), and ``limit``
        # is per category
        if options:
            raise ValueError(f"task {name!r} takes no options, got {sorted(options)}")
        return bfcl.load_bfcl(name, limit, seed)
    if split is not None and "@" in split:
        return _holdout_part(name, split, limit, seed, data_dir=data_dir, **options)
    spec = get_spec(name)
    split = _split_of(spec, split)
    if spec.generator is not None:
        _check_options(name, spec.generator, options, exclude=("n", "seed", "split"))
        if limit is not None:
            size = limit
        elif callable(spec.default_size):
            size = spec.default_size(split, seed, **options)
        else:
            size = (spec.default_size or {}).get(split, 0)
        return spec.generator(size, seed, split=split, **options)
    if options:
        raise ValueError(f"task {name!r} takes no options, got {sorted(options)}")
    if spec.loader is None:
        raise ValueError(f"task {name!r} has neither a loader nor a generator")
    root, reason = _real_root(spec, split, data_dir)
    if root is not None:
        examples = spec.loader(root, split)
    elif data_dir is not None:
        raise FileNotFoundError(f"task {name!r} split {split!r}: {reason}")
    else:
        examples = _load_sample(name, split, reason)
    return seeded_subset(examples, limit, seed)


def load_examples(config: Config, *, split: str | None = None, limit: int | None = None) -> list[Example]:
    """The examples ``config.task`` names (:func:`load_task`); ``split`` and ``limit`` override the config's."""
    t = config.task
    return load_task(
        t.name,
        split=split or t.split,
        limit=limit if limit is not None else t.limit,
        seed=t.seed,
        **t.options,
    )


HOLDOUT_PARTS = ("train", "heldout")


def _holdout_part(
    name: str, split: str, limit: int | None, seed: int, *, data_dir: str | Path | None, **options: Any
) -> list[Example]:
    """``<split>@train`` / ``<split>@heldout``: a fixed 80 / 20 partition of a split by a hash of each example id.

    For benchmarks that ship one split only (the HotpotQA, MuSiQue and 2Wiki dev sets with paragraphs), so a
    preset can train on one part and evaluate on the other without the two ever sharing a question.
    """
    base, part = split.split("@", 1)
    if part not in HOLDOUT_PARTS:
        raise ValueError(f"split {split!r}: the part after '@' must be one of {HOLDOUT_PARTS}")
    examples = load_task(name, base or None, None, seed, data_dir=data_dir, **options)
    keep = [ex for ex in examples if (_stable_bucket(ex.id) == 0) == (part == "heldout")]
    return seeded_subset(keep, limit, seed)


def _stable_bucket(key: str, buckets: int = 5) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") % buckets


def task_corpus(
    name: str, split: str | None = None, seed: int = 0, *, data_dir: str | Path | None = None
) -> Path | None:
    """The ``{id, title, text}`` JSONL corpus the search tool should index for ``name``, or None.

    Real benchmarks: the pooled per-dataset corpus of the data root, or, when questions come from the
    package sample, the sample's own corpus (the sampled questions' paragraphs), unpacked once into the
    cache folder. ``kb-multihop``: the world of ``seed`` written to the cache (one corpus for both splits).
    Tasks without retrieval (GSM8K, NQ, Bamboogle, the finance sets...) return None.
    """
    if name.startswith(("jsonl:", bfcl.PREFIX)):
        return None
    spec = get_spec(name)
    split = split.split("@", 1)[0] if split and "@" in split else split
    split = _split_of(spec, split)
    if name == "kb-multihop":
        return kb.write_kb_corpus(seed)
    if spec.corpus is None:
        return None
    root, reason = _real_root(spec, split, data_dir)
    if root is not None:
        return root / spec.corpus
    if data_dir is not None:
        raise FileNotFoundError(f"corpus of task {name!r}: {reason}")
    packed = sample_corpus_path(name)
    if not packed.is_file():
        raise FileNotFoundError(f"corpus of task {name!r}: {reason}, and the package ships no sample corpus")
    raw = packed.read_bytes()
    target = default_cache_dir() / "samples" / f"{name}-{hashlib.sha256(raw).hexdigest()[:12]}.jsonl"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_bytes(gzip.decompress(raw))
        tmp.replace(target)
    return target
