"""Typed, validated training configuration.

A run is configured by one YAML file (a preset under ``configs/``) plus ``--set key=value`` overrides. Every field
has a one-line description that gives its paper default. Unknown keys and bad values are errors that name the key
and the allowed values (pydantic does the checking; :func:`load_config` turns its errors into one readable message).

``algorithm`` is the method's name (``algorithm.method: carl-segment``; ``+<modifier>`` composes a shaping or
reweighting method with it, ``-<label>`` names a variant), its settings (``algorithm.carl_segment``: the name in
snake_case) and the loss's method-independent knobs (KL, entropy, clipping). What the method reads follows from its
:class:`~agentcredit.credit.Needs` (critic, rollout strategy, loss aggregation), never from a list of names: a config
that contradicts them is refused with the reason.

Preset files may start with ``base: [other.yaml, ...]``: the bases are merged first (paths relative to the file,
else a packaged preset by name: ``base: grpo`` or ``base: grpo-arith-tools`` in a user's YAML), so a preset is
``methods/<method>.yaml`` + ``tasks/<task>.yaml`` + a few overrides. A key given twice in one mapping is an error
naming the file and line (YAML itself would keep the last one silently).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from agentcredit.credit.methods import BUILT_IN, DEFAULT_METHOD, DEMO_METHOD, METHODS, Method, resolve_method
from agentcredit.models.device import DEVICE_PATTERN
from agentcredit.plugins import import_user_modules, load_entry_points

CONFIG_DIR = Path(__file__).resolve().parent / "configs"  # also reachable as ./configs in the repo


class ConfigError(ValueError):
    """A configuration problem, with the offending key in the message."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# --------------------------------------------------------------------------------------------- model
class LoraConfig(Section):
    enabled: bool = Field(
        False, description="Train LoRA adapters through peft instead of all weights (portool: r=16, alpha=8)."
    )
    r: int = Field(16, ge=1, description="LoRA rank (portool paper: 16).")
    alpha: int = Field(8, ge=1, description="LoRA alpha (portool paper: 8).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="LoRA dropout.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="Modules that get adapters (portool.md §4.2: all linear layers)."
    )


class ModelConfig(Section):
    name: str = Field(
        "embedded", description="'embedded' (SmolLM2-135M-Instruct, shipped) or a local HF model path."
    )
    device: str = Field(
        "auto",
        pattern=DEVICE_PATTERN,
        description="Where the whole native path runs (training, rollouts, teachers, critic, SFT, warm-up, eval): "
        "'auto' (a CUDA GPU when torch sees one, else the CPU), 'cpu', 'cuda' or 'cuda:<i>'.",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Dtype of the trained weights (float32: the fp32 master weights AdamW needs)."
    )
    autocast_bf16: bool | Literal["auto"] = Field(
        "auto",
        description="bf16 autocast for every forward/backward; 'auto': on where bf16 matmul is native (a CUDA GPU), "
        "off on the CPU (on the 2-core dev CPU one SFT step took 44 s with it, 27 s without).",
    )
    rollout_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="Weights used for rollouts; bf16 keeps a synced copy (old log-probs are recomputed); 'auto': "
        "bf16 on a GPU with native bf16, else the trained weights' dtype.",
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward to save memory."
    )
    lora: LoraConfig = Field(default_factory=LoraConfig)


# --------------------------------------------------------------------------------------------- data / env
class UserRewardConfig(Section):
    """Your own outcome reward; one definition for the native ``task`` section and verl's ``agentcredit`` block."""

    reward: str | list[str] | None = Field(
        None,
        description="Your own outcome reward, 'package.module:function', with verl's signature (data_source, "
        "solution_str, ground_truth, extra_info) or TRL's (completions, **kwargs); it replaces metric and "
        "format_bonus (and PORTool's judge). See agentcredit.rewards.UserReward. A list is TRL's reward_funcs: "
        "the outcome is their weighted sum (reward_weights) and each is logged as rewards/<function>/mean. SFT "
        "keeps a scripted demonstration only when it scores at least 1.0, so a reward on another scale keeps none.",
    )
    reward_weights: list[float] | None = Field(
        None,
        description="Weights of reward's functions, one per function (TRL's reward_weights; default 1.0 each).",
    )

    @model_validator(mode="after")
    def _weights_match_functions(self) -> UserRewardConfig:
        if self.reward_weights is None:
            return self
        n = 0 if self.reward is None else 1 if isinstance(self.reward, str) else len(self.reward)
        if len(self.reward_weights) != n:
            raise ValueError(
                f"reward_weights has {len(self.reward_weights)} weights for {n} reward function(s) in reward"
            )
        if not all(math.isfinite(w) for w in self.reward_weights):
            raise ValueError(f"reward_weights must be finite numbers, got {self.reward_weights}")
        return self


