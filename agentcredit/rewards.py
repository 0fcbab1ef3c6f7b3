"""The outcome reward of an episode: the task's own scoring rule, carl-critical's format-gated F1, or your functions.

* :func:`outcome_reward`: :func:`~agentcredit.tasks.scoring.answer_reward` under the example's scoring rule (or the
  config's ``task.metric``), BFCL's checker for BFCL examples.
* :class:`FormatGatedF1`: ``task.metric: set_f1_format`` (it reads the episode's actions).
* :class:`UserReward` / :class:`WeightedReward`: ``task.reward`` (verl's or TRL's signature; a weighted list).

:func:`~agentcredit.environment.build_environment` picks one from a config; the rollout engine calls it on each
finished episode (:func:`~agentcredit.rollout.engine.episode_reward`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from agentcredit.tasks import Example, bfcl
from agentcredit.tasks.scoring import answer_reward, format_gated_f1
from agentcredit.tools.base import UserCodeError

if TYPE_CHECKING:
    from agentcredit.config import Config

# Outcome reward of one episode: (example, extracted final answer or None when the episode gave none) -> reward
RewardFn = Callable[[Example, str | None], float]


def example_metric(example: Example, override: str = "auto") -> str:
    """The scoring rule of an example: the config's, or the task's own (numeric for math, EM for QA)."""
    if override != "auto":
        return override
    return example.info.get("metric", "em")


def outcome_reward(
    example: Example, answer: str | None, *, metric: str = "auto", format_bonus: float = 0.0
) -> float:
    """:func:`~agentcredit.tasks.scoring.answer_reward` with the example's scoring rule; a BFCL example (metric
    ``bfcl``) is scored by BFCL's own checker, 1.0 or 0.0 (:func:`~agentcredit.tasks.bfcl.bfcl_reward`)."""
    if example.info.get("metric") == "bfcl":
        if metric != "auto":
            raise ValueError(
                f"task.metric={metric!r}: BFCL examples are scored by BFCL's checker only; leave task.metric 'auto'"
            )
        return bfcl.bfcl_reward(example, answer)
    return answer_reward(
        answer, example.answers, metric=example_metric(example, metric), format_bonus=format_bonus
    )


class FormatGatedF1:
    """``task.metric: set_f1_format``, carl-critical's training reward (carl-critical-actions.txt l. 513): set-F1 of
    the answer times 1[every action passes ASearcher's format check] (:func:`~agentcredit.tasks.scoring.
    format_gated_f1`), plus ``format_bonus`` when an answer was given. It reads the episode's actions, which
    :func:`~agentcredit.rollout.engine.episode_reward` passes to ``score_actions``."""

    def __init__(self, format_bonus: float = 0.0):
        self.format_bonus = format_bonus

    def score_actions(self, example: Example, answer: str | None, actions: Sequence[str]) -> float:
        if answer is None:
            return 0.0
        return format_gated_f1(answer, example.answers, actions) + self.format_bonus

    def __call__(self, example: Example, answer: str | None) -> float:
        raise ValueError(
            "task.metric=set_f1_format scores an episode's actions (its format gate); this caller gives the answer "
            "only: score the episode with agentcredit.rollout.engine.episode_reward"
        )


