"""``agentcredit study``: methods compared on one task from one shared start, over seeds, on fixed held-out sets.

A study file (YAML, see ``studies/``) names

* ``start``: the shared starting point: SFT on scripted demonstrations (optionally calling the tool on a fixed
  share of questions, so *when to call* is left open) and an optional carl-segment critic warm-up;
* ``heldout``: the evaluation question sets, written to ``heldout/<name>.jsonl`` before any run and checked
  unchanged on every resume (a study never evaluates on a set it could have tuned on);
* ``arms`` (a preset plus overrides each), ``seeds``, ``steps`` and ``eval_every``: the same rollout budget
  for every arm;
* ``claims``: what the report tests, each a metric, a direction and the two arms compared.

Layout of a study directory::

    study.yaml                 the study file as run (a resume refuses a study whose runs would differ)
    heldout/<set>.jsonl        the fixed held-out questions
    start/sft-model/           the SFT model; start/model/ adds the warmed-up value head (or is the SFT model)
    start/summary.json         the start's held-out metrics (step 0 of every curve), tier labels, warm-up gate
    runs/<arm>-s<seed>/        ordinary run directories (config.yaml, metrics.jsonl, checkpoints)
        done.json              written last: the run is finished and never repeated; its checkpoints are then
                               deleted (they only serve a resume, and with optimizer state a 135M model's are
                               1.5 GB each: 18 runs kept 56 GB). A diverged run (failed.json) keeps them.
    report/                    report.md, report.html, plots/

A study resumes where it stopped: finished runs are skipped, an unfinished run continues from its last
checkpoint. On a machine that never held the study directory (a fresh clone), ``--from-published`` lays the
published folder's ended runs into a new one; the start is rebuilt and must match the published start's weights,
or, where another CPU rounds differently, its held-out results on every metric (each run records the digest of the
start it trained from in ``start_weights``). Several invocations can share the work: each run is claimed with a lock file, so a second
``agentcredit study --resume`` started beside the first takes the next free run.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from agentcredit.lab.arms import claim_differences, study_config  # noqa: F401 (claim_differences: re-exported)
from agentcredit.lab.common import StudyError, _digest, _weights_digest, _write_json  # noqa: F401
from agentcredit.lab.preflight import StartSteps, run_preflight
from agentcredit.lab.study_report import write_study_report
from agentcredit.lab.study_spec import (  # noqa: F401 (the study file's names, re-exported)
    ArmSpec,
    ClaimSpec,
    HeldoutSpec,
    PreconditionSpec,
    SftSpec,
    StudyLayout,
    StudySpec,
    WarmupSpec,
    load_study,
)
from agentcredit.locks import claim
from agentcredit.tasks import Example, load_task

Log = Callable[[str], None]


def no_success_share(trees: list[Any]) -> float:
    """Share of a step's groups (one tree per question) in which no trajectory is correct (outcome >= 1): where
    a group-relative method has nothing to prefer and PORTool's decayed -1 outcome favours searching (issue 32)."""
    if not trees:
        return math.nan
    return sum(1 for t in trees if not any(r >= 1.0 for r in t.outcomes().values())) / len(trees)