class TaskConfig(UserRewardConfig):
    name: str = Field(
        "arith-tools",
        description="Task name (arith-tools, kb-multihop, gsm8k, hotpotqa, ...) or jsonl:<path>; '{split}' in "
        "the path becomes task.split / task.eval_split (jsonl:data/{split}.jsonl), else one file is every split.",
    )
    split: str = Field("train", description="Split to train on.")
    seed: int = Field(
        0,
        description="Seed of the synthetic task generators and kb world (kept fixed across training seeds).",
    )
    limit: int | None = Field(None, ge=1, description="Use at most this many training questions.")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Task generator / loader options, e.g. arith-tools {easy_fraction: 0.4, medium_fraction: 0.3}.",
    )
    eval_split: str = Field("test", description="Split used for evaluation during and after training.")
    eval_limit: int | None = Field(64, ge=1, description="Questions per evaluation (CPU-sized).")
    metric: Literal["em", "f1", "set_f1", "set_f1_format", "substring", "numeric", "auto"] = Field(
        "auto",
        description="Outcome reward: 'auto' = numeric for math tasks, EM otherwise (carl-segment §2.7); set_f1 = "
        "ASearcher's set-F1; set_f1_format = carl-critical's training reward, set-F1 x 1[every action passes the "
        "format check] (carl-critical-actions.txt l. 513).",
    )
    format_bonus: float = Field(
        0.0, description="Added to the outcome when an answer was extracted (TIPS code: 0.2 in training)."
    )


class ProtocolConfig(Section):
    name: Literal["codefence", "tags", "jsoncall", "chat"] = Field(
        "codefence",
        description="Text format the agent speaks (chat: the model's own tool calling, from its chat template).",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Protocol options (see agentcredit.protocols)."
    )


class UserToolsConfig(Section):
    """Your own tools, for the protocols that show tool schemas (jsoncall, chat). One definition for the native
    ``tools`` section and verl's ``agentcredit.tools`` block."""

    functions: list[str] = Field(
        default_factory=list,
        description="jsoncall and chat: your own tools, as 'package.module:function' (typed, with a docstring; the "
        "schema comes from them, agentcredit.tools.functions). jsoncall adds them to the suite tools shown "
        "(suite_tools: [] shows only yours and response_gen); chat shows them in the model's own format.",
    )
    mcp: list[dict[str, Any]] = Field(
        default_factory=list,
        description="jsoncall and chat: local MCP servers whose tools are added like tools.functions, each "
        "{command, args, env, cwd, prefix} (agentcredit.tools.mcp; needs the 'mcp' extra). Started once per "
        "environment, stopped when it closes.",
    )
    environment: str | None = Field(
        None,
        description="chat and jsoncall: a per-episode environment, 'package.module:Class' with reset(example), "
        "step(calls) -> (observations, done, reward) and close() (agentcredit.tools.episodes.ToolEnv); one is "
        "created per episode and gets every call of it. Its step rewards add to the episode's reward and reach "
        "the step-reward methods (PPO, carl-segment, PORTool). Not combined with functions, mcp or suite_tools.",
    )
    environment_options: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of tools.environment's class."
    )


class ToolsConfig(UserToolsConfig):
    search_k: int = Field(
        3, ge=1, description="Passages per search call (carl-segment §4.1, TIPS Table 8: 3)."
    )
    corpus: str | None = Field(None, description="Search corpus JSONL; default: the task's own corpus.")
    dense: bool = Field(False, description="Dense retrieval (all-MiniLM-L6-v2) instead of BM25.")
    sandbox_timeout: float = Field(
        5.0, gt=0, description="Python sandbox wall-clock timeout in seconds (carl-segment.md A26: 5-10)."
    )
    sandbox_isolation: Literal["bwrap", "rlimits"] = Field(
        "bwrap",
        description="bwrap, or the rlimits fallback for trusted code only, by name (docs/sandbox.md).",
    )
    max_workers: int = Field(4, ge=1, description="Concurrent tool calls.")
    suite_tools: list[str] | None = Field(
        None,
        description="jsoncall: the tool-suite subset shown to the model (None = all 17 of PORTool §2.5; "
        "response_gen is always kept). The full list is a ~4.7k-token system prompt, too long for CPU presets. "
        "chat: suite tools shown beside tools.functions (None = none; response_gen is never shown).",
    )


