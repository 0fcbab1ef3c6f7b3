"""carl-critical: advantages of the critical actions of an entropy-guided rollout tree (Eqs. 9-13, 2).

The maths is :func:`agentcredit.credit.carl_critical.critical_action_advantages`.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from agentcredit.credit.carl_critical import critical_action_advantages
from agentcredit.credit.estimators import EpisodeBatch, Estimate, episode_groups, leaf_rewards
from agentcredit.credit.methods.base import Method, Needs, Settings


class CarlCriticalSettings(Settings):
    update_rule: Literal["multi_child", "forked_parent", "inherit"] = Field(
        "multi_child",
        description="Update set (Eq. 13 literal: multi_child; carl-critical-actions.md A1: forked_parent; "
        "ablation #3: inherit).",
    )


def estimate(batch: EpisodeBatch, settings: CarlCriticalSettings) -> Estimate:
    update_rule = settings.update_rule
    adv = batch.zeros()
    loss_mask = torch.zeros(batch.shape, dtype=torch.bool)
    rolled = updated = 0
    groups = episode_groups(batch)
    for group, members in groups.items():
        tree = batch.tree(group, "carl-critical")
        kwargs = {"fork_counts": dict(tree.fork_counts or {})} if update_rule == "forked_parent" else {}
        _, node_adv, update = critical_action_advantages(
            list(tree.parents),
            leaf_rewards(batch, members, "carl-critical"),
            rule=update_rule,
            **kwargs,  # type: ignore[arg-type]
        )
        rolled += len(tree.parents) - 1
        updated += sum(update)
        trained: set[int] = set()
        for j in members:
            for s in batch.episodes[j].steps:
                adv[s.row, s.start : s.end] = node_adv[s.node]
                # each selected action enters the update once, in the first episode that holds it
                # (carl-critical-actions.md §3.7)
                if update[s.node] and s.node not in trained:
                    trained.add(s.node)
                    loss_mask[s.row, s.start : s.end] = True
    n = max(len(groups), 1)  # per question, as the paper reports them
    stats = {"critical/actions_rolled": rolled / n, "critical/actions_updated": updated / n}
    return Estimate(adv, loss_mask, stats=stats)


METHOD = Method(
    name="carl-critical",
    settings=CarlCriticalSettings,
    # loss: Eq. 2's 1/|D| over the tokens of the update set, token-mean (the default)
    needs=Needs(rollout="entropy_guided", step_inputs=frozenset({"tree"})),
    source="carl-critical Eqs. 9-13, 2",
    estimate=estimate,
    # task.metric: the paper's format gate x set-F1 (set_f1_format, carl-critical-actions.txt l. 513) on the QA
    # presets, the task's numeric match on arith-tools and gsm8k (a labelled deviation, docs/specs/README.md)
    report_settings=("rollout.forks_per_round", "task.metric"),
)
