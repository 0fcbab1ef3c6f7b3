"""A credit method as one object: its name, settings, needs, and the functions from the layout to advantages.

A :class:`Method` is what both trainers read. The native trainer (:mod:`agentcredit.train.advantages`) and the
verl adapter (:mod:`agentcredit.integrations.verl.advantages`) each lay their batch out as the neutral
:class:`~agentcredit.credit.estimators.EpisodeBatch`, read the method's settings from their config block by its
:attr:`Method.section` (:meth:`Method.settings_from`), fill the signals its :class:`Needs` name, and call one
entry, :meth:`Method.advantages`. Nothing in either trainer names a method.

A method has one name (``carl-segment``): the config's ``algorithm.method`` (verl's ``agentcredit.method``), its
preset ``configs/methods/<name>.yaml``, its metrics and docs; its settings section is the same name in snake_case
(``algorithm.carl_segment``). :func:`resolve_method` reads ``<method>[+<modifier>...][-<label>]``.

A method either *estimates* (``estimate``: the layout to an :class:`~agentcredit.credit.estimators.Estimate`) or
*modifies* another method's estimate: ``shape`` puts rewards on the steps before the estimate (TIPS), ``reweight``
multiplies the estimate's advantages afterwards (GEAR). A modifier names the method it is published with
(``base``: TIPS is PPO's GAE on shaped rewards) and composes with others the maths allows (:func:`compose`).

Register your own with :func:`register_method` (``docs/adding-a-method.md``); a method that reads a signal no
built-in method reads names it with :func:`register_signal` first (the native trainer computes it with a provider
registered under the same name, :func:`agentcredit.credit.signals.register_provider`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from agentcredit.credit.estimators import EpisodeBatch, Estimate
from agentcredit.credit.signals import SIGNALS, register_signal, unregister_signal

__all__ = [
    "CRITIC_BASELINE",
    "DEFAULT_METHOD",
    "DEMO_METHOD",
    "GROUP_BASELINE",
    "METHODS",
    "SIGNALS",
    "Method",
    "Needs",
    "Settings",
    "TokenWeights",
    "compose",
    "get_method",
    "register_method",
    "register_signal",
    "resolve_method",
    "unregister_method",
    "unregister_signal",
]


class Settings(BaseModel):
    """A method's settings: typed, with the paper's defaults, each field's description citing the paper's line.
    Unknown keys are errors; a trainer's config block may extend the class with trainer-only fields."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class NoSettings(Settings):
    """A method without settings of its own."""


Critic = Literal["none", "token", "boundary"]
#: The characters of a method name's words (joined by '-'; the config section joins them by '_').
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
#: The per-step inputs both layout builders fill when a method needs them (a Step's node, anchor, format_reward).
STEP_INPUTS = frozenset({"tree", "anchors", "format_reward"})


@dataclass(frozen=True)
class Needs:
    """What a method reads besides rewards and the layout's steps; the trainers and the config validate against it.

    * ``critic``: the value head its estimate reads (``token``: V before every token; ``boundary``: V at each
      policy segment's first token, carl-segment §3.4); ``none`` for critic-free methods.
    * ``critic_base``: a modifier that is only sound on an estimate with a critic (``why`` says why).
    * ``rollout``: the ``rollout.strategy`` it needs (``None``: any).
    * ``step_inputs``: per-step fields of the layout it reads: ``tree`` (the group's decision tree), ``anchors``
      (the tokens before each step), ``format_reward`` (the protocol's formatting reward R_fm per step).
    * ``signals``: per-batch signals the trainer computes for it, each a name of :data:`SIGNALS`: ``values`` (the
      critic), ``student_logp`` and ``entropy`` (per token), and those a method registers with
      :func:`register_signal` (TIPS's ``potentials`` and ``alpha``, GEAR's ``teacher_logp``).
    * ``reward``: how the environment scores an episode: ``outcome`` (the task's metric and format bonus) or
      ``judge`` (the method's own outcome judge, built from its settings' ``judge`` fields).
    * ``loss_agg``: the ``policy_loss`` aggregation the method trains with.
    """

    critic: Critic = "none"
    critic_base: bool = False
    rollout: str | None = None
    step_inputs: frozenset[str] = frozenset()
    signals: frozenset[str] = frozenset()
    reward: Literal["outcome", "judge"] = "outcome"
    loss_agg: str = "token-mean"
    why: str = ""

    def __post_init__(self) -> None:
        unknown = set(self.step_inputs) - STEP_INPUTS
        if unknown:  # both layout builders fill exactly these; another name would be silently empty
            raise ValueError(
                f"unknown step input(s) {sorted(unknown)}; the layouts provide {sorted(STEP_INPUTS)}"
            )
        unknown = set(self.signals) - set(SIGNALS)
        if unknown:  # a typo would otherwise only surface when no provider computes it
            raise ValueError(
                f"unknown signal(s) {sorted(unknown)}; registered signals: {', '.join(sorted(SIGNALS))} "
                "(name a new one with agentcredit.credit.register_signal first)"
            )

    def __or__(self, other: Needs) -> Needs:
        """A composition's needs: the estimating method's critic, rollout and loss, both parts' inputs."""
        return Needs(
            critic=self.critic,
            critic_base=False,
            rollout=self.rollout,
            step_inputs=self.step_inputs | other.step_inputs,
            signals=self.signals | other.signals,
            reward="judge" if "judge" in (self.reward, other.reward) else "outcome",
            loss_agg=self.loss_agg,
        )