class TreeStrategyConfig(Section):
    """How episodes are sampled per prompt: independently or as a tree. One definition for the native ``rollout``
    section and verl's ``agentcredit.tree`` block (both build it with ``strategies.from_rollout_config``)."""

    strategy: Literal["independent", "entropy_guided", "step_forks"] = Field(
        "independent", description="How episodes are sampled per prompt."
    )
    n: int = Field(
        4,
        ge=1,
        description="Episodes per prompt (independent), forks N (entropy_guided), trajectories n (step_forks).",
    )
    n0: int = Field(
        1, ge=1, description="entropy_guided: initial full episodes N0 (carl-critical: 8, lite: 1)."
    )
    branch: int = Field(2, ge=1, description="step_forks: duplication factor f (portool.md §4.2: 2).")
    t_max: int = Field(
        6, ge=1, description="step_forks / entropy_guided: max tool-call steps per episode (portool: 6)."
    )
    random_forks: bool = Field(
        False, description="entropy_guided: pick fork states uniformly (carl-critical ablation #2)."
    )
    # the paper's Algorithm 1 forks one state at a time, each fork seeing the entropies of the ones before it
    # (carl-critical-actions.md §3.6 note (iv), A10): N0 episodes then N forks are 1 + N sequential rounds (17 for
    # the paper's N = 16). k > 1 is the spec's [R] speed deviation: k picks per round with virtual counts.
    forks_per_round: int = Field(
        1,
        ge=1,
        description="entropy_guided: forks sampled together per round (paper: 1, sequential, 1 + N rounds; "
        "k > 1: ceil(N / k) fork rounds, a speed deviation, carl-critical-actions.md §3.6 (iv)). Logged as "
        "critical/rounds.",
    )

    def leaves(self) -> int:
        """Episodes (leaves) per prompt: n, or n0 + n for entropy-guided forking."""
        return self.n0 + self.n if self.strategy == "entropy_guided" else self.n


class RolloutConfig(TreeStrategyConfig):
    prompts_per_step: int = Field(
        8, ge=1, description="Prompts per training step (papers: 128-512; CPU-scaled)."
    )
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature (all papers: 1.0 in training).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling (papers: 1.0).")
    top_k: int = Field(0, ge=0, description="Top-k sampling, 0 = off (papers: -1 / off).")
    max_new_tokens: int = Field(192, ge=1, description="Tokens per segment (carl-segment: 2048; CPU-scaled).")
    max_episode_tokens: int = Field(512, ge=1, description="Generated tokens per episode.")
    max_turns: int = Field(
        8, ge=1, description="Policy segments per episode (carl-segment: 15; TIPS: 5 turns)."
    )
    max_batch: int = Field(64, ge=1, description="Episodes decoded together by the engine.")
    backend: Literal["hf", "vllm"] = Field(
        "hf",
        description="Who generates training rollouts: 'hf' (the native engine's batched decoding, no extra "
        "dependency) or 'vllm' (vLLM generates each segment; the engine keeps protocols, tools and trees; the "
        "trainer pushes its weights in after every update; needs the vllm extra, no LoRA). Evaluation stays 'hf'.",
    )
    vllm_gpu_memory_fraction: float = Field(
        0.3,
        gt=0.0,
        lt=1.0,
        description="backend=vllm on a GPU: the share of the GPU's memory vLLM takes (weights + KV cache) beside "
        "the trainer in the same process (TRL's colocate default, vllm_gpu_memory_utilization=0.3); unused on the "
        "CPU, where VLLM_CPU_KVCACHE_SPACE sizes the cache.",
    )


# --------------------------------------------------------------------------------------------- algorithm
def _moved_to_sections() -> dict[str, str]:
    built_in = [METHODS[name] for name in BUILT_IN]
    chose = ", ".join(f"{old} -> {m.name}" for m in built_in for old in m.former_names)
    critics = ", ".join(f"{m.name}: {m.needs.critic}" for m in built_in if m.needs.critic != "none")
    shapings = ", ".join(m.name for m in built_in if m.modifier == "shaping")
    reweights = ", ".join(m.name for m in built_in if m.modifier == "reweight")
    moved = {
        "method": "algorithm.method (the method's name; a variant's label is algorithm.method: <method>-<label>)",
        "algorithm.estimator": f"algorithm.method, which names the method ({chose}); its critic, shaping, "
        "reweighting and loss aggregation follow from it",
        "algorithm.critic": f"algorithm.method: the critic follows from the method ({critics})",
        "algorithm.shaping": "algorithm.method: a shaping method is <method>+<shaping>, or the shaping alone "
        f"({shapings})",
        "algorithm.reweight": "algorithm.method: a reweighting method is <method>+<reweight>, or the reweighting "
        f"alone ({reweights})",
    }
    now: dict[str, list[str]] = {}
    for m in built_in:
        for old, new in m.former_keys:
            whole = new == f"algorithm.{m.section}"
            now.setdefault(old, []).append(
                f"{new} (the method's settings are its name's section)" if whole else new
            )
    return moved | {old: " or ".join(places) for old, places in now.items()}


#: Keys a config written before methods had sections of their own may hold (a run directory's config.yaml, an old
#: preset): where each now lives (a method's old keys are its ``former_keys``). Each is one error line naming the
#: key and this (``old_key_hint``); the study harness maps the ones a first-round study file names
#: (``RENAMED_KEYS``).
MOVED_TO_SECTIONS = _moved_to_sections()
#: The old keys that name one key now (studies' about / tolerate lists written before then name them): the
#: method's old parts now name the method, and an old section of a method's settings is that method's section.
RENAMED_KEYS = {
    "method": "algorithm.method",
    "algorithm.estimator": "algorithm.method",
    "algorithm.critic": "algorithm.method",
    "algorithm.shaping": "algorithm.method",
    "algorithm.reweight": "algorithm.method",
} | {
    old: new
    for m in (METHODS[name] for name in BUILT_IN)
    for old, new in m.former_keys
    if new == f"algorithm.{m.section}"
}
#: The method an old ``algorithm.estimator`` value named, where the name differs.
OLD_ESTIMATORS = {old: name for name in BUILT_IN for old in METHODS[name].former_names}


