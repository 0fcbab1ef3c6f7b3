"""``agentcredit study`` end to end on the tiny model: shared start, fixed held-out sets, resume, report."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

from agentcredit.cli import app
from agentcredit.lab.study import Study, StudyError, claim, claim_differences, load_study
from agentcredit.lab.study_report import claim_differences_table

TINY = [
    "model.name=tiny",
    "task.options={easy_fraction: 0.5, medium_fraction: 0.25}",
    "rollout.prompts_per_step=2",
    "rollout.n=2",
    "rollout.max_new_tokens=16",
    "rollout.max_episode_tokens=40",
    "rollout.max_turns=3",
    "train.tensorboard=false",
    "train.save_every=1",
]


# what the tiny study's claims test (carl-segment's parts) and the preset differences they knowingly accept
CARL_ABOUT = [
    "algorithm.method",
    "algorithm.carl_segment",
    "algorithm.loss_agg",
    "algorithm.entropy_coef",
    "optim.head_lr",
]
CARL_TOLERATE = ["algorithm.clip_ratio_c", "optim.minibatch_size", "optim.epochs"]


def tiny_study(**changes) -> dict:
    spec = {
        "name": "tiny",
        "description": "two arms on the tiny model",
        "set": TINY,
        "start": {
            "preset": "carl-segment-arith-tools",
            "sft": {"examples": 4, "epochs": 1, "lr": 1e-3, "tool_share": 0.5},
            # four questions cannot pass the gate; the study runs its arms anyway and its report says so
            "warmup": {
                "questions": 4,
                "tier_samples": 1,
                "head_epochs": 3,
                "steps": 0,
                "allow_failed_gate": True,
            },
        },
        "heldout": [
            {"name": "test", "split": "test", "limit": 4},
            {"name": "new", "split": "test", "limit": 2, "options": {"phrasing": "new"}},
        ],
        "tier_samples": 1,
        "seeds": [0, 1],
        "steps": 1,
        "eval_every": 1,
        "arms": [
            {"name": "grpo", "preset": "grpo-arith-tools"},
            {"name": "carl-segment", "preset": "carl-segment-arith-tools"},
        ],
        "claims": [
            {
                "name": "fewer calls",
                "metric": "tool_call_rate",
                "arm": "carl-segment",
                "baseline": "grpo",
                "about": CARL_ABOUT,
                "tolerate": CARL_TOLERATE,
                "direction": "lower",
            },
            {
                "name": "accuracy holds on new phrasings",
                "metric": "accuracy",
                "heldout": "new",
                "arm": "carl-segment",
                "baseline": "grpo",
                "about": CARL_ABOUT,
                "tolerate": CARL_TOLERATE,
                "direction": "not_lower",
                "margin": 0.05,
            },
            {
                "name": "fewer updated actions",
                "metric": "update/actions_updated_per_question",
                "source": "training",
                "arm": "carl-segment",
                "baseline": "grpo",
                "about": CARL_ABOUT,
                "tolerate": CARL_TOLERATE,
                "direction": "lower",
            },
            {
                "name": "steadier across seeds",
                "metric": "accuracy",
                "arm": "carl-segment",
                "baseline": "grpo",
                "about": CARL_ABOUT,
                "tolerate": CARL_TOLERATE,
                "direction": "lower_spread",
            },
        ],
    }
    spec.update(changes)
    return spec


def write(path, spec) -> str:
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_study_file_errors_name_the_problem(tmp_path):
    with pytest.raises(StudyError, match="seeds"):
        load_study(write(tmp_path / "a.yaml", tiny_study(seeds=[])))
    bad_claim = tiny_study()
    bad_claim["claims"][0]["baseline"] = "ppo"
    with pytest.raises(StudyError, match="no arm named 'ppo'"):
        load_study(write(tmp_path / "b.yaml", bad_claim))
    bad_arm = tiny_study(
        arms=[{"name": "x", "preset": "grpo-arith-tools", "set": ["optim.nope=1"]}], claims=[]
    )
    with pytest.raises(StudyError, match="(?s)arm .x.*optim.nope"):
        load_study(write(tmp_path / "c.yaml", bad_arm))
    with pytest.raises(StudyError, match="not found"):
        load_study(tmp_path / "missing.yaml")
    training_with_set = tiny_study()
    training_with_set["claims"][2]["heldout"] = "test"
    with pytest.raises(StudyError, match="training-metric claim has no held-out set"):
        load_study(write(tmp_path / "d.yaml", training_with_set))


def test_a_claim_whose_arms_differ_outside_its_parts_is_refused(tmp_path):
    """issue 31: the GEAR study's GRPO arm differed from GEAR in aggregation and dual clip, not only in GEAR's
    reweighting; a study now compares each claim's resolved configs and stops on a difference it does not name."""
    unnamed = tiny_study()
    unnamed["claims"][1]["tolerate"] = ["algorithm.clip_ratio_c", "optim.epochs"]  # minibatch_size left out
    with pytest.raises(StudyError) as caught:
        load_study(write(tmp_path / "a.yaml", unnamed))
    message = str(caught.value)
    assert "claim 'accuracy holds on new phrasings'" in message and "\n" not in message
    assert "optim.minibatch_size: 16 vs 0" in message and "algorithm.critic" not in message
    # from the command line: one line, exit 2, no traceback
    result = CliRunner().invoke(
        app, ["study", "--config", str(tmp_path / "a.yaml"), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2 and "optim.minibatch_size" in result.output
    assert "Traceback" not in result.output
    # a section name covers its fields; an arm's label (its name) is never a difference, its method is
    spec = load_study(write(tmp_path / "b.yaml", tiny_study()))
    d = claim_differences(spec, spec.claims[0])
    assert d.unexplained == {} and d.about["algorithm.method"] == ("carl-segment", "grpo")
    assert d.about["algorithm.loss_agg"] == ("segment-mean", "token-mean")
    assert d.tolerated["optim.minibatch_size"] == (16, 0)
    header, rows = claim_differences_table(spec)
    assert rows[0][1] == "carl-segment vs grpo" and "algorithm.method: carl-segment vs grpo" in rows[0][2]
    assert "optim.minibatch_size: 16 vs 0" in rows[0][3]


def test_the_gear_study_has_a_like_for_like_baseline():
    """GEAR's paper writes GRPO and GEAR with the same 1/|tau| aggregation (Eqs. 1 and 6) and "all other
    hyperparameters follow the default GRPO settings" (App. B.1, seed line 327): the GEAR claims of the kb-multihop
    study compare arms that differ in GEAR's reweighting alone; the published claims list their confounds."""
    spec = load_study("studies/kb-multihop-credit.yaml")
    for c in spec.claims:
        d = claim_differences(spec, c)
        assert d.unexplained == {}
        if c.arm == "gear-tau":
            assert c.baseline == "grpo-gear-recipe"
            # the study file (first round, unchanged) says algorithm.reweight; it covers algorithm.method, and the
            # arm's algorithm.reweight=none is GRPO in GEAR's recipe (seq-mean-token-mean kept)
            assert d.about == {"algorithm.method": ("gear", "grpo")} and d.tolerated == {}
        elif c.arm == "gear":
            assert set(d.tolerated) == {"algorithm.loss_agg", "algorithm.clip_ratio_c"}
            assert d.tolerated["algorithm.loss_agg"] == ("seq-mean-token-mean", "token-mean")
    assert sum(c.arm == "gear-tau" for c in spec.claims) == 3


def test_an_arm_name_must_name_the_method_it_trains(tmp_path):
    """The arm's name is its algorithm.method (a label allowed): an arm called grpo on carl-segment's preset is
    refused in one line, not trained as carl-segment under GRPO's name."""
    wrong = tiny_study()
    wrong["arms"][0]["preset"] = "carl-segment-arith-tools"
    with pytest.raises(StudyError, match="arm 'grpo' trains algorithm.method='carl-segment'") as caught:
        load_study(write(tmp_path / "w.yaml", wrong))
    assert "\n" not in str(caught.value)


def test_an_arm_in_another_protocol_than_the_start_is_refused(tmp_path):
    # the start is SFT'd in carl-segment's codefence format; an arm without replacement would roll out contexts
    # the start never saw. Defaults count: grpo-arith-tools sets no option and equals the start's (replacement
    # and the optional-tool prompt are codefence's defaults), so the shipped arith study loads.
    other = tiny_study(
        arms=[
            {"name": "grpo", "preset": "grpo-arith-tools", "set": ["protocol.options={replacement: false}"]}
        ],
        claims=[],
    )
    with pytest.raises(StudyError, match=r"arm 'grpo': its protocol differs.*'replacement': \(False, True\)"):
        load_study(write(tmp_path / "a.yaml", other))
    load_study(write(tmp_path / "b.yaml", tiny_study()))


def test_the_budget_may_change_until_the_first_run(tmp_path):
    out = tmp_path / "study"
    Study(load_study(write(tmp_path / "a.yaml", tiny_study())), out).prepare(resume=False)
    Study(load_study(write(tmp_path / "b.yaml", tiny_study(steps=3))), out).prepare(resume=True)  # no run yet
    (out / "runs" / "grpo-s0").mkdir(parents=True)
    with pytest.raises(StudyError, match="run grpo-s0 was made with other settings"):
        Study(load_study(write(tmp_path / "c.yaml", tiny_study(steps=4))), out).prepare(resume=True)
    changed_arm = tiny_study(steps=3)
    changed_arm["arms"][0]["set"] = ["optim.lr=1e-4"]
    for c in changed_arm["claims"]:  # the claims accept the new difference (else the file itself is refused)
        c["tolerate"] = [*CARL_TOLERATE, "optim.lr"]
    with pytest.raises(StudyError, match="run grpo-s0 was made with other settings"):
        Study(load_study(write(tmp_path / "d.yaml", changed_arm)), out).prepare(resume=True)
    # a new arm and a new seed leave grpo-s0 as it was: the study may grow
    grown = tiny_study(steps=3, seeds=[0, 1, 2])
    grown["arms"].append({"name": "ppo", "preset": "ppo-arith-tools"})
    Study(load_study(write(tmp_path / "e.yaml", grown)), out).prepare(resume=True)
    # ... and after growing, the original file still continues the same runs
    Study(load_study(write(tmp_path / "f.yaml", tiny_study(steps=3))), out).prepare(resume=True)
    # a run records its own fingerprint: dropping its arm and bringing it back changed cannot slip through
    (out / "runs" / "grpo-s0" / "fingerprint").write_text(
        load_study(write(tmp_path / "g.yaml", tiny_study(steps=3))).run_fingerprint("grpo", 0) + "\n"
    )
    dropped = tiny_study(steps=3, claims=[])
    dropped["arms"] = dropped["arms"][1:]
    Study(load_study(write(tmp_path / "h.yaml", dropped)), out).prepare(resume=True)  # kept on disk, unused
    with pytest.raises(StudyError, match="run grpo-s0 was made with other settings"):
        Study(load_study(write(tmp_path / "i.yaml", changed_arm)), out).prepare(resume=True)
    # a run nothing records (no fingerprint file, unknown to the previous study file) is refused, not guessed
    (out / "runs" / "ppo-s0").mkdir()
    with pytest.raises(StudyError, match="nothing records the settings run ppo-s0"):
        Study(load_study(write(tmp_path / "j.yaml", grown)), out).prepare(resume=True)


def test_a_claim_is_exclusive_across_processes(tmp_path):
    lock = tmp_path / "run" / ".lock"
    with claim(lock) as first:
        assert first
        with claim(lock) as second:
            assert not second  # held, even by another claim of this very process
        child = "import sys; from pathlib import Path; from agentcredit.lab.study import claim\n"
        child += "with claim(Path(sys.argv[1])) as mine: print(mine)"
        other = subprocess.run(
            [sys.executable, "-c", child, str(lock)], capture_output=True, text=True, check=True
        )
        assert other.stdout.strip() == "False"  # and by another process
    with claim(lock) as again:
        assert again  # released on exit; a holder that died releases it too (the kernel drops its flock)


@pytest.mark.slow
def test_study_runs_resumes_and_reports(tmp_path):
    config = write(tmp_path / "study.yaml", tiny_study())
    out = tmp_path / "study"
    runner = CliRunner()
    first = runner.invoke(app, ["study", "--config", config, "--out", str(out), "--max-runs", "1"])
    assert first.exit_code == 0, first.output
    assert "(rollout backend: hf)" in first.output  # issue 33: each run says which rollout backend it uses
    done = sorted(p.parent.name for p in out.glob("runs/*/done.json"))
    assert done == ["grpo-s0"]  # seed-major order: every arm gets seed 0 before any gets seed 1
    stamp = (out / "runs" / "grpo-s0" / "done.json").stat().st_mtime_ns

    # the start: SFT, warm-up head, tier labels and the start's held-out metrics; held-out sets on disk
    start = json.loads((out / "start" / "summary.json").read_text())
    assert set(start["heldout"]) == {"test", "new"} and start["warmup"]["settings"]["head_epochs"] == 3
    assert set(start["tiers"].values()) <= {"tier1", "tier2"} and len(start["tiers"]) == 6
    assert (out / "start" / "model" / "value_head.pt").is_file()
    assert json.loads((out / "start" / "heldout_start.json").read_text())["tiers"] == start["tiers"]
    assert len((out / "heldout" / "new.jsonl").read_text().splitlines()) == 2

    again = runner.invoke(app, ["study", "--config", config, "--out", str(out)])
    assert again.exit_code == 2 and "--resume" in again.output  # never silently mixes two studies

    # a run stopped before its first checkpoint starts over without keeping its old metric rows
    stale = out / "runs" / "carl-segment-s0"
    stale.mkdir(parents=True)
    (stale / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 9.0}) + "\n")
    rest = runner.invoke(app, ["study", "--config", config, "--out", str(out), "--resume"])
    assert rest.exit_code == 0, rest.output
    assert len(list(out.glob("runs/*/done.json"))) == 4
    assert (out / "runs" / "grpo-s0" / "done.json").stat().st_mtime_ns == stamp  # not repeated
    # finished runs keep their record, not their resume checkpoints (1.5 GB each at 135M with optimizer state)
    assert not list(out.glob("runs/*/checkpoints/*"))

    # critic-free arms start from the SFT model, critic arms from the warmed-up one: the same policy weights
    assert f"name: {out / 'start' / 'sft-model'}" in (out / "runs" / "grpo-s1" / "config.yaml").read_text()
    assert (
        f"name: {out / 'start' / 'model'}" in (out / "runs" / "carl-segment-s1" / "config.yaml").read_text()
    )
    assert all(
        json.loads(line).get("reward/mean") != 9.0
        for line in (stale / "metrics.jsonl").read_text().splitlines()
    )
    run = out / "runs" / "carl-segment-s1"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(
        "eval/accuracy" in m and "eval_new/accuracy" in m and "eval/tier1/tool_call_rate" in m
        for m in metrics
    )
    assert "critic/ece" in json.loads((run / "done.json").read_text())["final"]["test"]

    report = (out / "report" / "report.md").read_text()
    assert "Runs finished: 4 of 4" in report and "## Claims" in report
    assert "The arms with a critic started on this FAILED gate" in report  # allow_failed_gate (issue 31)
    # issue 31: beside the verdicts, where each claim's arms differ (its parts, and the confounds it tolerates)
    assert "## What each claim's two arms differ in" in report
    assert "| fewer calls | carl-segment vs grpo | " in report and "optim.minibatch_size: 16 vs 0" in report
    for name in ("fewer calls", "fewer updated actions", "steadier across seeds"):
        claim_row = next(line for line in report.splitlines() if line.startswith(f"| {name} |"))
        assert claim_row.rstrip(" |").endswith(
            ("UNDERPOWERED", "NOT REPRODUCED", "REPRODUCED", "EFFECT EXCLUDED", "AT THIS SPREAD)")
        )
    assert "training (mean over steps)" in report
    spread_row = next(line for line in report.splitlines() if line.startswith("| steadier across seeds |"))
    assert spread_row.rstrip(" |").endswith("UNDERPOWERED")  # 2 seeds an arm: no spread interval
    assert all((out / "runs" / run / "fingerprint").is_file() for run in ("grpo-s0", "carl-segment-s1"))
    assert "grpo (n=2)" in report and "[" in report  # intervals over two seeds
    assert (out / "report" / "plots" / "curves_test.png").stat().st_size > 0
    html = (out / "report" / "report.html").read_text()
    assert "data:image/png;base64," in html

    # --publish: what a reader needs, beside a hand-written README it leaves alone, and no model
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "README.md").write_text("by hand")
    in_progress = out / "runs" / "grpo-s2"  # a run another process is still training
    in_progress.mkdir()
    (in_progress / "config.yaml").write_text("partial")
    published = runner.invoke(
        app, ["study", "--config", config, "--out", str(out), "--report-only", "--publish", str(docs)]
    )
    assert published.exit_code == 0, published.output
    for name in (
        "report.md",
        "report.html",
        "plots/curves_test.png",
        "study-as-run.yaml",
        "heldout/new.jsonl",
    ):
        assert (docs / name).is_file(), name
    for name in ("summary.json", "sft_summary.json", "warmup_summary.json"):
        assert (docs / "start" / name).is_file(), name
    assert (docs / "runs" / "grpo-s1" / "done.json").is_file()
    assert not (docs / "runs" / "grpo-s2").exists()  # not ended: left out
    shutil.rmtree(in_progress)
    assert (docs / "README.md").read_text() == "by hand"
    assert not list(docs.rglob("*.safetensors")) and not list(docs.rglob("*.pt"))

    # a changed budget cannot reuse these runs; a tampered held-out set is refused
    changed = write(tmp_path / "changed.yaml", tiny_study(steps=2))
    with pytest.raises(StudyError, match="was made with other settings"):
        Study(load_study(changed), out).prepare(resume=True)
    new_start = tiny_study()
    new_start["start"]["sft"]["epochs"] = 2
    with pytest.raises(StudyError, match="shared start was made with a different study file"):
        Study(load_study(write(tmp_path / "s.yaml", new_start)), out).prepare(resume=True)
    (out / "heldout" / "new.jsonl").write_text("{}\n")
    with pytest.raises(StudyError, match="no longer regenerates"):
        Study(load_study(config), out).prepare(resume=True)


