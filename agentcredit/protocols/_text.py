"""Small text helpers shared by the protocols (tail checks for per-token stop detection)."""

from __future__ import annotations

from collections.abc import Iterable

#: How many characters before a stop string segment_ends looks at. The engine calls segment_ends after every
#: token, so a new stop string must end inside the last token; no tokenizer we know has tokens this long.
TAIL_WINDOW = 128


def tail_contains(text: str, stops: Iterable[str], window: int = TAIL_WINDOW) -> bool:
    """True if one of ``stops`` occurs in the last ``window + len(stop)`` characters of ``text``.

    Constant time per call however long ``text`` grows: this is what makes per-token stop checks cheap.
    """
    for stop in stops:
        if stop in text[-(window + len(stop)) :]:
            return True
    return False
