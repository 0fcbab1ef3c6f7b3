"""SFT demonstrations replayed under codefence's prompt modes (start.sft.prompts, issue 32's start selection).

The first arith-tool-can-hurt start called the tool under the no-tool prompt too (its demonstrations used one
prompt), so "the start answers the easy tier alone" measured its habit of calling, not its arithmetic. With
``prompts`` a demonstration under the no-tool prompt answers directly and one under the forced prompt calls.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agentcredit.config import load_config
from agentcredit.lab.study import SftSpec
from agentcredit.tasks import arith
from agentcredit.train.demos import PROMPT_TOOL_SHARE, demo_prompt

MIX = {"optional": 0.25, "forced": 0.25, "no_tool": 0.5}


def test_demo_prompt_splits_by_the_shares_and_is_stable():
    ids = [f"q{i}" for i in range(4000)]
    counts = Counter(demo_prompt(i, MIX) for i in ids)
    for mode, share in MIX.items():
        assert abs(counts[mode] / len(ids) - share) < 0.03
    # the same in every call and whatever the mapping's order
    reordered = {"no_tool": 0.5, "optional": 0.25, "forced": 0.25}
    assert [demo_prompt(i, MIX) for i in ids[:200]] == [demo_prompt(i, reordered) for i in ids[:200]]


def test_demo_prompt_is_independent_of_the_tier():
    examples = arith.generate(600, seed=1, easy_fraction=0.34, medium_fraction=0.33)
    for tier in arith.TIERS:
        mine = [e for e in examples if e.info["tier"] == tier]
        share = sum(demo_prompt(e.id, MIX) == "no_tool" for e in mine) / len(mine)
        assert abs(share - 0.5) < 0.12


@settings(max_examples=50, deadline=None)
@given(st.text(min_size=1, max_size=20), st.floats(0.0, 1.0))
def test_a_mode_with_zero_share_is_never_chosen(qid, a):
    shares = {"forced": a, "no_tool": 1.0 - a, "optional": 0.0}
    mode = demo_prompt(qid, shares)
    assert shares[mode] > 0


def test_demo_prompt_rejects_bad_shares():
    with pytest.raises(ValueError, match="sum to 1"):
        demo_prompt("q", {"optional": 0.5, "no_tool": 0.3})
    with pytest.raises(ValueError, match="at least one"):
        demo_prompt("q", {})


def test_no_tool_answers_directly_and_forced_calls():
    assert PROMPT_TOOL_SHARE == {"no_tool": 0.0, "forced": 1.0}


def test_sft_spec_checks_prompts_and_keeps_old_fingerprints():
    assert "prompts" not in SftSpec().model_dump()  # studies without the field keep their start fingerprint
    assert SftSpec(prompts=MIX).model_dump()["prompts"] == MIX
    with pytest.raises(ValidationError, match="unknown prompt mode"):
        SftSpec(prompts={"optional": 0.5, "quiet": 0.5})
    with pytest.raises(ValidationError, match="sum to 1"):
        SftSpec(prompts={"optional": 0.5, "no_tool": 0.25})


def test_sft_replays_each_demonstration_under_its_prompt(tmp_path):
    from agentcredit.models.loading import load_base_model
    from agentcredit.run import _prompted_demonstrations

    cfg = load_config(
        "carl-segment-arith-tools",
        ["model.name=tiny", "task.options={easy_fraction: 0.5, medium_fraction: 0.25}"],
    )
    _, tokenizer = load_base_model("tiny", cfg.model.dtype)
    data = arith.generate(24, seed=3, easy_fraction=0.5, medium_fraction=0.25)
    trees, per_prompt = _prompted_demonstrations(cfg, tokenizer, data, MIX, 0.5, None, lambda _: None)
    assert sum(per_prompt.values()) == len(data) == len(trees)
    for tree in trees:
        prompt = tree.segment(0).text
        calls = sum(len(tree.segment(i).info.get("calls", [])) for i in range(len(tree)))
        if "Do not use any tools" in prompt:
            assert calls == 0
        elif "You must use a Python code block" in prompt:
            assert calls == 1
        else:
            assert "You may optionally use" in prompt
    assert per_prompt["no_tool"] > 0 and per_prompt["forced"] > 0


def test_the_study_start_passes_its_prompts_and_a_seed_the_preconditions_do_not_use(tmp_path, monkeypatch):
    import agentcredit.run as run
    from agentcredit.lab.study import Study, load_study

    seen = {}

    def fake_sft(cfg, out_dir, **kw):
        seen.update(kw, seed=cfg.task.seed)

    monkeypatch.setattr(run, "run_sft", fake_sft)
    spec = load_study("studies/arith-tool-can-hurt.yaml")
    Study(spec, tmp_path, log=lambda _: None).sft()
    assert seen["prompts"] == spec.start.sft.prompts and sum(seen["prompts"].values()) == 1.0
    # the preconditions read training seed 0 (the study's task.seed); the demonstrations another seed
    assert seen["seed"] != load_config(spec.start.preset, spec.set).task.seed


def test_a_bad_prompt_mix_in_a_study_file_is_one_line_naming_the_field(tmp_path):
    from agentcredit.lab.study import StudyError, load_study

    text = open("studies/arith-tool-can-hurt.yaml").read()
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        text.replace("prompts: {optional: 0.25, forced: 0.25, no_tool: 0.5}", "prompts: {quiet: 1.0}")
    )
    with pytest.raises(StudyError, match=r"start\.sft.*unknown prompt mode"):
        load_study(bad)
