"""Answer extraction and scoring.

Extraction is written by hand because it must cope with nested braces (``\\boxed{\\frac{1}{2}}``), which a
regular expression cannot match.
"""

from __future__ import annotations

import re

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (brace-balanced), or None if there is none.

    An unclosed last ``\\boxed{`` is ignored in favour of the previous complete one.
    """
    found = None
    for match in _BOXED.finditer(text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            ch = text[i]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    found = text[start:i]
                    break
    return found.strip() if found is not None else None


def extract_tagged(text: str, tag: str = "answer") -> str | None:
    """Content of the last complete ``<tag>...</tag>`` in ``text``, or None."""
    matches = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
    return matches[-1].strip() if matches else None