def old_key_hint(key: str) -> str:
    """`` (<key> moved to ..., issue 37)`` for a key of a config written before methods had sections of their own,
    else ''."""
    moved = MOVED_TO_SECTIONS.get(key)
    return f" ({key} moved to {moved}, issue 37)" if moved else ""


def registered_sections(block: BaseModel, where: str) -> None:
    """A config block's keys beyond its fields must be the sections of methods registered with
    :func:`agentcredit.credit.register_method` (from user code): each becomes an instance of that method's settings
    class; any other key is an error naming it and the keys allowed."""
    extra = block.__pydantic_extra__ or {}
    sections = {m.section: m for m in METHODS.values()}
    for key, value in list(extra.items()):
        if key not in sections:
            allowed = sorted({*type(block).model_fields, *sections})
            hint = old_key_hint(f"{where}.{key}")
            raise ValueError(f"unknown key '{where}.{key}'{hint}; allowed keys here: {', '.join(allowed)}")
        settings = sections[key].settings
        if not isinstance(value, settings):
            try:
                value = settings.model_validate(value)
            except ValidationError as exc:
                e = exc.errors()[0]
                field = ".".join([where, key, *(str(p) for p in e["loc"])])
                raise ValueError(f"{field}: {e['msg']} (got {e.get('input')!r})") from None
        extra[key] = value


def method_sections(trainer: str) -> dict[str, Any]:
    """The settings sections of ``trainer``'s config block (``native`` or ``verl``), one per built-in method
    (``BUILT_IN``, found in ``agentcredit/credit/methods/``), as pydantic field definitions: ``<section>: <the class
    that trainer reads>`` (:meth:`~agentcredit.credit.Method.settings_class`: the method's settings, or its
    extension with that trainer's own fields, both defined in the method's home) with the class's defaults. A
    built-in method's section is never written here by hand."""
    fields: dict[str, Any] = {}
    for name in BUILT_IN:
        method = METHODS[name]
        cls = method.settings_class(trainer)
        fields[method.section] = (
            cls,
            Field(default_factory=cls, description=f"The settings of {method.name} ({method.source})."),
        )
    return fields


