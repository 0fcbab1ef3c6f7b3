"""Tasks: benchmark loaders, synthetic task generators, answer extraction and scoring.

Start with :func:`load_task` (``load_task("hotpotqa", limit=200)``), :func:`task_corpus` (the BM25 corpus
that goes with a task) and :func:`score` (``score(prediction, example.answers, metric=example.metric)``).
"""

from agentcredit.tasks.example import Example
from agentcredit.tasks.kb import build_world, kb_corpus, write_kb_corpus
from agentcredit.tasks.registry import (
    TASKS,
    SampleDataWarning,
    TaskSpec,
    list_tasks,
    load_examples,
    load_task,
    task_corpus,
)
from agentcredit.tasks.scoring import (
    METRICS,
    exact_match,
    extract_boxed,
    extract_tagged,
    f1_score,
    is_abstention,
    math_equal,
    normalize_answer,
    numeric_match,
    outcome_with_abstention,
    parse_number,
    passes_action_format,
    score,
    set_f1_score,
    substring_match,
)

__all__ = [
    "METRICS",
    "TASKS",
    "Example",
    "SampleDataWarning",
    "TaskSpec",
    "build_world",
    "exact_match",
    "extract_boxed",
    "extract_tagged",
    "f1_score",
    "is_abstention",
    "kb_corpus",
    "list_tasks",
    "load_examples",
    "load_task",
    "math_equal",
    "normalize_answer",
    "numeric_match",
    "outcome_with_abstention",
    "parse_number",
    "passes_action_format",
    "score",
    "set_f1_score",
    "substring_match",
    "task_corpus",
    "write_kb_corpus",
]
