"""PORTool's outcome judge: true (+1) / false (-1) / unable to answer (0), pluggable (portool.md §3.1, §5.2).

* :func:`rule_judge` (default): EM / F1 / numeric match against the gold answers; an abstaining answer ("I cannot
  find ...") is "unable to answer"; no answer at all is unfinished (``unfinished``: -1 by default, portool.md 8.13;
  the paper's judge labels only finished trajectories, true / false / unable_to_answer = +1 / -1 / 0).
* :class:`LLMJudge`: any local causal LM (loaded by the caller) asked to label the final response against the gold answers with the
  spec's JSON output; the label is parsed from its greedy reply, and an unparseable reply falls back to the rule
  judge (counted in ``fallbacks``). The paper's judge (GPT-4o with tools) also reads the trajectory; here it sees
  the question, the gold answers and the final response, which is what the engine's reward hook receives.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from agentcredit.tasks.example import Example
from agentcredit.tasks.scoring import outcome_with_abstention

LABEL_REWARD = {"true": 1.0, "false": -1.0, "unable_to_answer": 0.0}

JUDGE_PROMPT = """You are an evaluation agent. Decide whether the agent's final response answers the query.

Query: {question}
Reference answer(s): {golds}
Agent's final response: {response}

Answer "true" if the response correctly and sufficiently answers the query, "unable_to_answer" if the response says
the information could not be found, and "false" otherwise. Output JSON only:
{{"label": "true" | "false" | "unable_to_answer", "rationale": "<one sentence>"}}"""


def rule_judge(
    example: Example, answer: str | None, *, metric: str = "auto", unfinished: float = -1.0
) -> float:
    """+1 correct, 0 abstained, -1 wrong, ``unfinished`` without an answer; ``auto`` = the example's own metric
    (numeric for math)."""
    m = metric if metric != "auto" else example.info.get("metric", "em")
    return outcome_with_abstention(answer, example.answers, metric=m, unfinished=unfinished)


def parse_label(reply: str) -> str | None:
    """The label of a judge reply: the JSON ``label`` field, else the first label word; None if neither."""
    match = re.search(r"\{.*\}", reply, flags=re.DOTALL)
    if match:
        try:
            label = json.loads(match.group(0)).get("label")
            if label in LABEL_REWARD:
                return label
        except (json.JSONDecodeError, AttributeError):
            pass
    found = re.search(r"\b(unable_to_answer|true|false)\b", reply.lower())
    return found.group(1) if found else None


class LLMJudge:
    """A local model as PORTool's judge; ``judge(example, answer)`` returns +1 / 0 / -1. The caller loads the model
    and its tokenizer (:func:`agentcredit.rewards.task_reward` from ``judge_model``)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_new_tokens: int = 64,
        metric: str = "auto",
        unfinished: float = -1.0,
    ):
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens = max_new_tokens
        self.metric = metric
        self.unfinished = unfinished
        self.fallbacks = 0
        self._lock = threading.Lock()  # the engine may score episodes from several threads

    def reply(self, example: Example, answer: str) -> str:
        import torch

        messages = [
            {
                "role": "user",
                "content": JUDGE_PROMPT.format(
                    question=example.question, golds="; ".join(example.answers), response=answer
                ),
            }
        ]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = self.tokenizer(text, return_tensors="pt", add_special_tokens=False)
        with self._lock, torch.no_grad():
            out = self.model.generate(
                **ids,
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        return self.tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)

    def __call__(self, example: Example, answer: str | None) -> float:
        if answer is None:
            return self.unfinished  # no response to judge (portool.md 8.13)
        label = parse_label(self.reply(example, answer))
        if label is None:
            self.fallbacks += 1
            return rule_judge(example, answer, metric=self.metric, unfinished=self.unfinished)
        return LABEL_REWARD[label]


def build_judge(
    kind: str,
    model: tuple[Any, Any] | None = None,
    *,
    metric: str = "auto",
    unfinished: float = -1.0,
    setting: str = "judge",
) -> Any:
    """The judge ``kind`` names; ``model`` is the LLM judge's (model, tokenizer), loaded by the caller;
    ``unfinished`` is R_out of an episode cut at the step cap (no answer); ``setting`` is the config key that
    chose the judge (``algorithm.<section>.judge``), which an error names with its ``_model`` key."""
    if kind == "rule":
        return lambda example, answer: rule_judge(example, answer, metric=metric, unfinished=unfinished)
    if kind == "llm":
        if model is None:
            raise ValueError(f"{setting}='llm' needs {setting}_model (a local model path)")
        return LLMJudge(*model, metric=metric, unfinished=unfinished)
    raise ValueError(f"judge must be 'rule' or 'llm', got {kind!r}")