# ------------------------------------------------------------------------------------------------ the study
class Study:
    def __init__(self, spec: StudySpec, directory: str | Path, *, source: str = "", log: Log = print):
        self.spec, self.dir, self.log = spec, Path(directory), log
        self.source = source
        # what the preflight and the report read: the study file and its directory, never this runner
        self.layout = StudyLayout(spec, self.dir)
        # set by the preflight (--allow-unmet-regime): the arms run although a precondition is not met, which
        # also lets critic arms start on a failed warm-up gate; the report stamps every verdict
        self.override_regime = False

    # where things are, and what the study file fixes (StudyLayout)
    @property
    def start_dir(self) -> Path:
        return self.layout.start_dir

    def run_dir(self, arm: str, seed: int) -> Path:
        return self.layout.run_dir(arm, seed)

    def runs(self) -> list[tuple[ArmSpec, int]]:
        return self.layout.runs()

    def heldout_sets(self) -> dict[str, list[Example]]:
        return self.layout.heldout_sets()

    def arm_start(self, arm: ArmSpec) -> Path:
        return self.layout.arm_start(arm)

    def critic_only_steps(self, arm: ArmSpec) -> int:
        return self.layout.critic_only_steps(arm)

    # ---------------------------------------------------------------- set-up
    def prepare(self, *, resume: bool) -> None:
        """Create the directory, or check that the one there belongs to this study."""
        marker = self.dir / "study.yaml"
        if marker.is_file():
            if not resume:
                raise StudyError(f"{self.dir}: a study is already there; add --resume to continue it")
            old = yaml.safe_load(marker.read_text()) or {}
            started = (self.start_dir / "sft-model").exists()
            ran = (self.dir / "runs").is_dir() and any((self.dir / "runs").iterdir())
            if started and old.get("start_fingerprint") != self.spec.start_fingerprint():
                raise StudyError(
                    f"{self.dir}: its shared start was made with a different study file (start, held-out sets or "
                    "common settings changed); use a new --out directory"
                )
            if ran:
                self._check_runs(old)
        self.dir.mkdir(parents=True, exist_ok=True)
        marker.write_text(
            yaml.safe_dump(
                {
                    "fingerprint": self.spec.runs_fingerprint(),
                    "start_fingerprint": self.spec.start_fingerprint(),
                    "source": self.source,
                    "spec": self.spec.model_dump(mode="json"),
                },
                sort_keys=False,
            )
        )
        self._fix_heldout()
        self._check_training_sets()

    def _check_training_sets(self) -> None:
        """Every arm's training questions load, as its trainer will load them, before the start's SFT or a
        precondition is paid for. Loading is cheap (kb-multihop's 1,500 questions take ~10 ms); a hop mix the world
        cannot fill was otherwise found at the first timed step, after the preflight's 80-minute precondition
        (issue 32)."""
        from agentcredit.tasks import load_examples

        for arm in self.spec.arms:
            try:
                load_examples(self.run_config(arm, self.spec.seeds[0]))
            except ValueError as exc:
                raise StudyError(f"{self.source or self.dir}: arm {arm.name!r}: {exc}") from exc

    def restore(self, published: str | Path) -> int:
        """Lay a published study (the folder ``--publish`` wrote) into this empty directory, so that a fresh
        clone can resume it: the study file as run, the held-out sets, the ended runs' records and the start's
        weight digest. Returns the number of ended runs restored.

        Models are never published, so the shared start is rebuilt by the next :meth:`run`; its weights must come
        out bit-identical to the published start's (SFT is seeded), because the restored runs trained from those.
        If they do not, the rebuild stops rather than mixing runs from two starts.
        """
        published = Path(published)
        if (self.dir / "study.yaml").exists():
            raise StudyError(f"{self.dir}: a study is already there; restore into a new --out directory")
        as_run = published / "study-as-run.yaml"
        start_record = published / "start" / "heldout_start.json"
        for needed in (as_run, start_record):
            if not needed.is_file():
                raise StudyError(f"{needed}: missing; --from-published needs a folder written by --publish")
        weights = json.loads(start_record.read_text()).get("weights")
        if not weights:
            raise StudyError(f"{start_record}: no 'weights' digest of the published start")
        self.start_dir.mkdir(parents=True)
        shutil.copyfile(as_run, self.dir / "study.yaml")
        shutil.copyfile(start_record, self.start_dir / "heldout_start.json")
        (self.start_dir / "published_weights").write_text(weights + "\n")
        (self.dir / "heldout").mkdir()
        for path in sorted((published / "heldout").glob("*.jsonl")):
            shutil.copyfile(path, self.dir / "heldout" / path.name)
        ended = [
            run
            for run in sorted((published / "runs").iterdir() if (published / "runs").is_dir() else [])
            if (run / "done.json").is_file() or (run / "failed.json").is_file()
        ]
        for run in ended:
            shutil.copytree(run, self.dir / "runs" / run.name)
        return len(ended)

    def _check_runs(self, old: dict[str, Any]) -> None:
        """Refuse a study file under which an existing run would have computed something else.

        Each run records its fingerprint (:meth:`StudySpec.run_fingerprint`) in ``<run>/fingerprint`` when it is
        first claimed; a run from before that file existed is judged by the previous invocation's study file
        (``study.yaml``). A run keeps its meaning if that fingerprint equals the one under the new file. New arms
        and seeds are welcome; a run whose arm or seed the new file drops is kept on disk and left out of the
        report; a run whose settings nothing records is refused rather than guessed.
        """
        try:
            previous = StudySpec.model_validate(old.get("spec") or {})
        except ValidationError:
            previous = None
        for run_dir in sorted(p for p in (self.dir / "runs").iterdir() if p.is_dir()):
            arm, _, seed_text = run_dir.name.rpartition("-s")
            try:
                seed = int(seed_text)
            except ValueError:
                continue  # not a run directory of a study
            now = self.spec.run_fingerprint(arm, seed)
            if now is None or seed not in self.spec.seeds:
                continue
            recorded_file = run_dir / "fingerprint"
            if recorded_file.is_file():
                recorded = recorded_file.read_text().strip()
            else:
                recorded = previous.run_fingerprint(arm, seed) if previous is not None else None
            if recorded is None:
                raise StudyError(
                    f"{self.dir}: nothing records the settings run {run_dir.name} was made with; use a new --out "
                    "directory, or remove that run"
                )
            if recorded != now:
                raise StudyError(
                    f"{self.dir}: run {run_dir.name} was made with other settings (its arm, the common settings or "
                    "the budget changed); use a new --out directory, or add the change as a new arm"
                )

    def _task(self) -> tuple[str, int, dict[str, Any]]:
        cfg = study_config(self.spec.start.preset, [*self.spec.set, *self.spec.start.set])
        return cfg.task.name, cfg.task.seed, dict(cfg.task.options)

    def _fix_heldout(self) -> None:
        """Write each held-out set once; afterwards it must regenerate to the very same questions."""
        folder = self.dir / "heldout"
        folder.mkdir(exist_ok=True)
        task, _, task_options = self._task()
        for h in self.spec.heldout:
            own = h.task is not None and h.task != task  # another task's options are not the study task's
            examples = load_task(
                h.task or task,
                split=h.split,
                limit=h.limit,
                seed=h.seed,
                **{**({} if own else task_options), **h.options},
            )
            text = "".join(json.dumps(e.to_dict(), sort_keys=True) + "\n" for e in examples)
            path = folder / f"{h.name}.jsonl"
            if path.is_file() and path.read_text() != text:
                raise StudyError(f"{path}: the held-out set no longer regenerates to the same questions")
            if not path.is_file():
                path.write_text(text)

    # ---------------------------------------------------------------- start
    def start_model(self) -> Path:
        return self.start_dir / ("model" if self.spec.start.warmup is not None else "sft-model")

    def build_start(self) -> dict[str, Any]:
        """SFT (+ warm-up), tier labels of the held-out questions and the start's held-out metrics; once."""
        summary_path = self.start_dir / "summary.json"
        if summary_path.is_file():
            return json.loads(summary_path.read_text())
        while True:
            with claim(self.start_dir / ".lock") as mine:
                if mine:
                    if summary_path.is_file():
                        return json.loads(summary_path.read_text())
                    return self._build_start(summary_path)
            self.log("the shared start is being built by another invocation; waiting")
            time.sleep(30)
            if summary_path.is_file():
                return json.loads(summary_path.read_text())

    def sft(self) -> Path:
        """The SFT model of the shared start (trained once; ``start.sft.set`` applies to its demonstrations)."""
        from agentcredit.run import discard_sft_checkpoint, run_sft

        s = self.spec.start
        sft_dir = self.start_dir / "sft-model"
        if (sft_dir / "sft_summary.json").is_file():
            discard_sft_checkpoint(sft_dir)  # left behind if a process died between the save and its deletion
            return sft_dir
        # callers hold the start's lock (build_start) or the preflight's (preflight.run_preflight)
        cfg = study_config(s.preset, [*self.spec.set, *s.set, *s.sft.set])
        self.log(
            f"[start] SFT on {s.sft.examples} demonstrations (tool share {s.sft.tool_share}"
            + (f", prompts {s.sft.prompts}" if s.sft.prompts else "")
            + (f", {s.sft.direct_answers} direct answers" if s.sft.direct_answers != "plain" else "")
            + ")"
        )
        run_sft(
            cfg,
            sft_dir,
            examples=s.sft.examples,
            epochs=s.sft.epochs,
            lr=s.sft.lr,
            tool_share=s.sft.tool_share,
            prompts=s.sft.prompts,
            direct_answers=s.sft.direct_answers,
            log=self.log,
        )
        return sft_dir

    def _build_start(self, summary_path: Path) -> dict[str, Any]:
        from agentcredit.run import run_warmup

        s = self.spec.start
        cfg = study_config(s.preset, [*self.spec.set, *s.set])
        started = time.perf_counter()
        summary: dict[str, Any] = {}
        sft_dir = self.sft()
        summary["sft"] = json.loads((sft_dir / "sft_summary.json").read_text())
        start_cfg = study_config(s.preset, [*self.spec.set, *s.set, f"model.name={sft_dir}"])
        if s.warmup is not None:
            from agentcredit.train.warmup import WarmupSettings

            w = s.warmup
            warm_dir = self.start_dir / "model"
            if not (warm_dir / "warmup_summary.json").is_file():
                self.log(f"[start] critic warm-up on {w.questions} questions")
                settings = WarmupSettings(
                    tier_samples=w.tier_samples,
                    rollouts_per_mode=w.rollouts_per_mode,
                    modes=tuple(w.modes),
                    states=w.states,
                    head_epochs=w.head_epochs,
                    steps=w.steps,
                    pairs_per_step=w.pairs_per_step,
                    seed=cfg.train.seed,
                )
                run_warmup(start_cfg, warm_dir, questions=w.questions, settings=settings, log=self.log)
            summary["warmup"] = json.loads((warm_dir / "warmup_summary.json").read_text())
            if not summary["warmup"].get("passed") and not self._gate_allowed():
                from agentcredit.train.warmup import gate_failures

                raise StudyError(
                    f"{warm_dir / 'warmup_summary.json'}: the critic warm-up gate failed "
                    f"({', '.join(gate_failures(summary['warmup'].get('gate', {})))}); the arms do not start on a "
                    "failed gate: enlarge start.warmup, or set start.warmup.allow_failed_gate: true"
                )
            summary["warmup"]["allowed_failed"] = not summary["warmup"].get("passed")
        model_dir = self.start_model()
        cached = self.heldout_record(model_dir, start_cfg)
        summary["tiers"], summary["heldout"] = cached["tiers"], cached["heldout"]
        summary["seconds"] = time.perf_counter() - started
        summary["model"] = str(model_dir)
        _write_json(summary_path, summary)
        self.log(
            "[start] held-out: "
            + "; ".join(
                f"{name}: accuracy {m['accuracy']:.3f}, tool-call rate {m['tool_call_rate']:.3f}"
                for name, m in summary["heldout"].items()
            )
        )
        return summary

    def heldout_record(self, model_dir: Path, start_cfg: Any) -> dict[str, Any]:
        """Tier labels (with their per-question counts) and the greedy held-out evaluation of the policy in
        ``model_dir``, kept in ``start/heldout_start.json`` keyed by a digest of its weights: computed once per
        policy. The preflight asks for it on the SFT model before the warm-up (the power analysis reads it); a
        warm-up that trains only the value head leaves the policy's weights, and so this record, as they were."""
        from agentcredit.models.device import config_device
        from agentcredit.models.loading import load_base_model

        sets = self.heldout_sets()
        # tier labels and the start's held-out metrics depend on the start policy's weights only (not on the
        # value head), so they are kept keyed by a digest of those weights and survive a redone head warm-up
        cache = self.start_dir / "heldout_start.json"
        weights = _weights_digest(model_dir)
        cached = json.loads(cache.read_text()) if cache.is_file() else {}
        published_file = self.start_dir / "published_weights"
        published = published_file.read_text().strip() if published_file.is_file() else None
        if cached.get("weights") != weights:
            from agentcredit.train.warmup import labels_from_counts

            model, tokenizer = load_base_model(
                str(model_dir), start_cfg.model.dtype, device=config_device(start_cfg)
            )
            counts = self._tier_counts(model, tokenizer, start_cfg, sets)
            tiers = labels_from_counts(counts) if counts else {}
            began = time.perf_counter()
            evaluation = self._evaluate(model, tokenizer, start_cfg, sets, tiers)
            del model
            fresh = {"weights": weights, "tiers": tiers, "heldout": evaluation}
            if counts:  # how many of tier_samples no-tool samples were right: the strict Tier-2 rule reads it
                fresh["tier_counts"] = counts
            # one greedy evaluation of every held-out set: the unit of a study's planned evaluation time
            fresh["eval_seconds"] = time.perf_counter() - began
            if published and published != weights:
                fresh["equivalent_to"] = self._check_equivalent_rebuild(published, cached, fresh)
            cached = fresh
            _write_json(cache, cached)
        elif published and published != weights and published not in cached.get("equivalent_to", []):
            raise StudyError(
                f"{model_dir}: the start's weights (digest {weights}) differ from the published start's "
                f"({published}), from which the restored runs trained; run it anew in a new --out directory"
            )
        return cached

    def _check_equivalent_rebuild(
        self, published: str, record: dict[str, Any], rebuilt: dict[str, Any]
    ) -> list[str]:
        """Accept a rebuilt start whose weights differ from the published start's only where its greedy held-out
        results (every metric of every held-out set, and the tier labels) are the published ones; else refuse.

        SFT is seeded, but fp32 sums round differently under other SIMD kernels: the kb-multihop start rebuilt on
        an AVX-512 Xeon (2026-11-27) came out with other bits than on the machine that published it. Bit equality
        would tie a study to one CPU model, and models are never published. Equal held-out behaviour is checked
        instead, and each run records the digest it trained from (``<run>/start_weights``), so the report can say
        which runs came from which build. Returns the chain of digests this rebuild is equivalent to.
        """
        differ = {
            f"{name}/{key}": (value, rebuilt["heldout"].get(name, {}).get(key))
            for name, metrics in record.get("heldout", {}).items()
            for key, value in metrics.items()
            if not math.isclose(value, rebuilt["heldout"].get(name, {}).get(key, math.nan), rel_tol=1e-9)
        }
        if record.get("weights") != published or differ or record.get("tiers", {}) != rebuilt["tiers"]:
            shown = "; ".join(f"{k}: published {a}, rebuilt {b}" for k, (a, b) in sorted(differ.items())[:6])
            raise StudyError(
                f"{self.start_dir}: the rebuilt start's weights (digest {rebuilt['weights']}) differ from the "
                f"published start's ({published}), from which the restored runs trained, and so does its held-out "
                f"behaviour ({shown or 'tier labels differ'}); the two cannot be compared in one study. Run it anew "
                "in a new --out directory"
            )
        self.log(
            f"[start] the rebuilt start's weights differ from the published start's by float rounding (digest "
            f"{rebuilt['weights']} vs {published}: this CPU's kernels), and its held-out results are the published "
            "ones on every metric: going on; new runs record the digest they trained from"
        )
        return [published, *record.get("equivalent_to", [])]

    def _tier_counts(self, model, tokenizer, cfg, sets) -> dict[str, int]:
        if self.spec.tier_samples == 0:
            return {}
        from agentcredit.train.warmup import tier_counts

        examples = [e for exs in sets.values() for e in exs]
        self.log(
            f"[start] tier labels: {self.spec.tier_samples} no-tool samples for {len(examples)} held-out questions"
        )
        return tier_counts(model, tokenizer, cfg, examples, self.spec.tier_samples, seed=12345)

    def _evaluate(self, model, tokenizer, cfg, sets, tiers) -> dict[str, dict[str, float]]:
        from agentcredit.environment import build_environment
        from agentcredit.eval.evaluate import evaluate, require_all_scored, rollout_caps

        env = build_environment(cfg)
        out = {}
        try:
            for name, examples in sets.items():
                summary, records = evaluate(
                    model,
                    tokenizer,
                    env,
                    examples,
                    tiers={e.id: tiers[e.id] for e in examples} if tiers else None,
                    progress=f"start eval {name}",
                    **rollout_caps(cfg),
                )
                require_all_scored(summary, f"the start's held-out evaluation '{name}'")
                out[name] = summary
                with open(self.start_dir / f"eval_{name}_episodes.jsonl", "w") as fh:
                    for record in records:
                        fh.write(json.dumps(record) + "\n")
        finally:
            env.close()
        return out

    # ---------------------------------------------------------------- runs
    def _start_weights(self) -> str:
        return json.loads((self.start_dir / "heldout_start.json").read_text())["weights"]

    def run_config(self, arm: ArmSpec, seed: int):
        first = self.spec.heldout[0]
        return study_config(
            arm.preset,
            [
                *self.spec.set,
                *arm.set,
                f"model.name={self.arm_start(arm)}",
                f"train.seed={seed}",
                f"train.steps={self.spec.steps + self.critic_only_steps(arm)}",
                f"train.eval_every={self.spec.eval_every}",
                f"task.eval_limit={first.limit}",
                # the start's gate was judged once, in _build_start, against start.warmup.allow_failed_gate
                *(["train.allow_failed_gate=true"] if self._gate_allowed() else []),
            ],
            arm.name,
        )

    def _gate_allowed(self) -> bool:
        warm = self.spec.start.warmup
        return warm is not None and (warm.allow_failed_gate or self.override_regime)

    def run_one(self, arm: ArmSpec, seed: int, start: dict[str, Any]) -> bool:
        """Train (or continue) one run; False if another invocation holds it."""
        from agentcredit.run import HeldoutEvaluation, write_episodes
        from agentcredit.train.checkpoint import latest_checkpoint
        from agentcredit.train.trainer import NonFiniteLoss, Trainer

        run_dir = self.run_dir(arm.name, seed)
        with claim(run_dir / ".lock") as mine:
            if not mine:
                return False
            if (run_dir / "done.json").is_file() or (run_dir / "failed.json").is_file():
                return True
            fingerprint = run_dir / "fingerprint"
            if not fingerprint.is_file():  # what this run computes; a later study file is checked against it
                fingerprint.write_text(self.spec.run_fingerprint(arm.name, seed) + "\n")
            start_weights = run_dir / "start_weights"
            # which build of the start it trains from (_check_equivalent_rebuild)
            if not start_weights.is_file():
                start_weights.write_text(self._start_weights() + "\n")
            cfg = self.run_config(arm, seed)
            progress_path = run_dir / "progress.json"
            spent = json.loads(progress_path.read_text())["seconds"] if progress_path.is_file() else 0.0
            began = time.perf_counter()
            trainer = Trainer(cfg, run_dir=run_dir)
            try:
                if latest_checkpoint(run_dir) is not None:
                    trainer.resume(run_dir)
                    self.log(f"[{arm.name} seed {seed}] resumed at step {trainer.step}")
                elif trainer.logger is not None:  # stopped before its first checkpoint: it starts over
                    trainer.logger.drop_after(0)
                evaluation = HeldoutEvaluation(
                    self.heldout_sets(),
                    every=self.spec.eval_every,
                    last_step=self.spec.steps,
                    critic_only=self.critic_only_steps(arm),
                    tiers=start.get("tiers") or None,
                    log=lambda line: self.log(f"[{arm.name} seed {seed}] {line}"),
                )

                def on_step(tr, result):
                    if tr.logger is not None and result.trees:  # the regime, step by step, for every method
                        tr.logger.log(tr.step, {"study/no_success_groups": no_success_share(result.trees)})
                    evaluation(tr, result)
                    _write_json(
                        progress_path, {"step": tr.step, "seconds": spent + time.perf_counter() - began}
                    )

                if trainer.step == 0:
                    self.log(
                        f"[{arm.name} seed {seed}] training {self.spec.steps} steps"
                        + (f" after {co} critic-only steps" if (co := self.critic_only_steps(arm)) else "")
                        + f" in {run_dir} (rollout "
                        f"backend: {cfg.rollout.backend})"
                    )
                try:
                    trainer.train(progress=False, on_step=on_step)
                except NonFiniteLoss as exc:  # a diverged run: recorded and reported, the study goes on
                    _write_json(run_dir / "failed.json", {"error": str(exc), "step": trainer.step})
                    self.log(f"[{arm.name} seed {seed}] FAILED: {exc}")
                    return True
                if not evaluation.latest:  # resumed after the last step but before done.json
                    evaluation.run(trainer)
                finals = {}
                for name, (summary, records) in evaluation.latest.items():
                    finals[name] = summary
                    write_episodes(run_dir / f"eval_{name}_episodes.jsonl", records)
                first = self.spec.heldout[0].name
                (run_dir / "eval_summary.json").write_text(json.dumps(finals[first], indent=2))
                write_episodes(run_dir / "eval_episodes.jsonl", evaluation.latest[first][1])
            finally:
                trainer.close()
            _write_json(
                run_dir / "done.json",
                {"final": finals, "seconds": spent + time.perf_counter() - began, "finished": time.time()},
            )
            # done.json is on disk first, so a kill here leaves a finished run with some checkpoints, never a
            # run with neither
            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
            self.log(
                f"[{arm.name} seed {seed}] done: "
                + ", ".join(f"{n}/accuracy={m['accuracy']:.3f}" for n, m in finals.items())
            )
        return True

    def publish(self, dest: str | Path) -> list[Path]:
        """Copy what a reader needs into ``dest`` (e.g. ``docs/results/<name>``), without any model.

        The report with its plots, the study file as run, the held-out questions, the start's summaries and per
        ended run its config, metrics and final summaries. Files already in ``dest`` that the study does not write (a
        hand-written README) are left alone. Returns the files written.
        """
        import shutil

        dest = Path(dest)
        pairs = [(self.dir / "study.yaml", dest / "study-as-run.yaml")]
        report = self.dir / "report"
        pairs += [(f, dest / f.relative_to(report)) for f in sorted(report.rglob("*")) if f.is_file()]
        pairs += [(f, dest / "heldout" / f.name) for f in sorted((self.dir / "heldout").glob("*.jsonl"))]
        pairs.append((self.dir / "preflight" / "preflight.json", dest / "preflight.json"))
        for name in (
            "summary.json",
            "heldout_start.json",
            "sft-model/sft_summary.json",
            "model/warmup_summary.json",
        ):
            pairs.append((self.start_dir / name, dest / "start" / Path(name).name))
        runs = self.dir / "runs"
        # a run still in progress is left out: its files change until it ends, and the report does not count it
        ended = [
            p
            for p in (runs.iterdir() if runs.is_dir() else [])
            if (p / "done.json").is_file() or (p / "failed.json").is_file()
        ]
        for run in sorted(ended):
            for name in (
                "config.yaml",
                "metrics.jsonl",
                "eval_summary.json",
                "progress.json",
                "done.json",
                "failed.json",
                "start_weights",
            ):
                pairs.append((run / name, dest / "runs" / run.name / name))
        written = []
        for source, target in pairs:
            if source.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
                written.append(target)
        return written

    def preflight(
        self, *, allow_unmet: bool = False, allow_underpowered: bool = False, time_steps: bool = True
    ) -> dict[str, Any]:
        """The pre-arm phase (:func:`agentcredit.lab.preflight.run_preflight`): it is handed the study's layout and
        the start's steps, and raises StudyError to refuse the arms."""
        # the arms run although a precondition is not met; this also lets critic arms start on a failed gate
        self.override_regime = allow_unmet
        steps = StartSteps(
            sft=self.sft,
            heldout_record=self.heldout_record,
            build_start=self.build_start,
            run_config=self.run_config,
        )
        return run_preflight(
            self.layout,
            steps,
            log=self.log,
            allow_unmet=allow_unmet,
            allow_underpowered=allow_underpowered,
            time_steps=time_steps,
        )

    def run(
        self,
        *,
        only: list[str] | None = None,
        max_runs: int | None = None,
        preflight_only: bool = False,
        allow_unmet_regime: bool = False,
        allow_underpowered: bool = False,
    ) -> dict[str, Any]:
        """The preflight of a pre-registered study (preconditions, power, budget: it may refuse the arms), the
        start if needed, then every unfinished run this invocation can claim; then the report."""
        if self.spec.preregistered:
            try:
                self.preflight(allow_unmet=allow_unmet_regime, allow_underpowered=allow_underpowered)
            finally:  # the measured values reach the report even when the arms are refused
                write_study_report(self.layout, self.dir / "report")
        elif preflight_only:
            raise StudyError(
                f"{self.source or self.dir}: --preflight-only needs a study with preconditions or paper effects"
            )
        if preflight_only:
            paths = write_study_report(self.layout, self.dir / "report")
            return {"runs_done_now": 0, **{k: str(v) for k, v in paths.items()}}
        start = self.build_start()
        done = 0
        for arm, seed in self.runs():
            if only and arm.name not in only:
                continue
            if any((self.run_dir(arm.name, seed) / f).is_file() for f in ("done.json", "failed.json")):
                continue
            if max_runs is not None and done >= max_runs:
                break
            if self.run_one(arm, seed, start):
                done += 1
                write_study_report(self.layout, self.dir / "report")  # results as they arrive
            else:
                self.log(f"[{arm.name} seed {seed}] held by another invocation; skipped")
        paths = write_study_report(self.layout, self.dir / "report")
        return {"runs_done_now": done, **{k: str(v) for k, v in paths.items()}}