@dataclass
class TokenWeights:
    """A method's losses as per-token tensors for a trainer whose losses sum tokens (:attr:`Method.token_weights`)."""

    returns: Any  # the critic's target on every token (where the trainer's metrics read returns)
    value_weights: Any  # each token's weight in the critic's loss (0 where the critic is not trained)
    loss_weights: (
        Any  # each token's weight in the actor's loss (folded into the advantages, and the entropy and KL)
    )
    stats: dict[str, float]


Estimator = Callable[[EpisodeBatch, Any], Estimate]
Shaper = Callable[[EpisodeBatch, Any], list[list[float]]]
Reweighter = Callable[[EpisodeBatch, Estimate, Any], Estimate]


@dataclass(frozen=True)
class Method:
    """One credit method.

    ``name`` is the method's one name (``algorithm.method``, verl's ``agentcredit.method``, presets, metrics,
    docs); lower case, digits and ``-``. Its settings are the config section :attr:`section`, the same name in
    snake_case (``algorithm.<section>`` natively, ``agentcredit.<section>`` under verl), of class ``settings``. An
    estimating method sets ``estimate``; a modifier sets ``shape`` or ``reweight``, ``modifier`` (its kind:
    ``shaping`` or ``reweight``) and ``base`` (the method it is published on). A modifier composes with another
    method as ``<method>+<modifier>`` (``portool+gear``).
    """

    name: str
    settings: type[Settings]
    needs: Needs
    source: str
    estimate: Estimator | None = None
    shape: Shaper | None = None
    reweight: Reweighter | None = None
    modifier: Literal["shaping", "reweight"] | None = None
    base: str | None = None
    composed_of: tuple[Method, ...] = field(default=(), repr=False)
    #: dotted config keys a run report lists for this method's runs: the settings whose reading differs between
    #: the paper and its spec, or that make a run a variant (agentcredit.eval.report.run_settings)
    report_settings: tuple[str, ...] = ()
    #: the saved settings section (a dict) -> a label when those settings make the run not the paper's method
    variant: Callable[[dict[str, Any]], str | None] | None = None
    #: the layout (after the estimate) -> statistics of the method's signals the native trainer logs each step
    #: (TIPS: the scale of its potentials); None for none
    stats: Callable[[EpisodeBatch], dict[str, float]] | None = None
    #: (the native trainer's batch, after its scoring pass, and the step's signals) -> statistics of the signals
    #: this method's providers computed, logged every step (TIPS: the batch's alpha, Phi's split); None for none
    signal_stats: Callable[[Any, Any], dict[str, float]] | None = None
    #: (trainer, class) pairs: the settings class a trainer's block reads for this method where that trainer has
    #: fields of its own ("native": the agentcredit trainer, "verl": verl's agentcredit block), a subclass of
    #: ``settings``; a trainer not named reads ``settings``
    trainer_settings: tuple[tuple[str, type[Settings]], ...] = ()
    #: (old key, its key now) for each key of a config written before methods had sections of their own that now
    #: lives in this method's section: the config's one-line hint for an old key, and the lab's reading of old
    #: study files
    former_keys: tuple[tuple[str, str], ...] = ()
    #: the values of the old ``algorithm.estimator`` key that chose this method
    former_names: tuple[str, ...] = ()
    #: (metric key, label): the training-time diagnostics of this method that a run report shows as "mean over
    #: the training steps (last step)", whether its mechanism acts (agentcredit.eval.report.diagnostics_table)
    diagnostics: tuple[tuple[str, str], ...] = ()
    #: (name, function) pairs: advantages from per-episode outcomes and group ids alone,
    #: ``f(rewards, group_ids, *, eps) -> Tensor`` (one per episode), for a trainer that passes nothing else:
    #: verl's ``algorithm.adv_estimator`` registry takes each as ``agentcredit_<name>``
    outcome_estimators: tuple[tuple[str, Callable[..., Any]], ...] = ()
    #: the critic's value where the estimate reads it, from the critic model's output, ``f(output) -> V`` (a
    #: bounded head's squashing: carl-segment's V = sigmoid(head)); None = the output is the value
    critic_values: Callable[[Any], Any] | None = None
    #: for a trainer whose losses sum tokens (verl's seq-mean-token-sum): ``f(layout, rows_per_episode) ->``
    #: :class:`TokenWeights`, the critic's targets and weights and the actor's per-token loss weights that make
    #: those sums the method's own losses; None = the trainer's losses as they are
    token_weights: Callable[[EpisodeBatch, float], TokenWeights] | None = None
    #: signals computed per batch from the layout's other signals, with a state carried from batch to batch
    #: (TIPS's alpha under batch_target): ``f(layout, settings, state) -> (signals, state, stats)``. ``state`` is
    #: a JSON-able dict (the trainer saves it with its checkpoints), empty at the start; the method owns its keys
    batch_signals: (
        Callable[
            [EpisodeBatch, Any, Mapping[str, Any]], tuple[dict[str, Any], dict[str, Any], dict[str, float]]
        ]
        | None
    ) = None
    #: (trainer, check) pairs: ``check(config, settings, method) -> [one-line error, ...]`` on that trainer's whole
    #: config (verl: its Hydra config) for this part's ``settings``; ``method`` is the name the run trains
    #: (a composition's); empty = the config fits the method
    trainer_checks: tuple[tuple[str, Callable[[Any, Any, str], list[str]]], ...] = ()

    def __post_init__(self) -> None:
        if not self.composed_of:
            words = self.name.split("-")
            if not self.name[:1].isalpha() or not all(w and set(w) <= _NAME_CHARS for w in words):
                raise ValueError(
                    f"method name {self.name!r}: lower-case letters and digits, words joined by '-' (its config "
                    "section is the same name with '_')"
                )
            if (self.estimate is None) == (self.modifier is None):
                raise ValueError(f"method {self.name!r} must either estimate or modify (shape / reweight)")
            if self.modifier is not None and (self.shape is None) == (self.reweight is None):
                raise ValueError(f"modifier {self.name!r} must set exactly one of shape and reweight")
            for trainer, cls in self.trainer_settings:
                if not issubclass(cls, self.settings):
                    raise ValueError(
                        f"method {self.name!r}: the {trainer} settings {cls.__name__} must extend {self.settings.__name__}"
                    )

    def settings_class(self, trainer: str) -> type[Settings]:
        """The settings class ``trainer``'s config block reads (``settings``, or its extension for that trainer)."""
        return dict(self.trainer_settings).get(trainer, self.settings)

    def trainer_errors(self, trainer: str, config: Any, settings: Mapping[str, Settings]) -> list[str]:
        """The one-line errors of ``trainer``'s config for this method: each part's ``trainer_checks`` for that
        trainer, with the part's settings (``settings``: :meth:`settings_from`), in part order."""
        errors: list[str] = []
        for part in self.parts:
            for name, check in part.trainer_checks:
                if name == trainer:
                    errors += check(config, settings[part.section], self.name)
        return errors

    @property
    def section(self) -> str:
        """The config key of its settings: the name in snake_case (``carl-segment`` -> ``carl_segment``)."""
        return self.name.replace("-", "_")

    @property
    def parts(self) -> tuple[Method, ...]:
        """The estimating method, then its modifiers in order."""
        if self.composed_of:
            return self.composed_of
        if self.modifier is not None:
            if self.base is None:
                raise ValueError(f"modifier {self.name!r} has no base method; compose it with one")
            return (get_method(self.base), self)
        return (self,)

    @property
    def estimating(self) -> Method:
        return self.parts[0]

    @property
    def all_needs(self) -> Needs:
        """The needs of every part together (a single method's own)."""
        needs = self.parts[0].needs
        for part in self.parts[1:]:
            needs = needs | part.needs
        return replace(needs, loss_agg=self.needs.loss_agg)

    def settings_from(self, block: Any) -> dict[str, Settings]:
        """Each part's settings read from a trainer's config block: ``block.<section>``, its class's defaults
        where the block has no such section (a method registered outside agentcredit)."""
        out: dict[str, Settings] = {}
        for part in self.parts:
            value = getattr(block, part.section, None)
            if value is None:
                value = part.settings()
            elif not isinstance(value, part.settings):
                value = part.settings.model_validate(value)
            out[part.section] = value
        return out

    def advantages(self, layout: EpisodeBatch, settings: Mapping[str, Settings]) -> Estimate:
        """The one entry both trainers call: shaping, the estimate, then reweighting, each part with its settings."""
        parts = self.parts
        for part in parts[1:]:
            if part.shape is not None:
                layout.step_rewards = part.shape(layout, settings[part.section])
        estimate = parts[0].estimate(layout, settings[parts[0].section])  # type: ignore[misc]
        for part in parts[1:]:
            if part.reweight is not None:
                estimate = part.reweight(layout, estimate, settings[part.section])
        return estimate


