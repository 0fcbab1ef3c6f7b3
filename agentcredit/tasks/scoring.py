"""Answer extraction and scoring.

Every scorer takes a prediction (``None`` when the model gave no answer: it scores 0) and the gold answers
(one string or a list of aliases; the score is the max over aliases) and returns a float in [0, 1].

* :func:`exact_match` / :func:`f1_score`: SQuAD-style normalisation, as Search-R1, TIPS and carl-segment
  use it (tips.md section 5; carl-segment.md section 6.4). F1 is the bag-of-tokens F1.
* :func:`substring_match`: carl-segment's eval-time rule (paper section 4.1, carl-segment.md §6.4 and A16).
* :func:`set_f1_score` and :func:`passes_action_format`: carl-critical's reward, i.e. ASearcher's
  set-based F1 and per-action format gate (carl-critical-actions.md section 2.5).
* :func:`numeric_match`: GSM8K (absolute tolerance 1e-6) and FinQA-style (relative tolerance 1e-2 and
  percent forms) numeric equality (carl-segment.md A16).
* :func:`math_equal`: symbolic equivalence through the ``math-verify`` package (GEAR's math reward,
  gear.md section 6.5), falling back to :func:`numeric_match` when that optional package is missing.
* :func:`is_abstention` and :func:`outcome_with_abstention`: the +1 / 0 / -1 outcome of PORTool
  (portool.md section 3.1), with a rule in place of the paper's LLM judge.

Extraction is written by hand because it must cope with nested braces (``\\boxed{\\frac{1}{2}}``), which a
regular expression cannot match.
"""

from __future__ import annotations

import re
import string
import threading
import warnings
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

Golds = str | Sequence[str]

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


# ----------------------------------------------------------------------------------------------------
# Normalisation


_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 normalisation: lower-case, drop ASCII punctuation, drop articles, collapse whitespace.

    Kept byte-for-byte equivalent to the official SQuAD / Search-R1 script (only ASCII punctuation is
    removed, so a curly apostrophe survives) so that numbers stay comparable with published ones.
    """
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _as_golds(golds: Golds) -> list[str]:
    if isinstance(golds, str):
        return [golds]
    gold_list = list(golds)
    for i, gold in enumerate(gold_list):
        if not isinstance(gold, str):
            raise ValueError(f"gold answer {i} must be a string, got {type(gold).__name__}: {gold!r}")
    return gold_list


# ----------------------------------------------------------------------------------------------------
# Text metrics


def exact_match(prediction: str | None, golds: Golds) -> float:
    """1.0 if the normalised prediction equals any normalised gold alias, else 0.0."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _as_golds(golds)))


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    # As the official SQuAD v1.1 and HotpotQA scripts: no common token -> 0, including when both sides
    # normalise to nothing ("the" vs "a"), where exact match is 1. So EM <= F1 holds only for non-empty golds.
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str | None, golds: Golds) -> float:
    """SQuAD bag-of-tokens F1 (token counts intersect as multisets), max over gold aliases.

    This is the F1 of Search-R1 and TIPS (tips.md section 5): 2|pred ∩ gold| / (|pred| + |gold|). As in the
    official SQuAD and HotpotQA scripts, a prediction and a gold that share no token score 0, even when both
    normalise to the empty string (then :func:`exact_match` is 1).
    """
    if prediction is None:
        return 0.0
    pred_tokens = normalize_answer(prediction).split()
    return max(_token_f1(pred_tokens, normalize_answer(g).split()) for g in _as_golds(golds))


def is_multiword(gold: str) -> bool:
    """carl-segment's "multi-word" (spec 6.4 [R]): the normalised gold has at least two tokens."""
    return len(normalize_answer(gold).split()) >= 2


def substring_match(prediction: str | None, golds: Golds) -> float:
    """carl-segment's eval-time EM: exact match, or a multi-word gold inside the normalised prediction.

    The paper (section 4.1): "For multi-word entity answers, we also accept predictions whose normalized
    form contains the normalized gold as a substring." The containment is a plain character substring, as
    written (so gold "new york" is accepted in "new yorker"); single-word golds still need an exact match,
    because a one-word substring rule would accept "1" inside "1985".
    """
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    for gold in _as_golds(golds):
        norm_gold = normalize_answer(gold)
        if pred == norm_gold or (len(norm_gold.split()) >= 2 and norm_gold in pred):
            return 1.0
    return 0.0