class _AlgorithmParts(Section):
    # a method registered from user code keeps its settings under algorithm.<its section> (registered_sections)
    model_config = ConfigDict(extra="allow", validate_assignment=True)

    method: str = Field(
        DEFAULT_METHOD,
        description="The credit method: its name ("
        + ", ".join(BUILT_IN)
        + ", or one registered with agentcredit.credit.register_method), +<modifier> to compose a shaping or "
        "reweighting method with it (carl-segment+tips, portool+gear), and -<label> to name a variant in logs and "
        "reports (portool-shifted-outcome). Its settings are algorithm.<its name in snake_case>; its critic, "
        "rollout strategy and loss aggregation follow from it (agentcredit.credit.METHODS[name].needs).",
    )
    critic_model: Literal["shared", "separate"] = Field(
        "shared",
        description="Where the method's value head sits (a method with a critic): 'shared' on the policy's backbone "
        "(carl-segment §3.4: a head on the policy), so the value loss also trains the backbone; 'separate' on its own "
        "copy of the initial model, trained at optim.head_lr (verl's critic; TIPS §4 'Baselines' [tips.txt l.142]: "
        "policy and value learning rates 1e-6 and 1e-5), so the policy's update does not depend on the value loss.",
    )
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "segment-mean"] | None = Field(
        None,
        description="Loss aggregation; None = the method's own (carl-segment Eq. 3: segment-mean; portool Eq. 1 and "
        "gear: seq-mean-token-mean; others token-mean). Set it for an ablation (GRPO in GEAR's recipe).",
    )
    clip_eps: float = Field(0.2, gt=0.0, description="PPO clip epsilon (all papers: 0.2).")
    clip_ratio_c: float | None = Field(
        None,
        gt=1.0,
        description="Dual-clip PPO constant c: for A < 0 the token loss is capped at -c*A; None = off "
        "(TIPS's PPO/GRPO runs, verl's clip_ratio_c: 3.0).",
    )
    kl_coef: float = Field(
        0.0, ge=0.0, description="KL-to-reference loss weight (carl-segment/TIPS: 0.001; portool: 0)."
    )
    kl_estimator: Literal["k1", "k3"] = Field("k3", description="KL estimator (k3 = low_var_kl).")
    log_kl_ref: bool = Field(
        False,
        description="Score the reference policy and log policy/kl_ref even when kl_coef = 0 (one more forward "
        "per step; a frozen copy of the weights unless LoRA, whose reference is the adapter-free model). The "
        "loss is unchanged. carl-critical's presets set it: the paper has no KL term, so drift is only visible here.",
    )
    entropy_coef: float = Field(0.0, ge=0.0, description="Entropy bonus (carl-segment: 0.001; others 0).")
    value_coef: float = Field(0.5, ge=0.0, description="Value-loss weight c_v (carl-segment: 0.5).")
    value_clip: float | None = Field(
        None, gt=0.0, description="Value clipping range (TIPS/verl: 0.5; carl-segment: none)."
    )
    whiten_advantages: bool = Field(
        False, description="Whiten token advantages over the batch (verl GAE path: on)."
    )

    @property
    def credit_method(self) -> Method:
        """The method ``method`` names (:func:`agentcredit.credit.resolve_method`): what both trainers call."""
        return resolve_method(self.method)[0]

    @property
    def label(self) -> str:
        """The variant label of ``method`` ('' for none)."""
        return resolve_method(self.method)[1]

    @property
    def critic(self) -> str:
        """The value head the method reads: none, token or boundary (its Needs)."""
        return self.credit_method.all_needs.critic

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                if hint := old_key_hint(f"algorithm.{key}"):
                    raise ValueError(f"unknown key 'algorithm.{key}'{hint}")
        return data

    @model_validator(mode="after")
    def _method_and_needs(self) -> _AlgorithmParts:
        registered_sections(self, "algorithm")
        try:  # an unknown name, or a modifier the method does not allow (its needs say why)
            method, label = resolve_method(self.method)
        except ValueError as exc:
            raise ValueError(f"algorithm.method: {exc}") from None
        # the canonical spelling (grpo+gear is gear), so logs, run directories and reports show one name
        self.__dict__["method"] = method.name + (f"-{label}" if label else "")
        if self.loss_agg is None:
            self.__dict__["loss_agg"] = method.all_needs.loss_agg
        if self.critic_model == "separate" and self.critic == "none":
            raise ValueError(
                f"algorithm.critic_model='separate' needs a method with a critic, not {method.name}"
            )
        return self


# each built-in method's settings, under the section its Method names (method_sections); verl's agentcredit block
# has the same sections, of the same classes
AlgorithmConfig = create_model(
    "AlgorithmConfig",
    __base__=_AlgorithmParts,
    __module__=__name__,
    __doc__="The credit method's name, every built-in method's settings section, and the method-independent "
    "knobs of the loss.",
    **method_sections("native"),
)


# --------------------------------------------------------------------------------------------- optimisation
class OptimConfig(Section):
    lr: float = Field(
        1e-6, gt=0.0, description="Policy/backbone learning rate (all papers: 1e-6; CPU presets raise it)."
    )
    head_lr: float = Field(
        5e-6,
        gt=0.0,
        description="Critic learning rate: the value head's, and the whole critic model's with "
        "algorithm.critic_model='separate' (carl-segment: 5e-6 for the head; TIPS/PPO: 1e-5 for the critic).",
    )
    weight_decay: float = Field(
        0.01, ge=0.0, description="AdamW weight decay of the backbone (papers: 0.01)."
    )
    head_weight_decay: float = Field(
        0.0, ge=0.0, description="Value-head weight decay (carl-segment: 0, calibration)."
    )
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    warmup_steps: int = Field(
        0, ge=0, description="Linear LR warm-up in optimiser steps (carl-segment: 100)."
    )
    grad_clip: float = Field(
        1.0,
        gt=0.0,
        description="Gradient-norm clip (papers: 1.0; TIPS Table 10 actor.grad_clip 1.0, verl's critic 1.0), "
        "applied to the policy's and the critic's parameters separately, as verl's separate actor and critic "
        "optimisers do: a large value loss cannot shrink the policy's step.",
    )
    epochs: int = Field(
        1, ge=1, description="Update epochs per rollout batch (carl-segment: 4; verl default 1)."
    )
    minibatch_size: int = Field(
        0, ge=0, description="Trajectories per optimiser step; 0 = the whole batch (one step per epoch)."
    )


# Tokens (rows x padded width) per forward/backward pass: activations scale with the micro-batch, and a small one
# stays in cache, so on a CPU 1024-token micro-batches train faster at about half the peak memory of 4096-token ones
# (benchmarks/bench_memory.py; the measurement: docs/results/bench-memory.txt). Optimiser steps are unchanged:
# micro-batches accumulate gradients.
MICRO_BATCH_TOKENS = 1024


