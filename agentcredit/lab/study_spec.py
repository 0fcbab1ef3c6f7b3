"""The study file of ``agentcredit study`` (see ``studies/``) and the layout of its directory.

``StudySpec`` and its parts are the schema (each field says what it means), ``load_study`` reads a file and
refuses one whose claims compare arms that differ outside what the claim is about, and ``StudyLayout`` names where a
study keeps what (its start, its runs, its held-out sets): the record the runner hands to the preflight and the
report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer, model_validator

from agentcredit.config import ConfigError, load_yaml_file
from agentcredit.lab.arms import claim_differences, resolved_protocol, study_config
from agentcredit.lab.common import StudyError, _digest
from agentcredit.tasks import Example


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SftSpec(_Spec):
    examples: int = Field(128, ge=1, description="Training questions demonstrated.")
    epochs: int = Field(2, ge=1, description="SFT epochs.")
    lr: float = Field(5e-5, gt=0, description="SFT learning rate.")
    tool_share: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Demonstrations call the tool on this share of questions regardless of tier (None: by tier).",
    )
    prompts: dict[str, float] | None = Field(
        None,
        description="codefence prompt mode -> share of the demonstrations replayed under that system prompt "
        "(optional, forced, no_tool; shares sum to 1): no_tool demonstrations answer directly, forced ones call the "
        "tool, those under the protocol's own prompt follow tool_share. None: all under the own prompt.",
    )
    direct_answers: Literal["plain", "worked"] = Field(
        "plain",
        description="How an arithmetic demonstration without the tool answers (codefence): 'plain' states the "
        "result (28+15 = 43), 'worked' shows its steps where the expression's shape has them (28+10 = 38, "
        "38+5 = 43; 15-5 = 10, 10-3 = 7; products counted up): agentcredit.train.demos.worked_steps.",
    )
    set: list[str] = Field(
        default_factory=list,
        description="Overrides for the SFT demonstrations only (e.g. a clean tool, task.options.tool_failure_rate=0, "
        "where the study's environment has a tool that can fail: a demonstration must not teach ignoring it).",
    )

    @model_serializer(mode="wrap")
    def _without_empty_set(self, handler: Any) -> dict[str, Any]:
        # studies written before the field existed keep their start fingerprint
        data = handler(self)
        if not data.get("set"):
            data.pop("set", None)
        if data.get("prompts") is None:
            data.pop("prompts", None)
        if data.get("direct_answers") == "plain":
            data.pop("direct_answers", None)
        return data

    @model_validator(mode="after")
    def _prompt_shares(self) -> SftSpec:
        if self.prompts is not None:
            from agentcredit.protocols.codefence import SYSTEM_PROMPTS

            unknown = sorted(set(self.prompts) - set(SYSTEM_PROMPTS))
            if unknown:
                raise ValueError(
                    f"prompts: unknown prompt mode(s) {unknown}; one of {sorted(SYSTEM_PROMPTS)}"
                )
            if any(v < 0 for v in self.prompts.values()) or abs(sum(self.prompts.values()) - 1.0) > 1e-6:
                raise ValueError(f"prompts: shares must be >= 0 and sum to 1, got {self.prompts}")
        return self


class WarmupSpec(_Spec):
    questions: int = Field(
        300,
        ge=4,
        description="Warm-up questions (training split; 20% held out for the gate: 300 judges it on 60). A "
        "scale-down of the paper's 32K rollouts (Table 4), sized for the gate.",
    )
    tier_samples: int = Field(
        5, ge=1, description="No-tool samples per question for the tier labels (paper: 5)."
    )
    rollouts_per_mode: int = Field(
        2, ge=1, description="Rollouts per question and mode (>= 2: a state's target is not one 0/1 draw)."
    )
    modes: list[Literal["forced", "no_tool", "optional"]] = Field(
        ["forced", "no_tool"],
        description="Prompt modes (paper: forced-tool and no-tool; 'optional' adds on-policy rollouts with the "
        "PPO prompt, a variant).",
    )
    states: Literal["mode", "canonical"] = Field(
        "mode",
        description="Boundary states in their mode's own prompt, or re-rendered with the PPO prompt "
        "(carl-segment.md A14's default, which caps the gate's EV near 0.21: agentcredit.train.warmup).",
    )
    head_epochs: int = Field(50, ge=0, description="Head-only epochs on cached boundary features.")
    steps: int = Field(0, ge=0, description="Joint head + backbone steps after the head epochs.")
    pairs_per_step: int = Field(64, ge=4, description="(state, R) pairs per joint step.")
    allow_failed_gate: bool = Field(
        False,
        description="Run the arms with a critic although the warm-up gate failed (carl-segment: the warm-up "
        "continues until the gate passes); the study report then says so.",
    )


class StartSpec(_Spec):
    preset: str = Field(
        ..., description="Preset (or YAML) whose task, protocol and rollout caps the start uses."
    )
    set: list[str] = Field(default_factory=list, description="Overrides for the start's config.")
    sft: SftSpec = Field(default_factory=SftSpec)
    warmup: WarmupSpec | None = Field(None, description="carl-segment critic warm-up of the SFT model.")


class HeldoutSpec(_Spec):
    name: str = Field(..., pattern=r"^[A-Za-z0-9_-]+$", description="Set name, used in metric names.")
    split: str = Field("test", description="Split of the study's task.")
    limit: int = Field(64, ge=1, description="Questions.")
    seed: int = Field(0, description="Generation / subset seed.")
    options: dict[str, Any] = Field(default_factory=dict, description="Task options (e.g. phrasing: new).")
    task: str | None = Field(
        None,
        description="Another task for this set, e.g. bfcl:irrelevance (a BFCL category no arm trains on; needs "
        "protocol chat); default: the study's own task.",
    )

    @model_validator(mode="after")
    def _known_task(self) -> HeldoutSpec:
        from agentcredit.tasks.bfcl import categories_of, is_bfcl

        if self.task is not None and is_bfcl(self.task):
            categories_of(
                self.task
            )  # an unknown or unsupported category is an error now, not after the start
        return self

    @model_serializer(mode="wrap")
    def _without_unset_task(self, handler: Any) -> dict[str, Any]:
        # a set without its own task serialises as before the field existed, so the fingerprints of studies
        # written then (start, runs) stay the same
        data = handler(self)
        if data.get("task") is None:
            data.pop("task", None)
        return data


class ArmSpec(_Spec):
    name: str = Field(..., pattern=r"^[A-Za-z0-9_.+-]+$", description="Arm name (a run is <arm>-s<seed>).")
    preset: str = Field(..., description="Preset or YAML of the method.")
    set: list[str] = Field(default_factory=list, description="Overrides for this arm only.")


class PreconditionSpec(_Spec):
    """A regime a claim needs, measured on the start policy with training questions before any arm runs."""

    name: str = Field(..., description="The precondition in words.")
    source: str = Field(..., min_length=1, description="The paper line that makes it the method's regime.")
    measure: Literal["tool_gap", "group_success", "metric", "warmup_gate"] = Field(
        ...,
        description="tool_gap: P(correct | no-tool prompt) - P(correct | forced-tool prompt) on the training "
        "questions of a tier; group_success: share of an arm's step-1 groups (trees) holding a correct trajectory; "
        "metric: an eval summary key of sampled episodes (e.g. hop3/accuracy, easy/accuracy); warmup_gate: a key "
        "of the critic warm-up's gate (explained_variance, auc, sign_accuracy).",
    )
    tier: Literal["tier1", "tier2"] | None = Field(
        None,
        description="tool_gap: the questions of this tier (no-tool samples of the start, paper's 1-of-n rule).",
    )
    metric: str | None = Field(None, description="metric / warmup_gate: the key read.")
    arm: str | None = Field(None, description="group_success: the arm whose step-1 rollouts are measured.")
    prompt: Literal["no_tool", "forced", "optional"] | None = Field(
        None, description="metric: the prompt mode (default the config's own)."
    )
    questions: int = Field(48, ge=4, description="Training questions measured (never held-out ones).")
    samples: int = Field(
        4, ge=1, description="Samples per question (and per prompt mode) at the training temperature."
    )
    op: Literal[">=", ">", "<=", "<"] = ">="
    threshold: float
    threshold_source: str = Field(
        "",
        description="Where the threshold comes from: the paper's line where it defines the regime; empty for a "
        "number of ours (the report labels it 'ours'). The regime passes on the measurement's one-sided 95% "
        "bound (value - 1.645 se for >=), not on the point value.",
    )

    @model_validator(mode="after")
    def _fields(self) -> PreconditionSpec:
        need = {"tool_gap": "tier", "group_success": "arm", "metric": "metric", "warmup_gate": "metric"}[
            self.measure
        ]
        if getattr(self, need) is None:
            raise ValueError(f"precondition {self.name!r}: measure {self.measure} needs '{need}'")
        return self


class PaperEffect(_Spec):
    value: float = Field(..., description="The paper's effect in the claim's metric (arm - baseline).")
    source: str = Field(..., min_length=1, description="Where the paper reports it (table / line).")


class ClaimPower(_Spec):
    paired_sd: float | None = Field(
        None,
        ge=0.0,
        description="SD over a pilot's seeds of the compared arms' paired difference d_s (the claim's metric, mean "
        "over the held-out questions), measured in the study's own regime on the study's held-out size. It holds "
        "the question noise, so it replaces the start's per-question SD and seed_sd. The preferred planning SD.",
    )
    pilot_seeds: int | None = Field(
        None,
        ge=2,
        description="Seeds of the pilot that measured paired_sd (its SD has pilot_seeds - 1 df: the seeds needed "
        "are then a range over the SD's 95% interval). The pilot's questions are not reused by the study.",
    )
    seed_sd: float = Field(
        0.0,
        ge=0.0,
        description="Without paired_sd: SD over seeds of the paired difference that is not question noise; 0 gives "
        "the MDE of question noise alone, a lower bound.",
    )
    seed_sd_source: str = Field("", description="Where paired_sd or seed_sd was measured.")
    rho: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Correlation of the two arms' values on one question (0: conservative).",
    )


class ClaimSpec(_Spec):
    name: str = Field(..., description="The claim in words.")
    metric: str = Field(
        ...,
        description="A key of the final evaluation summary (e.g. tier2/tool_call_rate), or with source: training "
        "a key of the run's training metrics (e.g. update/actions_updated_per_question).",
    )
    source: Literal["heldout", "training"] = Field(
        "heldout",
        description="heldout: the final held-out evaluation; training: the mean over training steps.",
    )
    heldout: str | None = Field(None, description="Held-out set (default: the first).")
    arm: str
    baseline: str
    direction: Literal["higher", "lower", "not_lower", "not_higher", "lower_spread"] = Field(
        ...,
        description="higher/lower: arm vs baseline; not_lower/not_higher: non-inferiority within margin; "
        "lower_spread: a smaller spread across seeds (Levene: absolute deviations from the arm's mean).",
    )
    margin: float = Field(0.0, ge=0.0, description="Non-inferiority margin (not_lower / not_higher).")
    equivalence_margin: float | None = Field(
        None,
        gt=0.0,
        description="higher / lower: the smallest effect worth finding, stated before the runs. When the claim's "
        "interval lies wholly below it on the claimed side, the verdict is 'effect excluded' (effects this large are "
        "ruled out), not 'underpowered'. None: the verdict cannot say 'effect excluded'.",
    )
    about: list[str] = Field(
        default_factory=list,
        description="Config fields the claim is about (dotted, e.g. algorithm.method; a section covers its "
        "fields): the arm and the baseline may differ there. A difference anywhere else stops the study.",
    )
    tolerate: list[str] = Field(
        default_factory=list,
        description="Config fields outside 'about' where the two arms knowingly differ: an override, listed in "
        "the report beside the claim as a difference the comparison does not isolate.",
    )
    paper_effect: PaperEffect | None = Field(
        None,
        description="The paper's effect, cited: the power check compares the MDE with it (non-inferiority claims "
        "with their margin).",
    )
    power: ClaimPower = Field(default_factory=ClaimPower)


class StudySpec(_Spec):
    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    set: list[str] = Field(default_factory=list, description="Overrides applied to the start and every arm.")
    start: StartSpec
    heldout: list[HeldoutSpec] = Field(..., min_length=1)
    tier_samples: int = Field(
        5,
        ge=0,
        description="No-tool samples per held-out question for Tier 1/2 labels from the start (0 = none).",
    )
    arms: list[ArmSpec] = Field(..., min_length=1)
    seeds: list[int] = Field(..., min_length=1)
    steps: int = Field(..., ge=1)
    eval_every: int = Field(5, ge=0)
    claims: list[ClaimSpec] = Field(default_factory=list)
    alpha: float = Field(
        0.05, gt=0.0, lt=1.0, description="The study's family-wise error rate over its claims."
    )
    multiplicity: Literal["bonferroni", "none"] = Field(
        "bonferroni",
        description="bonferroni: every claim's interval at 1 - alpha / (claims), so all verdicts hold together "
        "(agentcredit.lab.power.claim_alpha); none: each at 1 - alpha.",
    )
    preconditions: list[PreconditionSpec] = Field(
        default_factory=list,
        description="Regimes measured on the start with training questions before any arm (preflight).",
    )

    @model_validator(mode="after")
    def _names(self) -> StudySpec:
        for kind, names in (
            ("arm", [a.name for a in self.arms]),
            ("heldout", [h.name for h in self.heldout]),
        ):
            if len(set(names)) != len(names):
                raise ValueError(f"{kind} names must be unique, got {names}")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be unique, got {self.seeds}")
        arms, sets = {a.name for a in self.arms}, {h.name for h in self.heldout}
        for stated in self.claims:
            for who in (stated.arm, stated.baseline):
                if who not in arms:
                    raise ValueError(f"claim {stated.name!r}: no arm named {who!r} (arms: {sorted(arms)})")
            if stated.source == "training" and stated.heldout is not None:
                raise ValueError(f"claim {stated.name!r}: a training-metric claim has no held-out set")
            if stated.direction in ("higher", "lower") and stated.paper_effect is not None:
                if stated.paper_effect.value == 0:
                    raise ValueError(f"claim {stated.name!r}: paper_effect.value 0 is no effect to detect")
            if stated.heldout is not None and stated.heldout not in sets:
                raise ValueError(
                    f"claim {stated.name!r}: no held-out set {stated.heldout!r} (sets: {sorted(sets)})"
                )
        for pre in self.preconditions:
            if pre.arm is not None and pre.arm not in arms:
                raise ValueError(
                    f"precondition {pre.name!r}: no arm named {pre.arm!r} (arms: {sorted(arms)})"
                )
            if pre.measure == "warmup_gate" and self.start.warmup is None:
                raise ValueError(f"precondition {pre.name!r}: warmup_gate needs start.warmup")
        return self

    @property
    def claim_alpha(self) -> float:
        """Each claim's level after the study's multiplicity control."""
        from agentcredit.lab.power import claim_alpha

        return claim_alpha(self.alpha, len(self.claims), self.multiplicity)

    @property
    def preregistered(self) -> bool:
        """A study with preconditions or cited paper effects runs the preflight (regime, power, budget) first."""
        return bool(self.preconditions) or any(c.paper_effect is not None for c in self.claims)

    def start_fingerprint(self) -> str:
        """What the shared start and the held-out sets depend on."""
        return _digest(self.model_dump(mode="json", include={"set", "start", "heldout", "tier_samples"}))

    def runs_fingerprint(self) -> str:
        """What the runs depend on (everything but the description and the claims, which only the report reads)."""
        # the preconditions only decide whether the arms may start, never what a run computes
        # nor do the claims' error rate and its control (alpha, multiplicity): only the report and the plan read them
        return _digest(
            self.model_dump(
                mode="json", exclude={"description", "claims", "preconditions", "alpha", "multiplicity"}
            )
        )

    def run_fingerprint(self, arm: str, seed: int) -> str | None:
        """What one run depends on: the start, the common settings, the budget and its own arm (None: no such arm).

        Adding an arm or a seed leaves every other run's fingerprint as it was, so a study can grow (e.g. a new
        baseline) without repeating finished runs; changing what a run computed cannot.
        """
        spec = next((a for a in self.arms if a.name == arm), None)
        if spec is None:
            return None
        common = self.model_dump(
            mode="json", include={"set", "start", "heldout", "tier_samples", "steps", "eval_every"}
        )
        return _digest({**common, "arm": spec.model_dump(mode="json"), "seed": seed})


def load_study(path: str | Path) -> StudySpec:
    path = Path(path)
    if not path.is_file():
        raise StudyError(f"study file not found: {path}")
    try:
        data, _ = load_yaml_file(path)  # the configs' loader: bad YAML and duplicate keys name file and line
    except ConfigError as exc:
        raise StudyError(str(exc)) from None
    try:
        spec = StudySpec.model_validate(data or {})
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in e['loc']) or '<top level>'}: {e['msg']}" for e in exc.errors()
        ]
        if len(problems) == 1:  # one mistake, one line
            raise StudyError(f"{path}: invalid study: {problems[0]}") from None
        raise StudyError(f"{path}: invalid study:\n  " + "\n  ".join(problems)) from None
    configs = {}
    for where, preset, overrides, name in [
        ("start", spec.start.preset, [*spec.set, *spec.start.set], None)
    ] + [
        # the arm's name, as run_config sets it: it must name the method the arm trains
        (f"arm {a.name!r}", a.preset, [*spec.set, *a.set], a.name)
        for a in spec.arms
    ]:
        try:
            configs[where] = study_config(preset, overrides, name)
        except ConfigError as exc:
            raise StudyError(f"{path}: {where}: {exc}") from None
    for stated in spec.claims:
        unexplained = claim_differences(spec, stated, configs).unexplained
        if unexplained:
            shown = "; ".join(f"{k}: {a!r} vs {b!r}" for k, (a, b) in unexplained.items())
            raise StudyError(
                f"{path}: claim {stated.name!r}: arm {stated.arm!r} and baseline {stated.baseline!r} differ outside "
                f"what the claim is about (arm vs baseline): {shown}; make the arms alike, or name the fields in "
                "the claim's 'about' (what it tests) or 'tolerate' (a known confound the report lists)"
            )
    # Every arm starts from the model SFT'd in the start's text format: an arm in another protocol (a preset's
    # own style, e.g. carl-critical's ASearcher tags) would start from a policy that never saw its format.
    start_cfg = configs.pop("start")
    start_protocol = resolved_protocol(start_cfg)
    for i, h in enumerate(spec.heldout):
        if h.task is not None and h.task.startswith("bfcl:") and start_cfg.protocol.name != "chat":
            raise StudyError(
                f"{path}: heldout.{i}.task: {h.task!r} shows each question's functions as the model's tools, which "
                f"needs protocol chat; the start uses {start_cfg.protocol.name!r}"
            )
    for where, cfg in configs.items():
        if (protocol := resolved_protocol(cfg)) != start_protocol:
            differ = {
                k: (v, start_protocol.get(k)) for k, v in protocol.items() if start_protocol.get(k) != v
            }
            raise StudyError(
                f"{path}: {where}: its protocol differs from the start's (this arm's value, the start's): {differ}; "
                "set the protocol for every arm in the study's common 'set'"
            )
    return spec


@dataclass(frozen=True)
class StudyLayout:
    """A study as its files: the study file as loaded and the directory it runs in. The preflight and the report
    are handed this record (and plain dicts read from its files), never the runner (:class:`agentcredit.lab.study.
    Study`), so neither imports the runner."""

    spec: StudySpec
    dir: Path

    @property
    def start_dir(self) -> Path:
        return self.dir / "start"

    def run_dir(self, arm: str, seed: int) -> Path:
        return self.dir / "runs" / f"{arm}-s{seed}"

    def runs(self) -> list[tuple[ArmSpec, int]]:
        """Seed-major order, so that a study stopped early has every arm at the same number of seeds."""
        return [(arm, seed) for seed in self.spec.seeds for arm in self.spec.arms]

    def heldout_sets(self) -> dict[str, list[Example]]:
        from agentcredit.tasks.example import iter_jsonl

        return {
            h.name: [
                Example.from_dict(row, where)
                for where, row in iter_jsonl(self.dir / "heldout" / f"{h.name}.jsonl")
            ]
            for h in self.spec.heldout
        }

    def arm_start(self, arm: ArmSpec) -> Path:
        """The model an arm starts from: the warmed-up one for arms whose critic is the kind the warm-up trained,
        else the SFT model.

        A warm-up without joint steps trains only the value head, so both hold the same policy weights (the
        shared start); an arm without a critic, or with a critic of another kind (PPO's token head beside
        carl-segment's warmed boundary head), starts from the SFT model with its own fresh head and need not wait
        for the warm-up. A warm-up with joint steps changed the policy, so such an arm has no start here.
        """
        warm = self.spec.start.warmup
        if warm is None:
            return self.start_dir / "sft-model"
        critic = study_config(arm.preset, [*self.spec.set, *arm.set]).algorithm.critic
        warmed = study_config(self.spec.start.preset, [*self.spec.set, *self.spec.start.set]).algorithm.critic
        if critic == "none":
            return self.start_dir / ("sft-model" if warm.steps == 0 else "model")
        if critic == warmed:
            return self.start_dir / "model"
        if warm.steps == 0:
            return self.start_dir / "sft-model"
        raise StudyError(
            f"arms[{arm.name}]: its {critic!r} critic cannot start from the warmed '{warmed}' start: the warm-up's "
            f"{warm.steps} joint steps changed the policy (set start.warmup.steps: 0, or give the arm the warmed "
            "critic's kind)"
        )

    def critic_only_steps(self, arm: ArmSpec) -> int:
        """The arm's critic-only steps (``train.critic_warmup``, the PPO / TIPS presets'), run *before* its
        ``steps`` policy updates, so every arm gets the same number of policy updates (issue 48)."""
        return study_config(arm.preset, [*self.spec.set, *arm.set]).train.critic_warmup