# ----------------------------------------------------------------------------------------------------
# carl-critical (ASearcher) reward pieces


def _bool_mapping(text: str) -> str:
    # ASearcher maps Python-style booleans to yes/no before normalising (only these exact strings).
    return {"True": "yes", "False": "no"}.get(text, text)


def _normalize_set_f1(text: str) -> str:
    # ASearcher's F1 normalisation differs from SQuAD's: punctuation becomes a space and articles stay.
    text = _bool_mapping(text)
    text = "".join(" " if ch in _PUNCTUATION else ch for ch in text)
    return " ".join(text.split()).lower()


def _set_f1(prediction: str, gold: str) -> float:
    pred, ref = set(_normalize_set_f1(prediction).split()), set(_normalize_set_f1(gold).split())
    if not pred or not ref:
        return 0.0
    common = len(pred & ref)
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def set_f1_score(prediction: str | None, golds: Golds, *, aug_golds: Golds | None = None) -> float:
    """carl-critical's answer reward: ASearcher's set-based F1, max over golds (carl-critical-actions.md §2.5).

    Tokens are the *set* of whitespace words after ASearcher's normalisation (lower-case, every punctuation
    character becomes a space, "True"/"False" become "yes"/"no"); an empty side scores 0. With
    ``aug_golds`` (the item's ``aug_answer``) the score is ``0.7 F1(gold) + 0.3 max(F1(aug), F1(gold))``.
    """
    if prediction is None:
        return 0.0
    base = max(_set_f1(prediction, g) for g in _as_golds(golds))
    if aug_golds is None:
        return base
    aug = max(_set_f1(prediction, g) for g in _as_golds(aug_golds))
    return 0.7 * base + 0.3 * max(aug, base)


def passes_action_format(action: str) -> bool:
    """carl-critical's per-action format check (ASearcher's ``correct_format_fn``, carl-critical-actions.md §2.5).

    Balanced ``<search>``/``<access>``/``<answer>`` tags, at most one of them opened, at most one
    ``</think>``, and no "Assistant"/"assistant" (a sign the model started a new chat turn). The outcome
    reward of a chain is its F1 times 1[every action passes].
    """
    opens = {tag: action.count(f"<{tag}>") for tag in ("search", "access", "answer")}
    return (
        all(opens[tag] == action.count(f"</{tag}>") for tag in opens)
        and sum(opens.values()) <= 1
        and action.count("</think>") <= 1
        and "assistant" not in action
        and "Assistant" not in action
    )


def format_gated_f1(prediction: str | None, golds: Golds, actions: Sequence[str]) -> float:
    """carl-critical's training reward: "a format reward with an F1-based answer reward" (carl-critical-actions.txt
    l. 513), as ASearcher combines them (carl-critical-actions.md §2.5): :func:`set_f1_score` times 1[every action
    of the episode passes :func:`passes_action_format`]; 0 without an answer."""
    if not all(passes_action_format(a) for a in actions):
        return 0.0
    return set_f1_score(prediction, golds)


# ----------------------------------------------------------------------------------------------------
# Numbers


# A number with optional thousands separators ("1,234"), decimals and an exponent.
_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:[eE][-+]?\d+)?|[-+]?\.\d+(?:[eE][-+]?\d+)?"
_NUMBER_RE = re.compile(_NUMBER)
_FRACTION = re.compile(rf"([-+]?)\\[dt]?frac\{{({_NUMBER})\}}\{{({_NUMBER})\}}|({_NUMBER})/({_NUMBER})")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_LATEX_NOISE = re.compile(r"\\[,!;: ]|\\left|\\right|\^\\circ|\^\{\\circ\}|\\\$|\\%|[$%€£]")


_MAX_EXPONENT = 400  # "1e999999999" in model output must not build a billion-digit integer


def _to_fraction(token: str) -> Fraction | None:
    """The token as an exact Fraction, or None for absurd sizes (model text is untrusted)."""
    token = token.replace(",", "").lstrip("+")
    _, _, exponent = token.lower().partition("e")
    if exponent and abs(int(exponent)) > _MAX_EXPONENT:
        return None
    try:
        return Fraction(token)
    except ValueError:  # more digits than Python's int/str conversion limit (4,300)
        return None