class TrainConfig(Section):
    steps: int = Field(20, ge=1, description="Training steps (rollout + update).")
    seed: int = Field(0, description="Seed for data order, sampling and initialisation.")
    eval_every: int = Field(
        0,
        ge=0,
        description="Greedy held-out evaluation (task.eval_split) every N steps, logged to metrics.jsonl as "
        "eval/* (0 = only the final evaluation).",
    )
    micro_batch_tokens: int = Field(
        MICRO_BATCH_TOKENS,
        ge=1,
        description="Positions fed to the decoder per forward pass of the trainer's scoring and update, SFT and "
        "the critic warm-up: rows x padded width, or, where scoring packs rows (agentcredit.models.packing), their "
        "distinct tokens (a prefix rows share counts once); a longer row goes alone. Gradients accumulate over "
        "micro-batches, so only memory and speed depend on it.",
    )
    save_every: int = Field(10, ge=0, description="Checkpoint every N steps (0 = only at the end).")
    critic_warmup: int = Field(
        0,
        ge=0,
        description="The first N steps (counted in train.steps; a study adds them to an arm's steps) update only the "
        "critic, as verl's trainer.critic_warmup: the critic is fitted to the current policy's returns before its "
        "advantages move the policy. A shared backbone stays frozen too, so the policy is unchanged in those steps.",
    )
    critic_warmup_epochs: int | None = Field(
        None,
        ge=1,
        description="Passes over the batch in each critic-only step (train.critic_warmup); None = optim.epochs. "
        "Not a paper's value (verl's critic.ppo_epochs is the actor's, 1 in TIPS Table 10): a CPU run has a few "
        "critic-only steps where the paper's critic gets hundreds of updates (scripts/critic_ev.py).",
    )
    allow_failed_gate: bool = Field(
        False,
        description="Start RL from a model whose critic warm-up gate failed (<model>/warmup_summary.json). "
        "Off by default: carl-segment's warm-up 'continues until the verification gate passes' (App. C, "
        "carl-segment-level-credit.txt l.425), so a failed gate stops the run; when on, the run's summary and "
        "reports say that the gate failed.",
    )
    cold_start: bool = Field(
        False,
        description="Start RL although the model has no critic warm-up (no <model>/warmup_summary.json) for a "
        "method whose critic is warmed up and gated first (carl-segment's boundary critic): the paper's cold-start "
        "ablation, ~9 EM behind (carl-segment-level-credit.txt l. 94). Off by default: such a run stops with one "
        "line; when on, its first lines, metrics (critic/cold_start) and reports say it started cold.",
    )
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints kept on disk.")
    max_nonfinite: int = Field(3, ge=1, description="Stop after this many non-finite losses in a row.")
    run_dir: str | None = Field(None, description="Run directory (default runs/<preset>-<time>).")
    tensorboard: bool = Field(True, description="Write TensorBoard events.")
    wandb: bool = Field(False, description="Log to Weights & Biases (needs wandb installed).")
    wandb_project: str = Field("agentcredit", description="W&B project.")
    dump_episodes_every: int = Field(
        0,
        ge=0,
        description="Write the step's trajectories with per-token advantages to <run>/episodes/step-N.jsonl "
        "every N steps, for `agentcredit view` (0 = never).",
    )


