"""PORTool's recipe in the trainer (issue 31): unfinished reward, split min wired into the loss, the presets'
paper defaults, the variant preset, and the per-step regime metrics (metrics.jsonl and `agentcredit compare`)."""

from __future__ import annotations

import json

import pytest
import torch
from train_helpers import EXAMPLES

from agentcredit.config import AlgorithmConfig, ConfigError, load_config
from agentcredit.credit import policy_loss, split_policy_loss
from agentcredit.credit.methods.portool import merged_steps
from agentcredit.environment import build_environment
from agentcredit.eval.report import load_run, write_report
from agentcredit.rollout.tree import RolloutTree, Segment
from agentcredit.train.advantages import compute_advantages, decision_tree
from agentcredit.train.batch import build_batch
from agentcredit.train.losses import total_loss
from agentcredit.train.signals import Signals


def pol(ids, fmt=0.25, info=None):
    return Segment(
        ids,
        role="policy",
        kind="step",
        logprobs=[-1.0] * len(ids),
        entropies=[1.0] * len(ids),
        info={"format_reward": fmt, **(info or {})},
    )


def obs(ids):
    return Segment(ids, role="observation", kind="observation")


def fork_tree(r_answer: float, r_search: float) -> RolloutTree:
    """query -> search (2 tok) -> obs -> {answer (1 tok, leaf, T = 2), search (3 tok) -> obs -> answer (1 tok,
    leaf, T = 3)}: one fork, below the root."""
    tree = RolloutTree(Segment([1], role="prompt"))
    a = tree.add(pol([2, 2]), 0)
    o = tree.add(obs([3]), a)
    tree.set_reward(tree.add(pol([4]), o), r_answer)
    b = tree.add(pol([5, 5, 5]), o)
    tree.set_reward(tree.add(pol([6]), tree.add(obs([7]), b)), r_search)
    return tree


def three_way_tree() -> RolloutTree:
    """fork_tree(-1, -1) plus a second first step that answers correctly (+1): the search step then has a
    negative trajectory term (its outcome is -1) and a positive fork term (the decay prefers it to answering)."""
    tree = fork_tree(-1.0, -1.0)
    tree.set_reward(tree.add(pol([8]), 0), 1.0)
    return tree


# ------------------------------------------------------------------------------------------------ item 1
def test_unfinished_reward_is_configurable_and_defaults_to_the_spec():
    """An episode cut at the step cap (no answer) gets algorithm.portool.unfinished_reward: -1 by default
    (portool.md 8.13; the paper's judge labels true / false / unable_to_answer = +1 / -1 / 0, l. 452-453)."""
    example = EXAMPLES[0]
    for overrides, expected in (([], -1.0), (["algorithm.portool.unfinished_reward=0"], 0.0)):
        env = build_environment(load_config("portool-arith-tools", overrides))
        try:
            assert env.reward(example, None) == expected
            assert env.reward(example, "391") == 1.0 and env.reward(example, "390") == -1.0
        finally:
            env.close()
    with pytest.raises(ConfigError, match="unfinished_reward"):
        load_config("portool-arith-tools", ["algorithm.portool.unfinished_reward=-2"])


# ------------------------------------------------------------------------------------------------ items 2, 3, 5
def test_presets_follow_the_paper():
    p = load_config("portool-kb-multihop").algorithm.portool
    assert (p.root_is_fork, p.combine, p.unfinished_reward, p.outcome_shift, p.gamma, p.w1) == (
        False,  # F(q) starts at t = 1 (portool.txt l. 536)
        "split_min",  # App. B
        -1.0,  # portool.md 8.13
        0.0,
        0.95,
        1.0,
    )
    from agentcredit.credit.methods.portool import PortoolVerlSettings as PortoolSettings  # verl's block

    assert PortoolSettings().root_is_fork is False


def test_shifted_outcome_is_a_named_variant():
    for task in ("arith-tools", "kb-multihop", "gsm8k", "hotpotqa"):
        c = load_config(f"portool-shifted-outcome-{task}")
        base = load_config(f"portool-{task}")
        assert c.method == "portool-shifted-outcome" and c.algorithm.portool.outcome_shift == 1.0
        # the variant differs from PORTool in the outcome shift alone (and its label); it trains PORTool
        assert (
            c.algorithm.credit_method is base.algorithm.credit_method
            and c.algorithm.label == "shifted-outcome"
        )
        relabelled = {"portool": c.algorithm.portool, "method": c.algorithm.method}
        assert (
            c.model_dump()
            == base.model_copy(
                update={"algorithm": base.algorithm.model_copy(update=relabelled)}
            ).model_dump()
        )


def test_split_min_parts_survive_whitening():
    """Whitening (an opt-in, not PORTool's) divides both terms by the batch std and takes the batch mean off the
    trajectory term: the terms still add up to the whitened advantage."""
    tree = three_way_tree()
    batch = build_batch([tree])
    out = compute_advantages(
        AlgorithmConfig(method="portool", whiten_advantages=True), batch, [tree], Signals()
    )
    torch.testing.assert_close(out.parts[0] + out.parts[1], out.advantages)
    assert float(out.advantages[out.loss_mask].mean()) == pytest.approx(0.0, abs=1e-6)


