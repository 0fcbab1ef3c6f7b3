"""Supervised fine-tuning on demonstrations in a protocol's format (what RL starts from on a small model).

Demonstrations come from either
* a scripted policy (:mod:`agentcredit.train.demos`) played through the real protocol and tools — for the synthetic
  tasks and for tasks whose examples carry a solution path; or
* rejection sampling: the model's own episodes from the rollout engine, kept when they are correct.

The loss is the token-mean negative log-likelihood of the policy tokens (observations and the prompt are never
trained), computed with the same scoring path and microbatching as RL.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentcredit.config import MICRO_BATCH_TOKENS
from agentcredit.credit import aggregation_weights
from agentcredit.environment import Environment, raise_on_infra_failures
from agentcredit.models.scoring import micro_batches, score_tokens
from agentcredit.rollout.engine import episode_reward
from agentcredit.rollout.replay import replay
from agentcredit.rollout.tree import RolloutTree
from agentcredit.tasks import Example
from agentcredit.tools.base import ToolUnavailableError
from agentcredit.tools.episodes import EpisodeTools
from agentcredit.train.batch import build_batch
from agentcredit.train.demos import scripted_policy
from agentcredit.train.optim import adamw
from agentcredit.train.signals import row_tokens


def demonstrations(
    env: Environment,
    tokenizer: Any,
    examples: Sequence[Example],
    protocol_name: str,
    *,
    tool_share: float | None = None,
) -> list[RolloutTree]:
    """Scripted episodes for ``examples``, played through the environment; only correct ones are kept.

    ``tool_share``: see :func:`agentcredit.train.demos.calls_tool`.
    """
    policy = scripted_policy(protocol_name, env.protocol, tool_share=tool_share, tokenizer=tokenizer)
    trees = []
    for example in examples:
        tools = env.tools if env.tools.episodes is None else EpisodeTools(env.tools.episodes, example)
        try:
            tree = replay(
                env.protocol,
                tokenizer,
                _FailOnInfra(tools),  # an unavailable tool stops SFT: its error is no demonstration
                example.question,
                lambda turn, obs, ex=example: policy(ex, turn, obs),
                episode_options=example.info.get("episode_options"),
            )
        finally:
            if tools is not env.tools:
                tools.close()
        leaf = tree.leaves()[
            0
        ]  # scored as the engine scores an episode (a reward may read the whole episode)
        tree.set_reward(
            leaf, episode_reward(env.reward, example, tree.nodes[leaf].info["answer"], tree, leaf)
        )
        if max(tree.rewards().values()) >= 1.0:
            trees.append(tree)
    return trees


class _FailOnInfra:
    """The environment's tools for demonstrations: a result that is an infrastructure failure (a tool that could
    not run, ``ToolResult.infra``) raises ToolUnavailableError instead of becoming an SFT target."""

    def __init__(self, tools: Any):
        self.tools = tools

    def __getattr__(self, name: str) -> Any:  # a per-episode environment's episodes, done and reward
        return getattr(self.tools, name)

    def run(self, calls: Sequence[Any]) -> list[Any]:
        results = self.tools.run(calls)
        broken = [r for r in results if r.infra]
        if broken:
            raise ToolUnavailableError(
                f"demonstrations stopped: the {broken[0].name!r} tool could not run, so the demonstration would "
                f"teach its infrastructure error as the tool's answer: {broken[0].output[:500]}"
            )
        return results


def rejection_sample(
    engine: Any, strategy: Any, env: Environment, examples: Sequence[Example], *, threshold: float = 1.0
) -> list[RolloutTree]:
    """The model's own episodes (one tree per question), pruned to the leaves whose reward reaches ``threshold``.

    Raises ToolUnavailableError when an episode holds an infrastructure failure (a tool that could not run).
    """
    kept = []
    trees = engine.run(list(examples), strategy, env.reward)
    raise_on_infra_failures(trees, "rejection sampling")
    for tree in trees:
        good = [leaf for leaf, r in tree.outcomes().items() if r >= threshold]
        if good:
            kept.append(tree.prune(good)[0])
    return kept


@dataclass
class SFTResult:
    losses: list[float]
    tokens: int
    seconds: float


def sft(
    model: torch.nn.Module,
    trees: Sequence[RolloutTree],
    *,
    pad_id: int,
    epochs: int = 1,
    batch_trajectories: int = 8,
    lr: float = 5e-5,
    weight_decay: float = 0.0,
    grad_clip: float = 1.0,
    seed: int = 0,
    autocast: bool = False,
    max_tokens: int = MICRO_BATCH_TOKENS,
    on_step: Callable[[int, float], None] | None = None,
) -> SFTResult:
    """Token-mean NLL on the policy tokens of every trajectory in ``trees``."""
    if not trees:
        raise ValueError("sft: no demonstrations to train on")
    batch = build_batch(list(trees), pad_id=pad_id)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = adamw(params, lr=lr, weight_decay=weight_decay)
    rng = random.Random(seed)
    losses, start, step = [], time.perf_counter(), 0
    model.train()
    for _ in range(epochs):
        order = list(range(len(batch.trajectories)))
        rng.shuffle(order)
        for s in range(0, len(order), batch_trajectories):
            rows = [r for j in order[s : s + batch_trajectories] for r in batch.trajectories[j].rows]
            mb = batch.select(rows)
            weights = aggregation_weights(mb.policy_mask, "token-mean").float()
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            # as the RL update: rows that share a prefix (the system prompt, the question) are packed and the prefix
            # forwarded once, equal to row-by-row forwarding up to float rounding (agentcredit.models.packing)
            for micro in micro_batches(model, row_tokens(mb), max_tokens):
                sub = mb.select(micro)
                scores = score_tokens(
                    model,
                    sub.input_ids,
                    sub.attention_mask,
                    sub.policy_mask,
                    with_entropy=False,
                    autocast=autocast,
                    share_prefixes=True,
                )
                loss = -(scores.logprobs * weights[micro][:, : sub.input_ids.shape[1]]).sum()
                loss.backward()
                total += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
            optimizer.step()
            # freed now, not kept until the next step: the gradients are as large as the weights
            optimizer.zero_grad(set_to_none=True)
            losses.append(total)
            step += 1
            if on_step is not None:
                on_step(step, total)
    model.eval()
    return SFTResult(losses, int(batch.policy_mask.sum()), time.perf_counter() - start)
