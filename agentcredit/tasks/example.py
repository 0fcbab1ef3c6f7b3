"""The :class:`Example` every loader returns, and the file-reading helpers that name file, line and field.

Every error raised while reading data says where the bad value is (``data/x.jsonl line 17: field 'answer'
is missing``), so a broken row is found in seconds instead of surfacing as a KeyError deep in training.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any


@dataclass
class Example:
    """One question with its gold answers.

    Attributes:
        id: unique within its task (the dataset's own id where it has one).
        question: the text the model is asked; finance tasks carry their table and text inline here.
        answers: gold answers, aliases of one another (scorers take the max over them). Empty only for
            query-only datasets (PORTool-style), which a judge scores instead.
        task: the registry name the example came from (``hotpotqa``, ``arith-tools``, ``jsonl:...``).
        info: everything else, JSON-able: ``metric`` (the :func:`~agentcredit.tasks.scoring.score`
            metric the task is scored with), ``tier`` / ``hops``, supporting passages, source file, ...
    """

    id: str
    question: str
    answers: list[str]
    task: str
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"Example.id must be a non-empty string, got {self.id!r}")
        if not isinstance(self.question, str) or not self.question.strip():
            raise ValueError(f"Example {self.id}: question must be a non-empty string")
        if not isinstance(self.answers, list) or not all(isinstance(a, str) for a in self.answers):
            raise ValueError(f"Example {self.id}: answers must be a list of strings, got {self.answers!r}")

    @property
    def metric(self) -> str:
        """The scoring metric for this example (``info["metric"]``, default ``"em"``)."""
        return str(self.info.get("metric", "em"))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, row: dict[str, Any], where: str = "example") -> Example:
        """Inverse of :meth:`to_dict`; ``where`` (e.g. ``"file.jsonl line 3"``) prefixes every error."""
        return cls(
            id=require(row, "id", where, str),
            question=require(row, "question", where, str),
            answers=string_list(require(row, "answers", where, list), where, "answers"),
            task=require(row, "task", where, str),
            info=dict(require(row, "info", where, dict)),
        )


# ----------------------------------------------------------------------------------------------------
# Reading files


def open_text(path: Path) -> IO[str]:
    """Open a text file for reading, transparently gunzipping ``*.gz``."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def iter_jsonl(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(where, row)`` for every non-blank line, ``where`` being ``"<path> line <n>"`` (1-based)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    with open_text(path) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path} line {number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
            yield where, row


def read_json_list(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(where, record)`` for a file holding one JSON list of objects; ``where`` names the record."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    with open_text(path) as handle:
        try:
            data = json.load(handle)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} line {exc.lineno}: invalid JSON ({exc.msg})") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    for index, record in enumerate(data):
        where = f"{path} record {index}"
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
        yield where, record


_MISSING = object()


def require(row: dict[str, Any], name: str, where: str, kind: type | tuple[type, ...]) -> Any:
    """``row[name]``, checked to be of ``kind``; a clear ValueError naming ``where`` and the field if not."""
    value = row.get(name, _MISSING)
    if value is _MISSING:
        raise ValueError(f"{where}: field '{name}' is missing")
    kinds = _kinds(kind)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        expected = " or ".join(k.__name__ for k in kinds)
        raise ValueError(
            f"{where}: field '{name}' must be {expected}, got {type(value).__name__}: {value!r:.80}"
        )
    if isinstance(value, str) and not value.strip():
        raise ValueError(f"{where}: field '{name}' is empty")
    return value


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def string_list(values: list[Any], where: str, name: str) -> list[str]:
    """Check that every item of the list field ``name`` is a string."""
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise ValueError(f"{where}: field '{name}' item {i} must be a string, got {type(value).__name__}")
    return list(values)


def answers_from(value: Any, where: str, name: str) -> list[str]:
    """Gold answers from a field that holds a string, a number or a list of those."""
    items = value if isinstance(value, list) else [value]
    answers = []
    for i, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            label = f"field '{name}'" if not isinstance(value, list) else f"field '{name}' item {i}"
            raise ValueError(f"{where}: {label} must be a string or a number, got {type(item).__name__}")
        text = item.strip() if isinstance(item, str) else _format_number(item)
        if text:
            answers.append(text)
    return answers


def _format_number(value: int | float) -> str:
    # repr keeps every digit of a float gold (1.42403), and "3.0" becomes "3" so text metrics agree too.
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value)


def collapse_whitespace(text: str) -> str:
    return " ".join(text.split())


# ----------------------------------------------------------------------------------------------------
# Determinism


def stable_int(*parts: object) -> int:
    """A 64-bit integer from ``parts`` that is the same in every process (unlike the salted ``hash()``)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def stable_rng(*parts: object) -> random.Random:
    """A :class:`random.Random` seeded from :func:`stable_int` of ``parts``."""
    return random.Random(stable_int(*parts))


def seeded_subset(examples: list[Example], limit: int | None, seed: int) -> list[Example]:
    """At most ``limit`` examples, a seeded random choice kept in file order (all of them if None)."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if limit is None or limit >= len(examples):
        return examples
    chosen = sorted(stable_rng("subset", seed).sample(range(len(examples)), limit))
    return [examples[i] for i in chosen]
