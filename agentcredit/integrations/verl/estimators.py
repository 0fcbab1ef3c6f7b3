"""agentcredit estimators in verl's advantage-estimator registry (``algorithm.adv_estimator=<name>``).

verl calls a registered estimator with ``token_level_rewards``, ``response_mask``, ``index`` (the prompt uid)
and ``config`` only (``verl.trainer.ppo.ray_trainer.compute_advantage``); values, log-probs, entropies and the
agent loop's ``extra_fields`` never reach it. So only outcome-group methods fit:

* ``agentcredit_grpo``: :func:`agentcredit.credit.grpo_advantages` on R = the row's summed token rewards.
  Unlike verl's built-in ``grpo``, a group of one episode gets 0 (verl's singleton rule would return the raw
  reward; portool.md §3.5 rejects it).
* ``agentcredit_drgrpo``: the same without the std division (Dr.GRPO), which is also what carl-critical gives
  the first action of each episode on verl's independent rollouts (A = R - mean R at the prompt's fork).

Every other method needs the trainer (``trainer.v1.trainer_mode=agentcredit``). These work with verl's own
agent loops and trainers, one row per episode (with multi-row episodes verl would count each row as a member
of the group; use the agentcredit trainer there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import register_adv_est

from agentcredit.credit.methods import BUILT_IN, METHODS

#: Added to the group std, as verl's built-in estimators do.
EPSILON = 1e-6


def _group_outcome(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None,
    estimate: Callable[..., torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    if index is None:
        raise ValueError(
            "agentcredit estimators need the prompt uid (`uid` in non_tensor_batch) to form groups"
        )
    if token_level_rewards.shape != response_mask.shape:
        raise ValueError(
            f"token_level_rewards {tuple(token_level_rewards.shape)} and response_mask "
            f"{tuple(response_mask.shape)} differ in shape"
        )
    scores = (token_level_rewards * response_mask).sum(dim=-1)
    per_row = estimate(scores.float(), list(index), eps=EPSILON)
    advantages = per_row.unsqueeze(-1) * response_mask
    return advantages, advantages


def _register(name: str, estimate: Callable[..., torch.Tensor], method: str) -> Callable[..., Any]:
    def estimator(
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        index: np.ndarray | None = None,
        config: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return _group_outcome(token_level_rewards, response_mask, index, estimate)

    estimator.__name__ = estimator.__qualname__ = name
    estimator.__doc__ = f"{method}'s outcome estimator {name!r} from agentcredit, broadcast to the response."
    return register_adv_est(name)(estimator)


#: ``agentcredit_<name>`` -> the registered function, for each built-in method's outcome estimators.
ESTIMATORS = {
    f"agentcredit_{name}": _register(f"agentcredit_{name}", estimate, method)
    for method in BUILT_IN
    for name, estimate in METHODS[method].outcome_estimators
}
globals().update(ESTIMATORS)

__all__ = ["EPSILON", "ESTIMATORS", *ESTIMATORS]
