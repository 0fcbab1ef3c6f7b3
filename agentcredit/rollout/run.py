"""Episodes of a Hugging Face model on a list of questions, one tree each: evaluation, warm-ups, probes.

The environment's protocol, tools and reward drive the rollout engine (:class:`~agentcredit.rollout.engine.
RolloutEngine`) with independent samples per question, greedy by default, the model in eval mode under
``torch.no_grad``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentcredit.rollout.tree import RolloutTree
from agentcredit.tasks import Example


def run_episodes(
    model: Any,
    tokenizer: Any,
    env: Any,
    examples: Sequence[Example],
    *,
    samples: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    max_new_tokens: int = 256,
    max_episode_tokens: int = 1024,
    max_turns: int | None = None,
    max_batch: int = 64,
    seed: int = 0,
    progress: str | None = None,
) -> list[RolloutTree]:
    """Episodes of ``model`` on ``examples`` (greedy by default), one tree per question, with ``env``'s protocol,
    tools and reward (an :class:`~agentcredit.environment.Environment`).

    ``progress``: a description to show progress over the questions under (with an ETA); None shows nothing.
    """
    import torch

    from agentcredit.progress import Progress
    from agentcredit.rollout.engine import EngineConfig, RolloutEngine
    from agentcredit.rollout.sampling import SamplingParams
    from agentcredit.rollout.strategies import independent

    if samples > 1 and temperature == 0.0:
        raise ValueError("samples > 1 with greedy decoding would repeat one episode; set a temperature")
    config = EngineConfig(
        sampling=SamplingParams(temperature=temperature, top_p=top_p),
        max_segment_tokens=max_new_tokens,
        max_episode_tokens=max_episode_tokens,
        max_turns=max_turns,
        seed=seed,
        max_batch=max_batch,
    )
    engine = RolloutEngine.for_hf_model(model, tokenizer, env.protocol, env.tools, config)
    was_training = model.training
    model.eval()
    with (
        torch.no_grad(),
        Progress(progress or "", total=len(examples), unit="questions", enabled=progress is not None) as bar,
    ):
        trees = engine.run(list(examples), independent(samples), env.reward, on_tree_done=bar.advance)
    model.train(was_training)
    return trees