class UserReward:
    """Your own outcome reward (``task.reward: "package.module:function"``), with verl's or TRL's signature.

    Both read the episode as a verl or TRL reward reads a response: ``solution`` below is what the episode appended
    after its prompt (every message and tool result), decoded with ``skip_special_tokens=True``.

    * verl (``custom_reward_function``): ``fn(data_source, solution_str, ground_truth, extra_info)`` returning a
      number or a dict with a ``"score"``. ``data_source`` is the example's task, ``solution_str`` the solution,
      ``ground_truth`` the example's ``info["ground_truth"]`` when its task file gives one (on verl: the row's
      ``reward_model.ground_truth``), else its answer (the list of aliases when it has several), ``extra_info``
      its ``info`` (with ``id`` and ``question`` where it has none) plus ``extracted_answer``, what the protocol
      read as the final answer (or None).
    * TRL (``reward_funcs``): ``fn(completions, **kwargs)`` returning a list of numbers. It is called with one
      episode: ``completions=[solution]``, ``completion_ids=[ids]``, ``prompts=[question]``,
      ``ground_truth=[...]``, ``extracted_answer=[...]`` and every ``info`` field as a one-element list, as TRL
      passes dataset columns (``trainer_state`` is not passed).

    A reward that raises, or returns anything but one real number (a numpy or torch scalar counts; TRL's None,
    "no reward for this sample", does not: an episode's outcome needs one), stops the command with an error naming
    the function and the example: a broken reward must not be trained on.
    """

    def __init__(self, spec: str):
        import inspect

        from agentcredit.tools.functions import load_function

        self.spec = spec
        self.fn = load_function(spec, field="task.reward")
        try:
            params = inspect.signature(self.fn).parameters
        except (TypeError, ValueError) as exc:
            raise ValueError(f"task.reward: {spec}: cannot read its signature ({exc})") from exc
        if "solution_str" in params:
            self.style = "verl"
        elif "completions" in params:
            self.style = "trl"
        else:
            raise ValueError(
                f"task.reward: {spec} takes ({', '.join(params)}); a reward function takes verl's "
                "(data_source, solution_str, ground_truth, extra_info) or TRL's (completions, **kwargs)"
            )

    def __call__(self, example: Example, answer: str | None) -> float:
        raise TypeError(f"task.reward {self.spec} reads the whole episode: call score_episode")

    def score_episode(
        self, example: Example, answer: str | None, solution: str, token_ids: Sequence[int] = ()
    ) -> float:
        answers = example.answers
        truth = example.info.get("ground_truth", answers[0] if len(answers) == 1 else answers)
        where = f"task.reward {self.spec} on example {example.id!r}"
        try:
            if self.style == "verl":
                extra = {
                    "id": example.id,
                    "question": example.question,
                    **example.info,
                    "extracted_answer": answer,
                }
                out = self.fn(
                    data_source=example.task, solution_str=solution, ground_truth=truth, extra_info=extra
                )
                out = out.get("score") if isinstance(out, dict) else out
            else:
                columns = {k: [v] for k, v in example.info.items()}
                columns.update(
                    prompts=[example.question], completion_ids=[list(token_ids)], ground_truth=[truth],
                    extracted_answer=[answer],
                )  # fmt: skip
                scores = self.fn(completions=[solution], **columns)
                if isinstance(scores, str | bytes) or not hasattr(scores, "__len__") or len(scores) != 1:
                    raise ValueError(f"returned {scores!r}, not a list with one number per completion")
                out = scores[0]
        except Exception as exc:
            raise UserCodeError(f"{where} raised {type(exc).__name__}: {exc}") from exc
        if hasattr(out, "item") and not isinstance(out, numbers.Real):  # a one-element torch or numpy array
            out = out.item()
        if isinstance(out, bool) or not isinstance(out, numbers.Real) or not math.isfinite(out):
            raise UserCodeError(f"{where} returned {out!r}; a reward must be one finite number")
        return float(out)