@pytest.mark.slow
def test_a_published_study_continues_on_a_machine_that_never_held_it(tmp_path):
    """A fresh clone has the published folder, not the study directory (models are never published): the ended
    runs are restored, the start is rebuilt, and it must be the published start bit for bit."""
    config = write(tmp_path / "study.yaml", tiny_study(seeds=[0]))
    first, docs = tmp_path / "first", tmp_path / "docs"
    runner = CliRunner()
    ran = runner.invoke(
        app, ["study", "--config", config, "--out", str(first), "--max-runs", "1", "--publish", str(docs)]
    )
    assert ran.exit_code == 0, ran.output
    grpo_done = (docs / "runs" / "grpo-s0" / "done.json").read_text()

    fresh = tmp_path / "fresh"
    cont = runner.invoke(
        app, ["study", "--config", config, "--out", str(fresh), "--from-published", str(docs)]
    )
    assert cont.exit_code == 0, cont.output
    assert "restored 1 ended runs" in cont.output
    assert (fresh / "runs" / "grpo-s0" / "done.json").read_text() == grpo_done  # kept, not rerun
    assert (fresh / "runs" / "carl-segment-s0" / "done.json").is_file()  # the run that was left
    assert "Runs finished: 2 of 2" in (fresh / "report" / "report.md").read_text()

    # into a directory that holds a study: refused; a start that comes out different: refused
    again = runner.invoke(
        app, ["study", "--config", config, "--out", str(fresh), "--from-published", str(docs)]
    )
    assert again.exit_code == 2 and "already there" in again.output
    other = tmp_path / "other"
    Study(load_study(config), other).restore(docs)
    (other / "start" / "published_weights").write_text("0" * 32 + "\n")
    study = Study(load_study(config), other)
    study.prepare(resume=True)
    with pytest.raises(StudyError, match="differ from the published start's"):
        study.build_start()
    with pytest.raises(StudyError, match="study-as-run.yaml: missing"):
        Study(load_study(config), tmp_path / "none").restore(tmp_path)