_METHODS: dict[str, Method] = {}
#: Every registered method by name (read-only; add with :func:`register_method`).
METHODS: Mapping[str, Method] = MappingProxyType(_METHODS)
#: The two reference estimators a modifier is published on (its ``base``): the group baseline (GRPO's group
#: z-scores; GEAR reweights it) and the critic baseline (PPO's GAE with a learned value; TIPS shapes its rewards).
GROUP_BASELINE = "grpo"
CRITIC_BASELINE = "ppo"
#: The method a config or command that names none trains with: the group baseline every other method is
#: compared against (and the ``base:`` a user's YAML most often starts from).
DEFAULT_METHOD = GROUP_BASELINE
#: The method ``agentcredit demo`` runs end to end (SFT, critic warm-up and its gate, RL, evaluation), and the one
#: ``agentcredit train / sft / warmup`` use when given no ``--config`` (:func:`agentcredit.config.demo_preset`).
DEMO_METHOD = "carl-segment"


def register_method(method: Method, *, replace_existing: bool = False) -> Method:
    """Make ``method`` known to both trainers and the config, by its name; returns it (usable as a statement in
    user code: ``register_method(Method(...))``). A name already taken is an error unless ``replace_existing``."""
    if method.composed_of:
        raise ValueError(f"{method.name!r} is a composition; register its parts")
    if method.name in _METHODS and not replace_existing:
        raise ValueError(f"a method called {method.name!r} is already registered")
    _METHODS[method.name] = method
    return method


