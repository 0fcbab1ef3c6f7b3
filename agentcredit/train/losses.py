"""The training objective: :func:`total_loss` (one sum for every method) and its terms beside the policy
surrogate: KL to the reference, entropy, value losses.

All terms are per-token tensors reduced with the same per-token weights as the policy loss (carl-segment.md
A12: KL and entropy use the loss aggregation of the policy term), so a minibatch split into microbatches sums to
exactly the loss of the whole minibatch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from agentcredit.credit import policy_loss, split_policy_loss

if TYPE_CHECKING:
    from agentcredit.config import AlgorithmConfig


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate on sampled tokens.

    k1: log pi - log pi_ref. k3 (verl's ``low_var_kl``, Schulman's estimator): exp(d) - d - 1 with
    d = log pi_ref - log pi, clamped to [-10, 10] as verl does, always >= 0.
    """
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "k3":
        d = (ref_logp - logp).clamp(-20.0, 20.0)
        return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"kl estimator must be 'k1' or 'k3', got {estimator!r}")


def token_value_loss(
    values: torch.Tensor,
    returns: torch.Tensor,
    weights: torch.Tensor,
    *,
    old_values: torch.Tensor | None = None,
    clip: float | None = None,
) -> torch.Tensor:
    """0.5 * (V - G)^2 summed with ``weights``; with ``clip``, verl's clipped form max((V-G)^2, (V_clip-G)^2)."""
    loss = (values - returns) ** 2
    if clip is not None:
        if old_values is None:
            raise ValueError("value clipping needs the old values")
        clipped = old_values + (values - old_values).clamp(-clip, clip)
        loss = torch.maximum(loss, (clipped - returns) ** 2)
    return 0.5 * (loss * weights).sum()


def value_weights(value_mask: torch.Tensor, row_traj: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-position weights of the value loss over a whole minibatch.

    token (PPO/TIPS, verl): mean over all value positions. boundary (carl-segment §3.5/A12): mean over a
    trajectory's boundaries, then mean over trajectories.
    """
    mask = value_mask.float()
    if kind == "token":
        return mask / mask.sum().clamp(min=1.0)
    if kind == "boundary":
        per_traj = torch.zeros(
            int(row_traj.max()) + 1 if row_traj.numel() else 0, device=mask.device
        ).index_add_(0, row_traj, mask.sum(-1))
        n_traj = (per_traj > 0).sum().clamp(min=1)
        denom = per_traj[row_traj].clamp(min=1.0)[:, None] * n_traj
        return mask / denom
    raise ValueError(f"value loss kind must be 'token' or 'boundary', got {kind!r}")


def total_loss(
    scores: Any,
    batch: Any,
    weights: torch.Tensor,
    value_weights: torch.Tensor | None,
    cfg: AlgorithmConfig,
    *,
    train_policy: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one microbatch and its parts (for logging): every method's objective is this one sum.

    ``policy_loss`` (PPO clip, dual clip, aggregated by ``weights``; the sum of one per term with
    ``batch.advantage_parts``, PORTool's split min) + ``kl_coef`` KL(pi || pi_ref) -
    ``entropy_coef`` H, when the policy trains (not during the critic warm-up), + ``value_coef`` L_V when a
    critic is trained (``value_weights`` given): the clipped token value loss for ``critic="token"``, plain MSE
    to the Monte-Carlo return at every boundary for carl-segment's boundary critic (carl-segment.md §3.5).
    ``scores`` holds the new log-probs, entropies and values; ``batch`` the old log-probs, advantages, masks,
    reference log-probs, returns and old values of the same rows.
    """
    loss = torch.zeros((), device=batch.input_ids.device)
    parts: dict[str, float] = {}
    if train_policy:
        clip = {"clip_eps": cfg.clip_eps, "dual_clip": cfg.clip_ratio_c, "weights": weights}
        if batch.advantage_parts is not None:  # PORTool's split min: each term in its own clipped min
            pg = split_policy_loss(
                scores.logprobs, batch.old_logp, batch.advantage_parts, batch.loss_mask, **clip
            )
        else:
            pg = policy_loss(scores.logprobs, batch.old_logp, batch.advantages, batch.loss_mask, **clip)
        loss = loss + pg
        parts["loss/policy"] = float(pg.detach())
        if cfg.kl_coef > 0:
            kl = (
                kl_penalty(scores.logprobs, batch.ref_logp, cfg.kl_estimator) * weights * batch.loss_mask
            ).sum()
            loss = loss + cfg.kl_coef * kl
            parts["loss/kl"] = float(kl.detach())
        if cfg.entropy_coef > 0:
            ent = (scores.entropies * weights * batch.loss_mask).sum()
            loss = loss - cfg.entropy_coef * ent
            parts["loss/entropy"] = float(ent.detach())
    if value_weights is not None:
        if cfg.critic == "token":
            vloss = token_value_loss(
                scores.values, batch.returns, value_weights, old_values=batch.old_values, clip=cfg.value_clip
            )
        else:
            vloss = ((scores.values - batch.returns) ** 2 * value_weights).sum()
        loss = loss + cfg.value_coef * vloss
        parts["loss/value"] = float(vloss.detach())
    return loss, parts