def test_split_min_terms_reach_the_loss():
    """The estimator hands the trajectory and fork terms to the loss, which clips each in its own min."""
    tree = three_way_tree()
    batch = build_batch([tree])
    split = compute_advantages(AlgorithmConfig(method="portool"), batch, [tree], Signals())
    single_cfg = AlgorithmConfig(method="portool", portool={"combine": "single_min"})
    single = compute_advantages(single_cfg, batch, [tree], Signals())
    assert single.parts is None and split.parts is not None and len(split.parts) == 2
    torch.testing.assert_close(split.parts[0] + split.parts[1], split.advantages)
    torch.testing.assert_close(split.advantages, single.advantages)
    assert bool((split.parts[0] * split.parts[1] < 0).any())  # the terms disagree on some token

    # through total_loss, with ratios far outside the clip range: the split loss, not the single one
    batch.advantages, batch.loss_mask = split.advantages, split.loss_mask
    batch.advantage_parts = torch.stack(split.parts, dim=-1)
    g = torch.Generator().manual_seed(0)
    batch.old_logp = torch.where(batch.policy_mask, -torch.rand(batch.input_ids.shape, generator=g), 0.0)
    logp = batch.old_logp + torch.where(
        batch.policy_mask, torch.randn(batch.input_ids.shape, generator=g), 0.0
    )
    scores = type("Scores", (), {"logprobs": logp})()
    weights = batch.loss_mask.float() / batch.loss_mask.sum()
    loss, parts = total_loss(scores, batch, weights, None, AlgorithmConfig(method="portool"))
    expected = split_policy_loss(
        logp, batch.old_logp, batch.advantage_parts, batch.loss_mask, weights=weights
    )
    one_min = policy_loss(logp, batch.old_logp, batch.advantages, batch.loss_mask, weights=weights)
    assert float(loss) == pytest.approx(float(expected), abs=1e-7)
    assert abs(float(expected) - float(one_min)) > 1e-4  # the two readings differ on these ratios
    # a sub-batch keeps its parts (the trainer selects minibatches and microbatches of rows)
    assert batch.select([0]).advantage_parts.shape[-1] == 2


# ------------------------------------------------------------------------------------------------ item 4
def test_failing_tree_metrics_hand_worked():
    """Two trees: one with a success, one where both trajectories failed. Hand-worked for the failing tree:
    A_trj = 0 and the root is no fork, so only the fork's two children carry advantage. Step rewards (Eq. 2):
    answer -1 + 0.25 = -0.75, search 0.95 * -1 + 0.25 = -0.70 (the decay credits searching on), z-scores -z and
    +z with z = 0.025 / (0.05 / sqrt(2) + 1e-6). w2 = n |tau| / (|m| |s| |C| N_forks), n = 2, N_forks = 1:
    answer 2 * 3 / (1 * 1 * 2) = 3 on 1 token; search 2 * 6 / (1 * 3 * 2) = 2 on 3 tokens: |A| mass 9 z."""
    good, bad = fork_tree(1.0, -1.0), fork_tree(-1.0, -1.0)
    trees = [good, bad]
    batch = build_batch(trees)
    out = compute_advantages(AlgorithmConfig(method="portool"), batch, trees, Signals())
    s = out.stats
    assert s["portool/failing_tree_frac"] == 0.5
    rows_bad = [r for t in batch.trajectories if t.tree == 1 for r in t.rows]
    bad_mass = float(out.advantages[rows_bad].abs()[out.loss_mask[rows_bad]].sum())
    z = 0.025 / (0.05 / 2**0.5 + 1e-6)
    assert bad_mass == pytest.approx(9 * z, abs=1e-5)
    total = float(out.advantages.abs()[out.loss_mask].sum())
    assert s["portool/failing_abs_adv_share"] == pytest.approx(bad_mass / total, abs=1e-6)  # float32 tokens
    assert 0 < s["portool/failing_abs_adv_share"] < 1
    assert s["portool/merged_steps"] == 0.0


def test_merged_steps_counts_folded_siblings():
    tree = fork_tree(1.0, -1.0)
    tree.nodes[1].info["merged_from"] = [1, 7, 9]  # the first step stands for three identical samples
    tree.nodes[2].info["merged_from"] = [2, 8]  # an observation: not a step
    assert merged_steps([decision_tree(t)[0] for t in (tree, fork_tree(1.0, 1.0))]) == 1.0


def test_portool_metrics_appear_in_compare(tmp_path):
    runs = []
    for name, method, shift in (("p", "portool", 0.0), ("v", "portool-shifted-outcome", 1.0)):
        run = tmp_path / name
        run.mkdir()
        cfg = load_config(
            "portool-arith-tools", [f"algorithm.portool.outcome_shift={shift}", f"algorithm.method={method}"]
        )
        (run / "config.yaml").write_text(__import__("yaml").safe_dump(cfg.model_dump(mode="json")))
        rows = [
            {
                "step": k,
                "reward/mean": 0.0,
                "portool/failing_tree_frac": f,
                "portool/failing_abs_adv_share": 0.5,
            }
            for k, f in ((1, 0.75), (2, 0.25))
        ]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs.append(run)
    assert "VARIANT (not PORTool)" in load_run(runs[1]).settings
    assert "VARIANT" not in load_run(runs[0]).settings and "combine=split_min" in load_run(runs[0]).settings
    md = write_report(runs, tmp_path / "report")["markdown"].read_text()
    assert "trees w/o success" in md and "|A| share of failing trees" in md
    assert "| p | portool | combine=split_min, root_is_fork=False" in md
    assert "| v | portool-shifted-outcome | VARIANT (not PORTool)" in md
    assert "| 0.500 (0.250) | 0.500 (0.500) |" in md  # mean over steps (last step)