class Config(Section):
    imports: list[str] = Field(
        default_factory=list,
        description="Your own modules, imported before the rest of the config is read, so the methods, signals, "
        "providers and tools they register can be named here: importable module names (my_pkg.my_method) or paths "
        "of .py files (relative to the working directory). Entry points of the group agentcredit.plugins are "
        "imported too (agentcredit.plugins).",
    )
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    protocol: ProtocolConfig = Field(default_factory=ProtocolConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "method" in data:
            raise ValueError(f"unknown key 'method'{old_key_hint('method')}")
        return data

    @model_validator(mode="before")
    @classmethod
    def _user_modules(cls, data: Any) -> Any:
        # before the sections are read: algorithm.method may name a method a user module registers
        load_entry_points()
        if isinstance(data, dict) and data.get("imports") is not None:
            import_user_modules(data["imports"], where="imports")
        return data

    @property
    def method(self) -> str:
        """The run's method name for logs, run directories and reports: ``algorithm.method``, label included."""
        return self.algorithm.method

    @model_validator(mode="after")
    def _rollout_and_critic_follow_the_method(self) -> Config:
        a, r = self.algorithm, self.rollout
        needs = a.credit_method.all_needs
        if needs.rollout is not None and r.strategy != needs.rollout:
            shape = "works on linear episodes" if needs.rollout == "independent" else "needs a rollout tree"
            raise ValueError(
                f"algorithm.method={a.method!r} {shape}: it needs rollout.strategy={needs.rollout!r} "
                f"(got {r.strategy!r})"
            )
        if self.train.critic_warmup and a.critic == "none":
            raise ValueError(
                f"train.critic_warmup={self.train.critic_warmup} needs a method with a critic, not {a.method}"
            )
        return self


# --------------------------------------------------------------------------------------------- loading
def _deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader that rejects a key given twice in one mapping (PyYAML keeps the last one silently,
    so a second ``algorithm:`` block would quietly replace the first). ``source`` names the file in the error."""

    source = "<config>"

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if (
                key_node.tag == "tag:yaml.org,2002:merge"
            ):  # ``<<: *anchor`` merges; its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, list | dict):
                continue  # unhashable: SafeLoader itself reports it
            if key in seen:
                raise ConfigError(
                    f"{self.source} line {line}: key {key!r} appears twice in one mapping (first on line "
                    f"{seen[key]}); YAML would keep only the last, so remove one"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_yaml_file(path: str | Path) -> tuple[Any, dict[str, int]]:
    """A YAML config file's data and the line of each top-level key; duplicate keys and bad YAML are ConfigErrors
    naming the file and line. The one place YAML configs (presets, user configs, study files) are read."""
    path = Path(path)
    loader = _StrictLoader(path.read_text())
    loader.source = str(path)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()
    lines = (
        {str(k.value): k.start_mark.line + 1 for k, _ in node.value}
        if isinstance(node, yaml.MappingNode)
        else {}
    )
    return data, lines


def read_yaml_with_bases(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a preset, merging the files listed under its ``base:`` key first.

    A base is a path relative to the file, else a packaged preset by name (``grpo``, ``grpo-arith-tools``,
    ``tasks/arith-tools``; see :func:`_packaged_base`), so a user's YAML can start from ``base: grpo``.
    """
    path = Path(path).resolve()
    if path in _seen:
        raise ConfigError(f"{path}: 'base' files include each other in a loop")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    data, lines = load_yaml_file(path)
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    bases = data.pop("base", []) or []
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ConfigError(
            f"{path} line {lines.get('base')}: 'base' must be a file or preset name, or a list of them"
        )
    merged: dict[str, Any] = {}
    for base in bases:
        local = path.parent / base
        if local.is_file():
            merged = _deep_merge(merged, read_yaml_with_bases(local, (*_seen, path)))
            continue
        packaged = _packaged_base(base, (*_seen, path))
        if packaged is None:
            raise ConfigError(
                f"{path} line {lines.get('base')}: base {base!r} is neither a file next to it ({local}) nor a "
                f"packaged preset (a method of {_stems('methods')}, a task of {_stems('tasks')}, "
                "a <method>-<task> pair, or a file under agentcredit/configs)"
            )
        merged = _deep_merge(merged, packaged)
    return _deep_merge(merged, data)


def _packaged_base(name: str, seen: tuple[Path, ...]) -> dict[str, Any] | None:
    """A ``base:`` entry that names a packaged preset, or None. A bare method name (``grpo``) is
    ``configs/methods/grpo.yaml``, a bare task name ``configs/tasks/<task>.yaml``, a pair ``<method>-<task>`` the
    composed preset; a path under ``agentcredit/configs`` (``methods/grpo.yaml``) is taken as is."""
    stem = name.removesuffix(".yaml")
    for candidate in (
        CONFIG_DIR / f"{stem}.yaml",
        CONFIG_DIR / "methods" / f"{stem}.yaml",
        CONFIG_DIR / "tasks" / f"{stem}.yaml",
    ):
        if candidate.is_file():
            return read_yaml_with_bases(candidate, seen)
    if composed := _composed_preset(stem):
        method, task = composed
        return _deep_merge(
            read_yaml_with_bases(CONFIG_DIR / "methods" / f"{method}.yaml", seen),
            read_yaml_with_bases(CONFIG_DIR / "tasks" / f"{task}.yaml", seen),
        )
    return None


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one ``section.key=value`` override; the value is parsed as YAML (numbers, bools, lists)."""
    if "=" not in assignment:
        raise ConfigError(f"override {assignment!r} must look like section.key=value")
    dotted, raw = assignment.split("=", 1)
    keys = [k for k in dotted.strip().split(".") if k]
    if not keys:
        raise ConfigError(f"override {assignment!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {assignment!r}: {key!r} is not a section")
    node[keys[-1]] = value


class TaskOptionsDropped(UserWarning):
    """``--set task.name=...`` changed the task, so the old task's ``task.options`` were dropped."""


def apply_overrides(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> None:
    """Apply ``key=value`` overrides in order. ``task.options`` belong to the task they were written for: when an
    override changes ``task.name``, the file's options are dropped (one warning says which), and only options that
    an override sets are kept (e.g. ``--set task.name=jsonl:mine.jsonl`` on an arith-tools run must not pass
    ``easy_fraction`` to the JSONL loader)."""
    task = data.get("task") if isinstance(data.get("task"), dict) else {}
    old_name, old_options = task.get("name"), dict(task.get("options") or {})
    for assignment in overrides:
        apply_override(data, assignment)
    task = data.get("task") if isinstance(data.get("task"), dict) else {}
    if not old_options or task.get("name") == old_name:
        return
    kept = [a for a in overrides if a.split("=", 1)[0].strip().startswith("task.options")]
    task["options"] = {}
    for assignment in kept:
        apply_override(data, assignment)
    import warnings

    warnings.warn(
        f"task.name changed from {old_name!r} to {task.get('name')!r}: dropped the old task's task.options "
        f"{sorted(old_options)} (give the new task's with --set task.options.KEY=VALUE)",
        TaskOptionsDropped,
        stacklevel=2,
    )


def _describe(error: dict[str, Any], model: type[BaseModel]) -> str:
    loc = [str(p) for p in error["loc"]]
    if not loc:  # a check across sections: its message names the fields (the input would be the whole config)
        return str(error["msg"]).removeprefix("Value error, ")
    key = ".".join(loc)
    if error["type"] == "extra_forbidden":
        allowed = _allowed_keys(model, loc[:-1])
        return f"unknown key {key!r}" + (f"; allowed keys here: {', '.join(allowed)}" if allowed else "")
    if error["type"] == "value_error" and isinstance(error.get("input"), dict):
        # a check across a section's fields: its message names them (the input would be the whole section)
        return str(error["msg"]).removeprefix("Value error, ")
    return f"{key}: {error['msg']} (got {error.get('input')!r})"


def _allowed_keys(model: type[BaseModel], loc: list[str]) -> list[str]:
    for part in loc:
        field = model.model_fields.get(part)
        annotation = getattr(field, "annotation", None) if field else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return sorted(model.model_fields)


def validate_config(data: dict[str, Any], *, source: str = "config") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        problems = [_describe(e, Config) for e in exc.errors()]
        if len(problems) == 1:  # one mistake, one line
            raise ConfigError(f"{source}: invalid configuration: {problems[0]}") from None
        listed = "\n  ".join(problems)
        raise ConfigError(f"{source}: invalid configuration:\n  {listed}") from None


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load a preset (or the defaults when ``path`` is None), apply ``key=value`` overrides and validate."""
    data = read_preset(path) if path is not None else {}
    apply_overrides(data, overrides)
    return validate_config(data, source=str(path or "defaults"))


def read_preset(path: str | Path) -> dict[str, Any]:
    """A config file as given, a preset file under configs/, or a composed preset ``<method>-<task>``.

    A composed preset is ``configs/methods/<method>.yaml`` then ``configs/tasks/<task>.yaml`` (the task's caps and
    protocol win); a file ``configs/<method>-<task>.yaml`` exists only where a pair needs its own values.
    """
    p = Path(path)
    if p.is_file():
        return read_yaml_with_bases(p)
    for candidate in (CONFIG_DIR / p, CONFIG_DIR / f"{p}.yaml"):
        if candidate.is_file():
            return read_yaml_with_bases(candidate)
    if composed := _composed_preset(str(path)):
        method, task = composed
        method_data = read_yaml_with_bases(CONFIG_DIR / "methods" / f"{method}.yaml")
        task_data = read_yaml_with_bases(CONFIG_DIR / "tasks" / f"{task}.yaml")
        task_protocol = (task_data.get("protocol") or {}).get("name")
        if task_protocol and task_protocol != (method_data.get("protocol") or {}).get("name"):
            # protocol options belong to their protocol: a task in another format (BFCL's chat under
            # carl-segment's codefence options) takes its own protocol block whole
            method_data = {k: v for k, v in method_data.items() if k != "protocol"}
        return _deep_merge(method_data, task_data)
    raise ConfigError(
        f"config {str(path)!r} is neither a file nor a preset in {CONFIG_DIR} (presets: <method>-<task> with "
        f"a method of {_stems('methods')} and a task of {_stems('tasks')}, or {_stems('.')})"
    )


def _stems(folder: str) -> list[str]:
    return sorted(f.stem for f in (CONFIG_DIR / folder).glob("*.yaml"))


def _composed_preset(name: str) -> tuple[str, str] | None:
    tasks = _stems("tasks")
    splits = [
        (method, name.removeprefix(f"{method}-"))
        for method in _stems("methods")
        if name.startswith(f"{method}-") and name.removeprefix(f"{method}-") in tasks
    ]
    if len(splits) > 1:  # e.g. methods "a" and "a-b" with tasks "b-c" and "c": name the file to write instead
        raise ConfigError(f"preset {name!r} is ambiguous: {splits}; write configs/{name}.yaml")
    return splits[0] if splits else None


#: The task of the demo's preset (:func:`demo_preset`).
DEMO_TASK = "arith-tools"


def demo_preset() -> str:
    """The preset ``agentcredit demo`` runs, and ``agentcredit train / sft / warmup`` when given no ``--config``:
    the registry's demo method on the demo task (``<method>-<task>``)."""
    return f"{DEMO_METHOD}-{DEMO_TASK}"


def preset_names() -> list[str]:
    """Every preset name: the files under configs/ and every ``<method>-<task>`` pair."""
    composed = {f"{m}-{t}" for m in _stems("methods") for t in _stems("tasks")}
    return sorted(set(_stems(".")) | composed)


def dump_config(config: Config) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
