"""Loaders for the real benchmarks in ``../shared/data/`` (schemas in that folder's README.md) and for user JSONL.

Each ``load_<name>(root, split)`` reads the original files under ``root`` exactly as they were published and
returns :class:`~agentcredit.tasks.example.Example` objects in file order. A malformed record raises a
ValueError naming the file, the line (or record index) and the field. Which files a split needs, and which
BM25 corpus goes with a dataset, is declared in :mod:`agentcredit.tasks.registry`.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentcredit.tasks.example import (
    Example,
    answers_from,
    collapse_whitespace,
    iter_jsonl,
    read_json_list,
    require,
    string_list,
)
from agentcredit.tasks.scoring import parse_number

Loader = Callable[[Path, str], list[Example]]


def _check_split(name: str, split: str, files: dict[str, Any]) -> None:
    if split not in files:
        raise ValueError(f"{name} has no split {split!r}; available: {', '.join(files)}")


def _unique(examples: list[Example], where: str) -> list[Example]:
    seen: set[str] = set()
    for ex in examples:
        if ex.id in seen:
            raise ValueError(f"{where}: duplicate id {ex.id!r}")
        seen.add(ex.id)
    return examples


# ----------------------------------------------------------------------------------------------------
# GSM8K


GSM8K_FILES = {"train": "gsm8k/train.jsonl", "test": "gsm8k/test.jsonl"}


def load_gsm8k(root: Path, split: str = "test") -> list[Example]:
    """GSM8K: the gold is the number after ``####``; the worked solution goes to ``info["solution"]``.

    Ids are ``gsm8k-<split>-<line>`` (1-based line of the official file), since GSM8K has no ids.
    """
    _check_split("gsm8k", split, GSM8K_FILES)
    path = root / GSM8K_FILES[split]
    examples = []
    for where, row in iter_jsonl(path):
        solution = require(row, "answer", where, str)
        if "####" not in solution:
            raise ValueError(f"{where}: field 'answer' has no '#### <number>' final answer")
        final = solution.rsplit("####", 1)[1].strip()
        if parse_number(final, strict=True) is None:
            raise ValueError(f"{where}: field 'answer' ends in '#### {final}', which is not a number")
        line = where.rsplit(" ", 1)[1]
        examples.append(
            Example(
                id=f"gsm8k-{split}-{line}",
                question=require(row, "question", where, str).strip(),
                answers=[final],
                task="gsm8k",
                info={"metric": "numeric", "solution": solution, "source": GSM8K_FILES[split]},
            )
        )
    return examples


# ----------------------------------------------------------------------------------------------------
# HotpotQA (distractor setting)

HOTPOTQA_CONTEXT_FILES = (
    # Read in this order, as the pooled corpus was built (README: "IRCoT's file was read first").
    "hotpotqa/ircot_dev_subsampled_500.jsonl",
    "hotpotqa/aflow_hotpotqa_validate_200.jsonl",
    "hotpotqa/migres_hotpot_dev_200.jsonl",
)
HOTPOTQA_QA_ONLY_FILE = "hotpotqa/react_hotpot_dev_v1_simplified.json"
HOTPOTQA_FILES = {"dev": HOTPOTQA_CONTEXT_FILES, "dev_full": (HOTPOTQA_QA_ONLY_FILE,)}


def _official_context(row: dict[str, Any], where: str, field: str = "context") -> dict[str, str]:
    """``[[title, [sentences]]]`` (official HotpotQA / 2Wiki format) -> {title: paragraph text}."""
    paragraphs: dict[str, str] = {}
    for i, item in enumerate(require(row, field, where, list)):
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            raise ValueError(f"{where}: field '{field}' item {i} must be [title, [sentences]]")
        sentences = string_list(item[1] if isinstance(item[1], list) else [item[1]], where, f"{field}[{i}]")
        paragraphs.setdefault(item[0], collapse_whitespace(" ".join(sentences)))
    return paragraphs


def _supporting_titles(row: dict[str, Any], where: str) -> list[str]:
    facts = require(row, "supporting_facts", where, (list, str))
    if isinstance(facts, str):  # a few 2Wiki records store the list as its Python repr
        try:
            facts = ast.literal_eval(facts)
        except (ValueError, SyntaxError):
            raise ValueError(f"{where}: field 'supporting_facts' is not a list") from None
    titles: list[str] = []
    for i, fact in enumerate(facts):
        if not (isinstance(fact, list | tuple) and fact and isinstance(fact[0], str)):
            raise ValueError(f"{where}: field 'supporting_facts' item {i} must be [title, sentence_index]")
        if fact[0] not in titles:
            titles.append(fact[0])
    return titles


def _supporting_passages(titles: list[str], paragraphs: dict[str, str], where: str) -> list[dict[str, str]]:
    missing = [t for t in titles if t not in paragraphs]
    if missing:
        raise ValueError(f"{where}: supporting title(s) {missing} not in field 'context'")
    return [{"title": t, "text": paragraphs[t]} for t in titles]


def _hotpot_official(where: str, row: dict[str, Any], source: str) -> Example:
    titles = _supporting_titles(row, where)
    paragraphs = _official_context(row, where)
    return Example(
        # A few AFlow records carry integer ids (37, 61, ...); the pooled corpus keeps them as given.
        id=str(require(row, "_id", where, (str, int))),
        question=require(row, "question", where, str).strip(),
        answers=answers_from(require(row, "answer", where, str), where, "answer"),
        task="hotpotqa",
        info={
            "metric": "em",
            "hops": 2,
            "type": row.get("type", ""),
            "level": row.get("level", ""),
            "supporting_titles": titles,
            "supporting_passages": _supporting_passages(titles, paragraphs, where),
            "source": source,
        },
    )


def _supporting_paragraphs(row: dict[str, Any], key: str, where: str) -> list[dict[str, str]]:
    """The ``{title, text}`` of the paragraphs in ``row[key]`` marked ``is_supporting`` (IRCoT-style rows)."""
    supporting = []
    for i, para in enumerate(require(row, key, where, list)):
        para_where = f"{where} {key}[{i}]"
        if not isinstance(para, dict):
            raise ValueError(f"{para_where}: must be an object")
        if require(para, "is_supporting", para_where, bool):
            text = collapse_whitespace(require(para, "paragraph_text", para_where, str))
            supporting.append({"title": require(para, "title", para_where, str), "text": text})
    return supporting


def _hotpot_ircot(where: str, row: dict[str, Any], source: str) -> Example:
    answer_objects = require(row, "answers_objects", where, list)
    spans: list[str] = []
    for i, obj in enumerate(answer_objects):
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: field 'answers_objects' item {i} must be an object")
        spans += string_list(require(obj, "spans", f"{where} answers_objects[{i}]", list), where, "spans")
    supporting = _supporting_paragraphs(row, "contexts", where)
    answers = [s.strip() for s in spans if s.strip()]
    if not answers:
        raise ValueError(f"{where}: field 'answers_objects' holds no answer span")
    return Example(
        id=require(row, "question_id", where, str),
        question=require(row, "question_text", where, str).strip(),
        answers=answers,
        task="hotpotqa",
        info={
            "metric": "em",
            "hops": 2,
            "supporting_titles": [p["title"] for p in supporting],
            "supporting_passages": supporting,
            "source": source,
        },
    )


def load_hotpotqa(root: Path, split: str = "dev") -> list[Example]:
    """HotpotQA dev, distractor setting.

    ``dev``: the 868 unique dev questions that come with their distractor paragraphs (three files, pooled
    and de-duplicated by id in the order the BM25 corpus was built; the corpus covers all of them).
    ``dev_full``: all 7,405 dev questions, question and answer only (the corpus covers just 868 of them).
    """
    _check_split("hotpotqa", split, HOTPOTQA_FILES)
    if split == "dev_full":
        examples = []
        for where, row in read_json_list(root / HOTPOTQA_QA_ONLY_FILE):
            index = where.rsplit(" ", 1)[1]
            examples.append(
                Example(
                    id=f"hotpotqa-dev-{index}",
                    question=require(row, "question", where, str).strip(),
                    answers=answers_from(require(row, "answer", where, str), where, "answer"),
                    task="hotpotqa",
                    info={
                        "metric": "em",
                        "hops": 2,
                        "type": row.get("type", ""),
                        "source": HOTPOTQA_QA_ONLY_FILE,
                    },
                )
            )
        return examples
    by_id: dict[str, Example] = {}
    for source in HOTPOTQA_CONTEXT_FILES:
        parse = _hotpot_ircot if "ircot" in source else _hotpot_official
        for where, row in iter_jsonl(root / source):
            example = parse(where, row, source)
            by_id.setdefault(example.id, example)
    return list(by_id.values())


# ----------------------------------------------------------------------------------------------------
# MuSiQue-Ans

MUSIQUE_FILES = {"dev": "musique/migres_musique_dev_200.jsonl"}


def load_musique(root: Path, split: str = "dev") -> list[Example]:
    """MuSiQue-Ans dev (200 answerable questions). ``info["hops"]`` comes from the id prefix (spec 6.4)."""
    _check_split("musique", split, MUSIQUE_FILES)
    examples = []
    for where, row in iter_jsonl(root / MUSIQUE_FILES[split]):
        qid = require(row, "id", where, str)
        if not (qid[:1].isdigit() and qid[1:4] == "hop"):
            raise ValueError(f"{where}: field 'id' {qid!r} does not start with '<n>hop'")
        aliases = string_list(row.get("answer_aliases", []) or [], where, "answer_aliases")
        answers = answers_from([require(row, "answer", where, str), *aliases], where, "answer")
        supporting = _supporting_paragraphs(row, "paragraphs", where)
        examples.append(
            Example(
                id=qid,
                question=require(row, "question", where, str).strip(),
                answers=list(dict.fromkeys(answers)),
                task="musique",
                info={
                    "metric": "em",
                    "hops": int(qid[0]),
                    "decomposition": row.get("question_decomposition", []),
                    "supporting_titles": [p["title"] for p in supporting],
                    "supporting_passages": supporting,
                    "source": MUSIQUE_FILES[split],
                },
            )
        )
    return _unique(examples, str(root / MUSIQUE_FILES[split]))


# ----------------------------------------------------------------------------------------------------
# 2WikiMultihopQA

TWOWIKI_FILE = "2wikimultihopqa/migres_2wiki_dev_200.jsonl"
TWOWIKI_FILES = {"dev": TWOWIKI_FILE, "dev_all": TWOWIKI_FILE}


def load_2wiki(root: Path, split: str = "dev") -> list[Example]:
    """2WikiMultihopQA dev sample. ``dev``: the 164 questions that carry their 10 context paragraphs (the
    ones the pooled BM25 corpus covers); ``dev_all``: all 200, ``info["has_context"]`` telling which."""
    _check_split("2wiki", split, TWOWIKI_FILES)
    examples = []
    for where, row in iter_jsonl(root / TWOWIKI_FILE):
        has_context = "context" in row
        if split == "dev" and not has_context:
            continue
        titles = _supporting_titles(row, where)
        info: dict[str, Any] = {
            "metric": "em",
            "hops": 2,
            "type": require(row, "type", where, str),
            "has_context": has_context,
            "supporting_titles": titles,
            "source": TWOWIKI_FILE,
        }
        if has_context:
            info["supporting_passages"] = _supporting_passages(titles, _official_context(row, where), where)
        examples.append(
            Example(
                id=require(row, "_id", where, str),
                question=require(row, "question", where, str).strip(),
                answers=answers_from(require(row, "answer", where, str), where, "answer"),
                task="2wiki",
                info=info,
            )
        )
    return _unique(examples, str(root / TWOWIKI_FILE))


# ----------------------------------------------------------------------------------------------------
# Bamboogle, NQ-open, DeepResearcher's 7-dataset eval set

BAMBOOGLE_FILES = {"test": "bamboogle/r1searcher_bamboogle.jsonl"}


def load_bamboogle(root: Path, split: str = "test") -> list[Example]:
    """Bamboogle, all 125 questions, from R1-Searcher's copy (numbered by ``idx``).

    Not FireAct's CSV copy: a spreadsheet mangled 13 of its dates ("29-May-32" for "May 29, 1932").
    """
    _check_split("bamboogle", split, BAMBOOGLE_FILES)
    examples = []
    for where, row in iter_jsonl(root / BAMBOOGLE_FILES[split]):
        idx = require(row, "idx", where, int)
        examples.append(
            Example(
                id=f"bamboogle-{idx}",
                question=require(row, "question", where, str).strip(),
                answers=answers_from(require(row, "answer", where, str), where, "answer"),
                task="bamboogle",
                info={"metric": "em", "source": BAMBOOGLE_FILES[split]},
            )
        )
    return _unique(examples, str(root / BAMBOOGLE_FILES[split]))


NQ_FILES = {"dev": "nq/NQ-open.dev.jsonl", "efficientqa": "nq/NQ-open.efficientqa.dev.1.1.jsonl"}


def load_nq(root: Path, split: str = "dev") -> list[Example]:
    """NQ-open. ``dev`` is the 3,610-question split DPR/RAG papers report as "NQ test"; ids ``nq-<split>-<line>``."""
    _check_split("nq", split, NQ_FILES)
    examples = []
    for where, row in iter_jsonl(root / NQ_FILES[split]):
        answers = answers_from(require(row, "answer", where, list), where, "answer")
        if not answers:
            raise ValueError(f"{where}: field 'answer' is an empty list")
        examples.append(
            Example(
                id=f"nq-{split}-{where.rsplit(' ', 1)[1]}",
                question=require(row, "question", where, str).strip(),
                answers=answers,
                task="nq",
                info={"metric": "em", "source": NQ_FILES[split]},
            )
        )
    return examples


DEEPRESEARCHER_FILES = {
    "test": "search_agent_evalsets/deepresearcher_test.jsonl",
    "dev": "search_agent_evalsets/deepresearcher_dev.jsonl",
}


def load_deepresearcher(root: Path, split: str = "test") -> list[Example]:
    """DeepResearcher's eval set: NQ, TriviaQA, HotpotQA, 2Wiki, MuSiQue, PopQA (512 each in ``test``, 125 in
    ``dev``) and Bamboogle (125). ``info["data_source"]`` names the benchmark (report per source)."""
    _check_split("deepresearcher", split, DEEPRESEARCHER_FILES)
    examples = []
    for where, row in iter_jsonl(root / DEEPRESEARCHER_FILES[split]):
        answers = answers_from(require(row, "golden_answers", where, list), where, "golden_answers")
        if not answers:
            raise ValueError(f"{where}: field 'golden_answers' is an empty list")
        examples.append(
            Example(
                id=require(row, "id", where, str),
                question=require(row, "question", where, str).strip(),
                answers=answers,
                task="deepresearcher",
                info={
                    "metric": "em",
                    "data_source": require(row, "data_source", where, str),
                    "source": DEEPRESEARCHER_FILES[split],
                },
            )
        )
    return _unique(examples, str(root / DEEPRESEARCHER_FILES[split]))


# ----------------------------------------------------------------------------------------------------
# Finance: ConvFinQA and TAT-QA, the stand-ins for FinQA (table and text inline in the question)


def finance_question(text: str, table: str, question: str, earlier: list[str] | None = None) -> str:
    """The question as the model sees it: report text, the pipe-separated table, then the question.

    carl-segment puts FinQA's table inline in the user turn (carl-segment.md A2, A17); ConvFinQA's earlier
    conversation turns come before the final question because it refers back to them.
    """
    parts = [f"Report text:\n{collapse_whitespace(text)}", f"Table:\n{table.strip()}"]
    if earlier:
        parts.append(
            "Earlier questions in this conversation:\n" + "\n".join(f"- {q.strip()}" for q in earlier)
        )
    parts.append(f"Question: {question.strip()}")
    return "\n\n".join(parts)


CONVFINQA_FILES = {"dev": "convfinqa/pot_convfinqa_dev.json"}


def load_convfinqa(root: Path, split: str = "dev") -> list[Example]:
    """ConvFinQA dev (421 conversations): the last turn is the question, scored by the ``finqa`` metric
    (relative tolerance 1e-2, percent forms; carl-segment A16); the three yes/no answers by ``em``."""
    _check_split("convfinqa", split, CONVFINQA_FILES)
    examples = []
    for where, row in read_json_list(root / CONVFINQA_FILES[split]):
        turns = string_list(require(row, "questions", where, list), where, "questions")
        if not turns:
            raise ValueError(f"{where}: field 'questions' is an empty list")
        answer = require(row, "answer", where, (str, int, float))
        answers = answers_from(answer, where, "answer")
        if not answers:
            raise ValueError(f"{where}: field 'answer' is empty")
        numeric = parse_number(answers[0], strict=True) is not None
        examples.append(
            Example(
                id=require(row, "id", where, str),
                question=finance_question(
                    require(row, "text", where, str), require(row, "table", where, str), turns[-1], turns[:-1]
                ),
                answers=answers,
                task="convfinqa",
                info={
                    "metric": "finqa" if numeric else "em",
                    "turns": turns,
                    "programs": row.get("programs", []),
                    "source": CONVFINQA_FILES[split],
                },
            )
        )
    return _unique(examples, str(root / CONVFINQA_FILES[split]))


TATQA_FILES = {"dev": "tatqa/pot_tatqa_dev.json"}
_TATQA_METRIC = {"arithmetic": "finqa", "count": "finqa", "span": "em", "multi-span": "f1"}


def load_tatqa(root: Path, split: str = "dev") -> list[Example]:
    """TAT-QA dev (1,668 questions over report tables and text).

    Arithmetic and count answers are numbers in the unit ``info["scale"]`` names (thousand, million,
    percent) and use the ``finqa`` metric; a span uses ``em``; a multi-span answer becomes one gold, its
    spans joined by ", ", scored by ``f1`` (order-insensitive). Empty spans in the source are dropped.
    """
    _check_split("tatqa", split, TATQA_FILES)
    examples = []
    for where, row in read_json_list(root / TATQA_FILES[split]):
        answer_type = require(row, "answer_type", where, str)
        if answer_type not in _TATQA_METRIC:
            raise ValueError(
                f"{where}: field 'answer_type' is {answer_type!r}, expected one of {list(_TATQA_METRIC)}"
            )
        answers = answers_from(require(row, "answer", where, (str, int, float, list)), where, "answer")
        if not answers:
            raise ValueError(f"{where}: field 'answer' holds no answer")
        if answer_type == "multi-span":
            answers = [", ".join(answers)]
        examples.append(
            Example(
                id=require(row, "question_id", where, str),
                question=finance_question(
                    require(row, "text", where, str),
                    require(row, "table", where, str),
                    require(row, "question", where, str),
                ),
                answers=answers,
                task="tatqa",
                info={
                    "metric": _TATQA_METRIC[answer_type],
                    "answer_type": answer_type,
                    "scale": row.get("scale", ""),
                    "derivation": row.get("derivation", ""),
                    "source": TATQA_FILES[split],
                },
            )
        )
    return _unique(examples, str(root / TATQA_FILES[split]))


# ----------------------------------------------------------------------------------------------------
# User JSONL

DEFAULT_ANSWER_FIELDS = ("answers", "answer", "golden_answers")


def load_jsonl(
    path: str | Path,
    *,
    question_field: str = "question",
    answer_field: str | None = None,
    id_field: str | None = "id",
    task: str | None = None,
    metric: str = "em",
    require_answers: bool = True,
) -> list[Example]:
    """Any JSONL file (optionally ``.gz``) with a question and its answers, one object per line.

    ``answer_field=None`` takes, per row, the first of ``answers`` / ``answer`` / ``golden_answers`` that is
    present; the value may be a string, a number or a list of those (aliases). Rows without ``id_field``
    get ``<file stem>-<line>``. Every other field goes to ``info``. A row's own ``metric`` overrides
    ``metric``. ``require_answers=False`` accepts query-only rows (judged, not matched: PORTool's setting).
    """
    rows = jsonl_rows(
        path,
        question_field=question_field,
        answer_field=answer_field,
        id_field=id_field,
        task=task,
        metric=metric,
        require_answers=require_answers,
    )
    return _unique([example for _, example in rows], str(path))


def jsonl_rows(
    path: str | Path,
    *,
    question_field: str = "question",
    answer_field: str | None = None,
    id_field: str | None = "id",
    task: str | None = None,
    metric: str = "em",
    require_answers: bool = True,
) -> list[tuple[str, Example]]:
    """:func:`load_jsonl`'s examples with where each comes from (``"<path> line <n>"``), so a later check of a
    row (its ``demo_calls`` against the tools' schemas) can name the file and line."""
    path = Path(path)
    task = task or f"jsonl:{path}"
    rows = []
    for where, row in iter_jsonl(path):
        question = require(row, question_field, where, str).strip()
        candidates = (answer_field,) if answer_field else DEFAULT_ANSWER_FIELDS
        found = next((name for name in candidates if name in row), None)
        if found is None:
            if require_answers:
                looked = (
                    f"'{answer_field}'"
                    if answer_field
                    else ", ".join(f"'{n}'" for n in DEFAULT_ANSWER_FIELDS)
                )
                raise ValueError(
                    f"{where}: field {looked} is missing (set answer_field to name the answer field)"
                )
            answers: list[str] = []
        else:
            answers = answers_from(row[found], where, found)
            if require_answers and not answers:
                raise ValueError(f"{where}: field '{found}' holds no answer")
        line = where.rsplit(" ", 1)[1]
        example_id = str(require(row, id_field, where, (str, int))) if id_field and id_field in row else None
        info = {k: v for k, v in row.items() if k not in {question_field, found, id_field}}
        info.setdefault("metric", metric)
        example = Example(
            id=example_id or f"{path.name.split('.')[0]}-{line}",
            question=question,
            answers=answers,
            task=task,
            info=info,
        )
        rows.append((where, example))
    return rows