def _clean_numeric_text(text: str) -> str:
    if "####" in text:  # GSM8K: the final answer follows the last "####"
        text = text.rsplit("####", 1)[1]
    boxed = extract_boxed(text)
    if boxed is not None:
        text = boxed
    text = _TEXT_WRAPPER.sub(r"\1", text)
    text = text.replace("{,}", ",").replace("\u2212", "-")  # LaTeX thousands separator, unicode minus
    text = _LATEX_NOISE.sub("", text)
    return text.strip().rstrip(".").strip()


def parse_number(text: str, *, strict: bool = False) -> Fraction | None:
    """The number a short answer states, as an exact :class:`~fractions.Fraction`, or None.

    Understands GSM8K's ``#### 1,234``, a ``\\boxed{}`` wrapper, ``$`` / ``%`` / ``\\text{}`` decoration,
    thousands commas, ``\\frac{a}{b}`` and ``a/b``, a trailing full stop and ``18.00`` == ``18``. With
    ``strict=False`` an answer that is not just a number ("18 dollars") falls back to the *last* number in
    the text, the usual "flexible" GSM8K rule; ``strict=True`` returns None instead.
    """
    cleaned = _clean_numeric_text(text)
    fraction = _FRACTION.fullmatch(cleaned)
    if fraction is not None:
        sign, num, den, num2, den2 = fraction.groups()
        numerator, denominator = _to_fraction(num or num2), _to_fraction(den or den2)
        if numerator is None or denominator is None or denominator == 0:
            return None
        value = numerator / denominator
        return -value if sign == "-" else value
    if _NUMBER_RE.fullmatch(cleaned):
        return _to_fraction(cleaned)
    if strict:
        return None
    found = _NUMBER_RE.findall(cleaned)
    return _to_fraction(found[-1].rstrip(".")) if found else None


def _close(a: Fraction, b: Fraction, rel_tol: float, abs_tol: float) -> bool:
    diff = abs(a - b)
    return diff <= Fraction(abs_tol) or diff <= Fraction(rel_tol) * max(abs(a), abs(b))


def numeric_match(
    prediction: str | None,
    golds: Golds,
    *,
    rel_tol: float = 0.0,
    abs_tol: float = 1e-6,
    percent_forms: bool = False,
) -> float:
    """1.0 if the prediction's number equals a gold number within tolerance, else 0.0.

    Defaults are carl-segment's GSM8K rule (A16): |a - b| <= 1e-6 after stripping ``,``, ``$`` and ``%``.
    For FinQA use ``rel_tol=1e-2, percent_forms=True`` (also accepts the prediction at x100 or /100, the
    same quantity written as a percentage or a fraction). Comparison is exact (rational arithmetic), so
    large integers never collide through float rounding. A gold that is not a number raises ValueError.
    """
    if prediction is None:
        return 0.0
    pred = parse_number(prediction)
    if pred is None:
        return 0.0
    for gold_text in _as_golds(golds):
        gold = parse_number(gold_text, strict=True)
        if gold is None:
            raise ValueError(f"gold answer {gold_text!r} is not a number; use a text metric (em, f1) for it")
        candidates = (gold, gold * 100, gold / 100) if percent_forms else (gold,)
        if any(_close(pred, g, rel_tol, abs_tol) for g in candidates):
            return 1.0
    return 0.0


_MATH_VERIFY_WARNED = False


def math_equal(prediction: str | None, golds: Golds) -> float:
    """GEAR's math reward (gear.md 6.5): symbolic equivalence of the answer with a gold, via ``math-verify``.

    ``math-verify`` (the optional ``math`` extra) parses LaTeX and compares with sympy. Without it, this
    falls back to :func:`numeric_match` or, for a non-numeric gold, to :func:`exact_match`, with a
    one-time warning, so numbers stay right and symbolic answers (``\\sqrt{2}``) are only compared as text.
    """
    if prediction is None:
        return 0.0
    gold_list = _as_golds(golds)
    try:
        from math_verify import parse, verify
    except ImportError:
        global _MATH_VERIFY_WARNED
        if not _MATH_VERIFY_WARNED:
            warnings.warn(
                "math-verify is not installed (pip install -e '.[math]' in the agentcredit checkout); math_equal compares "
                "numbers and falls back to exact match for symbolic answers",
                stacklevel=2,
            )
            _MATH_VERIFY_WARNED = True
        for gold in gold_list:
            if parse_number(gold, strict=True) is not None:
                matched = numeric_match(prediction, gold)
            else:
                matched = exact_match(prediction, gold)
            if matched:
                return 1.0
        return 0.0
    # math-verify times out through signal.alarm, which only works in the main thread.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    pred_text = prediction if "$" in prediction or "\\boxed" in prediction else f"${prediction}$"
    pred_parsed = parse(pred_text, parsing_timeout=timeout)
    for gold in gold_list:
        gold_text = gold if "$" in gold or "\\boxed" in gold else f"${gold}$"
        if verify(parse(gold_text, parsing_timeout=timeout), pred_parsed, timeout_seconds=timeout):
            return 1.0
    return 0.0


