"""The credit viewer: colour scale by hand, input checks, the page's structure, and a headless-Chromium render."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import torch

from agentcredit.eval.viewer import (
    advantage_colour,
    default_scale,
    read_episodes,
    render_viewer,
    write_viewer,
)
from agentcredit.tasks import Example
from agentcredit.train.batch import build_batch
from agentcredit.train.credit_records import credit_records


def test_advantage_colour_by_hand():
    assert advantage_colour(0.0, 2.0) == "rgb(255,255,255)"
    assert advantage_colour(2.0, 2.0) == "rgb(33,102,172)"  # full blue
    assert advantage_colour(-5.0, 2.0) == "rgb(178,24,43)"  # clipped to full red
    # half way to red: 255 + 0.5 * (178 - 255) = 216.5 -> 216 (round half to even), 139.5 -> 140, 149
    assert advantage_colour(-1.0, 2.0) == "rgb(216,140,149)"
    with pytest.raises(ValueError, match="scale"):
        advantage_colour(0.1, 0.0)
    with pytest.raises(ValueError, match="finite"):
        advantage_colour(float("nan"), 1.0)


def _records(tiny, tree):
    _, tokenizer = tiny
    batch = build_batch([tree], pad_id=tokenizer.pad_token_id)
    # trajectory 0 (tool call, reward 1): +0.8 on the invoke, +0.3 on the commit; trajectory 1: -0.6
    seg = batch.segment_ids
    adv = torch.zeros_like(batch.advantages)
    adv[(seg == 1) & batch.policy_mask] = 0.8
    adv[(seg == 3) & batch.policy_mask] = 0.3
    adv[(seg == 4) & batch.policy_mask] = -0.6
    batch.advantages = adv
    example = Example(id="q7", task="arith-tools", question="what is 12*7?", answers=["84"], info={})
    return credit_records([tree], batch, [example], tokenizer, step=1, method="carl-segment")


def test_render_marks_tokens_boundaries_and_observations(tiny, tree):
    records = _records(tiny, tree)
    assert default_scale(records) == pytest.approx(0.8)
    page = render_viewer(records)
    n_policy = sum(len(s["tokens"]) for r in records for s in r["segments"] if s["role"] == "policy")
    assert page.count('class="tok"') == n_policy
    assert page.count('class="boundary"') == 3  # invoke + commit, and the direct commit
    assert "invoke · mean A +0.800" in page and "mean A -0.600" in page
    obs = re.search(r'<div class="obs">.*?</pre></div>', page, re.S).group(0)
    assert "84" in obs and "tok" not in obs  # tool output is set apart, never coloured
    # model text is escaped: the only <script> element is the page's own, the model's "<" shows as text
    assert page.count("<script>") == 1 and "alert" in page and "&lt;" in page
    assert advantage_colour(0.8, 0.8) in page and advantage_colour(-0.6, 0.8) in page


def test_read_episodes_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"segments": []}\nnot json\n')
    with pytest.raises(ValueError, match="line 2"):
        read_episodes(bad)
    bad.write_text(
        json.dumps({"segments": [{"role": "policy", "tokens": ["a"], "advantages": [1, 2]}]}) + "\n"
    )
    with pytest.raises(ValueError, match="line 1 segment 0"):
        read_episodes(bad)
    bad.write_text("\n")
    with pytest.raises(ValueError, match="no episodes"):
        read_episodes(bad)
    with pytest.raises(FileNotFoundError):
        read_episodes(tmp_path / "missing.jsonl")


def test_eval_episodes_without_credit_render_as_text(tmp_path):
    path = tmp_path / "episodes.jsonl"
    record = {
        "id": "x",
        "question": "q",
        "reward": 0.0,
        "segments": [{"role": "policy", "kind": "commit", "text": "hi"}],
    }
    path.write_text(json.dumps(record) + "\n")
    page = write_viewer(path).read_text()
    assert "carry no per-token advantages" in page and 'class="tok"' not in page


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make system-packages)")
def test_page_renders_in_headless_chromium(tiny, tree, tmp_path):
    episodes = tmp_path / "episodes.jsonl"
    episodes.write_text("".join(json.dumps(r) + "\n" for r in _records(tiny, tree)))
    page = write_viewer(episodes, tmp_path / "page.html")
    flags = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--enable-logging=stderr",
        "--v=0",
    ]
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-ready="1"' in dom.stdout  # the inline script ran to its last line
    assert dom.stdout.count('class="tok"') == page.read_text().count('class="tok"')
    assert "Uncaught" not in dom.stderr  # no JavaScript error in the console
    shot = tmp_path / "shot.png"
    run = subprocess.run(
        [*flags, f"--screenshot={shot}", "--window-size=1200,900", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    from PIL import Image

    pixels = Image.open(shot).convert("RGB")
    colours = pixels.getcolors(maxcolors=1 << 20)
    assert len(colours) > 50  # text, legend gradient, coloured tokens: not a blank page
    rgb = {c for _, c in colours}
    assert any(b > r + 60 for r, _, b in rgb) and any(r > b + 60 for r, _, b in rgb)  # blue and red credit


def test_an_environments_step_reward_is_in_the_records_and_the_page(tiny, tree):
    """Issue 35: environment.step()'s reward reached training but neither episodes.jsonl nor `agentcredit view`."""
    from agentcredit.eval.evaluate import episode_records

    invoke, commit = 1, 3  # hand_tree: invoke -> observation -> commit (reward 1), and a direct commit
    tree.segment(invoke).info["env_reward"] = 0.25
    tree.nodes[commit].info["outcome_reward"] = 1.0
    tree.set_reward(commit, 1.25)  # the return: outcome + step rewards, as the engine sets it
    for records in (
        _records(tiny, tree),
        episode_records([tree], [Example("q7", "what is 12*7?", ["84"], "arith-tools", {})]),
    ):
        called = next(r for r in records if r["reward"] == 1.25)
        assert (called["outcome_reward"], called["step_rewards"]) == (1.0, [0.25])
        assert [s.get("env_reward") for s in called["segments"]] == [None, 0.25, None, None]
        direct = next(r for r in records if r["reward"] == 0.0)
        assert "step_rewards" not in direct  # no environment step on this path: nothing to show
        page = render_viewer(records)
        assert "step reward +0.250" in page and "reward 1.250 · outcome 1.000 + step rewards +0.250" in page