class WeightedReward:
    """``task.reward`` as a list of functions with ``task.reward_weights``: TRL's ``reward_funcs`` and
    ``reward_weights`` (``GRPOConfig``: the reward is the weighted sum of the functions' rewards, weights 1.0 by
    default). Each function is a :class:`UserReward` (verl's or TRL's signature, errors named the same way);
    :meth:`score_parts` gives each one's value, which the engine records on the episode (``reward_parts``) and the
    trainer logs per step as ``rewards/<function>/mean`` (TRL's metric names)."""

    def __init__(self, specs: Sequence[str], weights: Sequence[float] | None = None):
        if not specs:
            raise ValueError("task.reward: an empty list names no reward function")
        self.parts = [UserReward(spec) for spec in specs]
        self.weights = [float(w) for w in weights] if weights is not None else [1.0] * len(specs)
        if len(self.weights) != len(self.parts):
            raise ValueError(
                f"task.reward_weights: {len(self.weights)} weights for {len(self.parts)} functions"
            )
        short = [getattr(p.fn, "__name__", p.spec) for p in self.parts]
        # a function's own name (TRL's metric name), or its whole spec where two share a name
        self.names = [n if short.count(n) == 1 else p.spec for n, p in zip(short, self.parts, strict=True)]
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"task.reward lists a function twice: {list(specs)}")

    def __call__(self, example: Example, answer: str | None) -> float:
        raise TypeError("task.reward's functions read the whole episode: call score_episode")

    def score_parts(
        self, example: Example, answer: str | None, solution: str, token_ids: Sequence[int] = ()
    ) -> dict[str, float]:
        """Each function's reward (unweighted), by name."""
        return {
            name: part.score_episode(example, answer, solution, token_ids)
            for name, part in zip(self.names, self.parts, strict=True)
        }

    def combine(self, parts: dict[str, float]) -> float:
        """The weighted sum of :meth:`score_parts`."""
        return float(sum(w * parts[n] for n, w in zip(self.names, self.weights, strict=True)))

    def score_episode(
        self, example: Example, answer: str | None, solution: str, token_ids: Sequence[int] = ()
    ) -> float:
        return self.combine(self.score_parts(example, answer, solution, token_ids))


def user_reward(
    spec: str | Sequence[str], weights: Sequence[float] | None = None
) -> UserReward | WeightedReward:
    """``task.reward`` (and ``task.reward_weights``) as the reward object: one function, or a weighted list."""
    if isinstance(spec, str) and weights is None:
        return UserReward(spec)
    return WeightedReward([spec] if isinstance(spec, str) else list(spec), weights)


def outcome_judge(config: Config) -> Any | None:
    """The settings of the method part whose judge scores the outcomes (PORTool's ``judge``, ``judge_model``,
    ``unfinished_reward``), or None when no judge does: ``task.reward`` or ``task.metric: set_f1_format`` is set,
    or the method has no judge."""
    if config.task.reward is not None or config.task.metric == "set_f1_format":
        return None
    method = config.algorithm.credit_method
    if method.all_needs.reward != "judge":
        return None
    return next(
        method.settings_from(config.algorithm)[part.section]
        for part in method.parts
        if part.needs.reward == "judge"
    )


def task_reward(config: Config, judge_model: tuple[Any, Any] | None = None) -> RewardFn:
    """The outcome reward ``config`` names: ``task.reward`` (:func:`user_reward`), else ``task.metric:
    set_f1_format`` (:class:`FormatGatedF1`), else the method's judge (:func:`~agentcredit.tasks.judge.build_judge`;
    an LLM judge scores with ``judge_model``, its (model, tokenizer): the one given, else the model its settings'
    ``judge_model`` names, loaded here and handed to the judge), else :func:`outcome_reward` under ``task.metric``."""
    if config.task.reward is not None:
        return user_reward(config.task.reward, config.task.reward_weights)
    if config.task.metric == "set_f1_format":
        if config.algorithm.credit_method.all_needs.reward == "judge":
            raise ValueError(
                "task.metric=set_f1_format: this method scores outcomes with its judge (+1 / 0 / -1); choose em, f1 "
                "or set_f1"
            )
        return FormatGatedF1(config.task.format_bonus)
    judge = outcome_judge(config)
    if judge is not None:
        from agentcredit.tasks.judge import build_judge

        if judge_model is None and judge.judge == "llm" and judge.judge_model:
            from agentcredit.models.embedded import load_model

            judge_model = load_model(judge.judge_model)

        method = config.algorithm.credit_method
        section = next(part.section for part in method.parts if part.needs.reward == "judge")
        return build_judge(
            judge.judge,
            judge_model,
            metric=config.task.metric,
            unfinished=judge.unfinished_reward,
            setting=f"algorithm.{section}.judge",
        )
    return partial(outcome_reward, metric=config.task.metric, format_bonus=config.task.format_bonus)