# ----------------------------------------------------------------------------------------------------
# Abstention (PORTool's "unable_to_answer")


ABSTENTION_PATTERNS: tuple[str, ...] = (
    r"\bunable[ _]to[ _](?:answer|determine|find|provide|say|tell|locate|verify)\b",
    r"\b(?:can ?not|can't|could not|couldn't|(?:am|was|were) not able to|not able to)\s+"
    r"(?:answer|determine|find|provide|say|tell|locate|verify|be (?:determined|answered|found))\b",
    r"\bi (?:do not|don't) know\b",
    r"\b(?:not enough|insufficient|no relevant|no available) (?:information|data|evidence|context)\b",
    r"\bunanswerable\b",
    r"^(?:unknown|n/?a|no answer)[.!]?$",
)
_ABSTENTION_RE = re.compile("|".join(ABSTENTION_PATTERNS))


def is_abstention(text: str) -> bool:
    """True if the answer declines to answer ("unable to answer", "I don't know", "not enough information").

    A rule-based stand-in for the judge's ``unable_to_answer`` label (portool.md 3.1) and for carl-segment's
    "non-abstaining" wrong answers (A24). An empty answer is not an abstention: it is a missing answer.
    """
    lowered = " ".join(text.lower().replace("\u2019", "'").split())
    return bool(_ABSTENTION_RE.search(lowered))


# ----------------------------------------------------------------------------------------------------
# Dispatch


def _finqa_match(prediction: str | None, golds: Golds) -> float:
    return numeric_match(prediction, golds, rel_tol=1e-2, percent_forms=True)


_METRICS = {
    "em": exact_match,
    "f1": f1_score,
    "set_f1": set_f1_score,
    "substring": substring_match,
    "numeric": numeric_match,
    "finqa": _finqa_match,
    "math": math_equal,
}
METRICS: tuple[str, ...] = tuple(_METRICS)


def score(prediction: str | None, golds: Golds, *, metric: str = "em") -> float:
    """Score ``prediction`` against ``golds`` with the named metric.

    ``em`` exact match, ``f1`` SQuAD F1, ``set_f1`` carl-critical's F1, ``substring`` carl-segment's eval
    EM (EM plus the multi-word substring rule), ``numeric`` GSM8K numeric equality, ``finqa`` FinQA numeric
    equality (relative tolerance 1e-2, percent forms), ``math`` symbolic equivalence.
    """
    try:
        fn = _METRICS[metric]
    except KeyError:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}") from None
    return fn(prediction, golds)


def answer_reward(
    prediction: str | None, golds: Golds, *, metric: str = "em", format_bonus: float = 0.0
) -> float:
    """The outcome reward of an episode in both trainers: ``score(prediction, golds, metric)`` in [0, 1], plus
    ``format_bonus`` when an answer was given (TIPS's released training reward: EM + 0.2); 0 with no answer."""
    if prediction is None:
        return 0.0
    return score(prediction, golds, metric=metric) + format_bonus


def outcome_with_abstention(
    prediction: str | None,
    golds: Golds,
    *,
    metric: str = "em",
    unfinished: float = -1.0,
) -> float:
    """PORTool's outcome reward (portool.md 3.1) with a rule in place of the LLM judge: +1 / 0 / -1.

    +1 if ``score(prediction, golds, metric=metric) == 1``; 0 if the answer abstains (:func:`is_abstention`)
    without being correct; -1 otherwise. ``prediction=None`` (the episode never produced an answer, e.g.
    the step cap was hit) gets ``unfinished``: the spec's [R] default is -1, configurable to 0.
    """
    if prediction is None:
        return unfinished
    if score(prediction, golds, metric=metric) >= 1.0:
        return 1.0
    return 0.0 if is_abstention(prediction) else -1.0