def unregister_method(name: str) -> Method:
    """Forget the method called ``name`` (a method registered for a test or a notebook session); returns it."""
    return _METHODS.pop(get_method(name).name)


def get_method(name: str) -> Method:
    """The method called ``name``; a ValueError listing the known names otherwise (never another method's)."""
    try:
        return _METHODS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown credit method {name!r}; known methods: {', '.join(_METHODS)}") from None


def compose(base: Method, *modifiers: Method) -> Method:
    """``base``'s estimate under ``modifiers`` (each a shaping or reweighting method), checked against their
    needs: a modifier that needs a critic-based estimate refuses one without a critic."""
    if not modifiers:
        return base
    estimating = base.estimating
    mods = [*base.parts[1:], *modifiers]
    for mod in mods:
        if mod.modifier is None:
            raise ValueError(f"{mod.name!r} estimates; it cannot modify {estimating.name!r}")
        if mod.needs.critic_base and estimating.needs.critic == "none":
            with_critic = [m.name for m in _METHODS.values() if m.estimate and m.needs.critic != "none"]
            raise ValueError(
                f"{mod.name} needs a method with a critic ({' or '.join(with_critic)}), not {estimating.name}: "
                f"{mod.needs.why}"
            )
    parts = (estimating, *mods)
    for registered in _METHODS.values():  # grpo+gear is the registered gear (GEAR is published on GRPO)
        if registered.modifier is not None and registered.parts == parts:
            return registered
    needs = estimating.needs
    for part in mods:
        needs = needs | part.needs
    return Method(
        name="+".join(p.name for p in parts),
        settings=estimating.settings,
        needs=needs,
        source="; ".join(p.source for p in parts),
        composed_of=parts,
    )


def resolve_method(text: str) -> tuple[Method, str]:
    """``<method>[+<modifier>...][-<label>]`` (``carl-segment``, ``portool+gear``, ``portool-shifted-outcome``) ->
    the method it trains (:func:`compose`) and the label ('' for none; a label names a variant in logs and reports,
    never what trains). A ValueError lists the registered methods otherwise, or says why a modifier does not fit."""
    by_length = sorted(_METHODS, key=len, reverse=True)  # carl-segment before a method called carl

    def prefix(rest: str, names: list[str]) -> str | None:
        return next((n for n in names if rest == n or rest.startswith((f"{n}+", f"{n}-"))), None)

    base = prefix(text, by_length) if isinstance(text, str) else None
    if base is not None:
        modifiers = [n for n in by_length if _METHODS[n].modifier is not None]
        mods, rest = [], text[len(base) :]
        while rest.startswith("+") and (mod := prefix(rest[1:], modifiers)) is not None:
            mods.append(_METHODS[mod])
            rest = rest[1 + len(mod) :]
        if rest == "" or (rest.startswith("-") and len(rest) > 1):
            return compose(_METHODS[base], *mods), rest[1:]
    modifiers = [m.name for m in _METHODS.values() if m.modifier is not None]
    raise ValueError(
        f"{text!r} names no registered method: use one of {', '.join(_METHODS)}, optionally +<modifier> "
        f"({', '.join(modifiers)}) and a -<label> naming a variant"
    )


def modifier_names(kind: str) -> list[str]:
    """The registered modifiers of one kind (``shaping`` or ``reweight``)."""
    return [m.name for m in _METHODS.values() if m.modifier == kind]