@pytest.mark.slow
def test_a_start_rebuilt_with_other_rounding_goes_on_only_with_the_published_held_out_results(tmp_path):
    """Another CPU's SIMD kernels round SFT's fp32 sums differently (the kb-multihop start, rebuilt on an AVX-512
    Xeon, came out with other bits): the rebuild is accepted where its held-out results are the published start's
    on every metric, each new run records the digest it trained from, and a rebuild that behaves differently is
    refused, naming the metric."""
    config = write(tmp_path / "study.yaml", tiny_study(seeds=[0]))
    docs = tmp_path / "docs"
    ran = CliRunner().invoke(
        app,
        [
            "study",
            "--config",
            config,
            "--out",
            str(tmp_path / "first"),
            "--max-runs",
            "1",
            "--publish",
            str(docs),
        ],
    )
    assert ran.exit_code == 0, ran.output
    record_file = docs / "start" / "heldout_start.json"
    record = json.loads(record_file.read_text())
    built_here = record["weights"]
    # as if the published start had been built on another CPU: other bits, the same held-out results
    record["weights"] = "f" * 32
    record_file.write_text(json.dumps(record))

    study = Study(load_study(config), tmp_path / "fresh")
    study.restore(docs)
    study.prepare(resume=True)
    study.run()
    rebuilt = json.loads((tmp_path / "fresh" / "start" / "heldout_start.json").read_text())
    assert rebuilt["weights"] == built_here and rebuilt["equivalent_to"] == ["f" * 32]
    assert (
        tmp_path / "fresh" / "runs" / "carl-segment-s0" / "start_weights"
    ).read_text().strip() == built_here

    first_set = next(iter(record["heldout"]))
    record["heldout"][first_set]["accuracy"] += 0.5  # a rebuild that answers differently
    record_file.write_text(json.dumps(record))
    other = Study(load_study(config), tmp_path / "other")
    other.restore(docs)
    other.prepare(resume=True)
    with pytest.raises(StudyError, match=f"held-out behaviour \\({first_set}/accuracy: published"):
        other.build_start()


def test_a_saved_start_drops_an_sft_checkpoint_left_behind(tmp_path):
    """Regression: a process that died between saving the SFT model and deleting its checkpoint left the
    checkpoint (about 1.6 GB at 135M) for good, since the harness then reuses the saved model and never reaches
    run_sft's own deletion."""
    study = Study(load_study(write(tmp_path / "a.yaml", tiny_study())), tmp_path / "study")
    sft_dir = study.start_dir / "sft-model"
    sft_dir.mkdir(parents=True)
    (sft_dir / "sft_summary.json").write_text("{}")
    stale = study.start_dir / "sft-model.partial"
    stale.mkdir()
    (stale / "sft-checkpoint.pt").write_bytes(b"x")
    assert study.sft() == sft_dir
    assert not stale.exists()
