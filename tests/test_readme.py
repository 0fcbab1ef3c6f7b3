"""The README's code example runs and says what the README says it returns."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_credit_example_runs_and_matches_its_comments():
    block = re.search(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL).group(1)
    scope: dict = {}
    exec(compile(block, str(README), "exec"), scope)  # noqa: S102 - our own README
    seg = scope["segment_advantages"]([0.40, 0.70, 0.50], reward=1.0)
    assert seg == pytest.approx([0.30, -0.20, 0.50])
    assert sum(seg) == pytest.approx(1.0 - 0.40)
    assert scope["update"] == [False, True, True, True, True]
    assert scope["adv"] == pytest.approx([0.0, -0.25, 0.25, -0.5, 0.5])


def test_readme_stays_short():
    """What it is, the two commands, a quick start, the tables and links; measurements live in docs/results."""
    assert len(README.read_text()) <= 12_000
