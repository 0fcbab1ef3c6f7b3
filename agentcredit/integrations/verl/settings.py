"""The ``agentcredit:`` block of the Hydra config, typed and validated.

verl's Hydra tree is struct-mode, so a mistyped key on the command line fails in Hydra already
(``agentcredit.carl_segment.lamda=0``). A key that reaches the config some other way (a user YAML, or a forced
``+key=...`` override) is caught here: every section forbids unknown keys and the error names the dotted path.
Every field gives its paper value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from agentcredit.config import (
    TreeStrategyConfig,
    UserRewardConfig,
    UserToolsConfig,
    method_sections,
    registered_sections,
)
from agentcredit.credit.methods import DEFAULT_METHOD, METHODS, Needs, Settings, get_method
from agentcredit.plugins import import_user_modules, load_entry_points

__all__ = ["AgentCreditSettings", "NEEDS_RESOLVER", "load_settings", "register_needs_resolver", "verl_keys"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolSettings(UserToolsConfig):
    """verl's tool block: your own tools (``functions``, ``mcp``: the native section's definition) plus the
    retrieval server, sandbox and suite of a worker."""

    search_url: str | None = Field(
        None,
        description="Search-R1 retrieval endpoint (POST {queries, topk}); `agentcredit serve-search` serves it.",
    )
    search_topk: int = Field(3, ge=1, description="passages per query (Search-R1 / TIPS / CARL: top-3).")
    search_timeout: float = Field(30.0, gt=0, description="seconds per retrieval request.")
    search_batch_size: int = Field(
        32,
        ge=1,
        description="queries of concurrent episodes (one worker process) sent in one request, at most; 1 = one "
        "request per query. Search-R1's API and agentcredit's server take a list.",
    )
    search_batch_wait: float = Field(
        0.01, ge=0, description="seconds the first query of a batch waits for others to join it."
    )
    search_format: Literal["default", "search-r1", "verl"] = Field(
        "search-r1", description="how passages are rendered (agentcredit.tools.search.format_passages)."
    )
    python: bool = Field(False, description="enable the sandboxed python tool (carl-segment's code fences).")
    python_timeout: float = Field(5.0, gt=0, description="wall-clock limit of one python call.")
    python_isolation: Literal["bwrap", "rlimits"] = Field(
        "bwrap",
        description="the sandbox's isolation: bwrap, or the rlimits fallback for trusted code only, by name "
        "(docs/sandbox.md).",
    )
    python_interpreter: str | None = Field(
        None,
        description="the interpreter the sandbox runs, a path on every agent-loop node; None = the worker's own. "
        "Without bubblewrap a root worker runs code as an unprivileged uid, which must be able to read it.",
    )
    suite: bool = Field(
        False, description="PORTool's 17-tool suite (agentcredit.tools.suite), run in each worker."
    )
    suite_corpus: str | None = Field(
        None,
        description="JSONL corpus behind the suite's knowledge_search (BM25, per worker); None = packaged sample.",
    )
    max_workers: int = Field(8, ge=1, description="concurrent tool calls per agent-loop worker.")


#: The turn.info key the agent loop writes a step's formatting reward under (a method's settings may name another).
FORMAT_REWARD_KEY = "format_reward"


class _AgentCreditBlock(UserRewardConfig):
    """The ``agentcredit`` block without its method sections (:data:`AgentCreditSettings` adds them)."""

    model_config = ConfigDict(extra="allow")

    imports: list[str] = Field(
        default_factory=list,
        description="your own modules, imported (in every process that reads this block) before the method is "
        "read: importable module names or paths of .py files, as the native config's top-level imports "
        "(agentcredit.plugins); entry points of the group agentcredit.plugins are imported too.",
    )
    method: str = Field(
        description="which credit method the trainer runs: a name of agentcredit.credit.METHODS (the eight, or "
        "one registered with agentcredit.credit.register_method, from a module of agentcredit.imports)."
    )
    protocol: str = Field(
        "tags", description="agentcredit protocol: tags (Search-R1), codefence (CARL), jsoncall, chat."
    )
    protocol_options: dict[str, Any] = Field(
        default_factory=dict, description="keyword options of get_protocol()."
    )
    reward_metric: str = Field(
        "em", description="agentcredit.tasks.scoring.score metric for the outcome (EM)."
    )
    format_bonus: float = Field(
        0.0, description="added to the outcome when an answer was extracted (TIPS code: 0.2)."
    )
    max_segment_tokens: int = Field(2048, ge=1, description="generation budget of one policy segment.")
    tools: ToolSettings = Field(default_factory=ToolSettings)
    tree: TreeStrategyConfig = Field(
        default_factory=TreeStrategyConfig,
        description="the rollout tree of one prompt (the native rollout section's strategy fields): independent "
        "(verl's rollout.n sessions), or portool / entropy_guided grown by one agent-loop session with one output per "
        "leaf; then actor_rollout_ref.rollout.n must equal its leaves (n, or n0 + n).",
    )

    @model_validator(mode="before")
    @classmethod
    def _user_modules(cls, data: Any) -> Any:
        load_entry_points()  # before `method` is read: it may name a method a user module registers
        if isinstance(data, Mapping) and data.get("imports") is not None:
            import_user_modules(data["imports"], where="imports")
        return data

    @field_validator("method")
    @classmethod
    def _known_method(cls, name: str) -> str:
        get_method(name)  # a ValueError listing the registered methods
        return name

    @model_validator(mode="after")
    def _registered_sections(self) -> _AgentCreditBlock:
        registered_sections(self, "agentcredit")
        return self

    @property
    def needs(self) -> Needs:
        """What the method reads (:class:`agentcredit.credit.Needs`): the agent loop and the trainer compute the
        signals it names, never by the method's name."""
        return get_method(self.method).all_needs

    def settings_for(self, need: str) -> Settings:
        """The settings of the method's part that needs ``need`` (a signal such as ``potentials`` or
        ``teacher_logp``, the ``judge`` reward, or a critic kind such as ``boundary``), read through the method
        object (:meth:`agentcredit.credit.Method.settings_from`), never by a section's name."""
        method = get_method(self.method)
        parts = method.settings_from(self)
        for part in method.parts:
            needs = part.needs
            if need in needs.signals | needs.step_inputs or need in (needs.reward, needs.critic):
                return parts[part.section]
        raise ValueError(f"agentcredit.method={self.method} has no part that needs {need!r}")

    @property
    def format_reward_key(self) -> str:
        """The turn.info key of the protocol's formatting reward: the setting of the part that needs
        ``format_reward`` (PORTool's), else that setting's default (the rows carry no formatting reward then)."""
        if "format_reward" in self.needs.step_inputs:
            return getattr(self.settings_for("format_reward"), "format_reward_key", FORMAT_REWARD_KEY)
        return FORMAT_REWARD_KEY


# one section per built-in method, of the class its home gives verl (Method.settings_class("verl"): the native
# trainer's, one schema for both, or its extension with verl-only fields); never written per method here
AgentCreditSettings = create_model(
    "AgentCreditSettings",
    __base__=_AgentCreditBlock,
    __module__=__name__,
    __doc__="The ``agentcredit`` block; ``reward`` (your own outcome reward) is the native ``task.reward``'s "
    "definition. Every built-in method has its settings section (``agentcredit.<section>``); a method registered "
    "from user code keeps its settings under ``agentcredit.<its section>`` too.",
    **method_sections("verl"),
)


#: verl's ``loss_agg_mode`` for a method's ``Needs.loss_agg``. verl has no segment-mean: carl-segment's recipe
#: (``config/carl_segment.yaml``) expresses Eq. 3 as seq-mean-token-sum with ``segment_mean_loss``; without that
#: setting (its default) the trainer wants token-mean (``check_trainer_config``).
VERL_LOSS_AGG = {
    "token-mean": "token-mean",
    "seq-mean-token-mean": "seq-mean-token-mean",
    "segment-mean": "token-mean",
}
#: The OmegaConf resolver ``config/agentcredit_base.yaml`` derives verl's keys with: ``${agentcredit_needs:'<key>',
#: ${agentcredit.method}}``.
NEEDS_RESOLVER = "agentcredit_needs"


#: The ``adv_estimator`` verl sees for a method without a critic (verl only needs one that runs no critic; the
#: advantages are agentcredit's): the default method's first outcome estimator (``Method.outcome_estimators``).
CRITIC_FREE_ESTIMATOR = f"agentcredit_{METHODS[DEFAULT_METHOD].outcome_estimators[0][0]}"


def verl_keys(method: str) -> dict[str, Any]:
    """The verl keys a method's :class:`~agentcredit.credit.Needs` decide, by dotted key: whether verl runs a
    critic, the ``adv_estimator`` verl sees (the advantages themselves are agentcredit's), the actor's
    ``loss_agg_mode`` and the rollout tree. ``config/agentcredit_base.yaml`` sets each from ``agentcredit.method``,
    so a method needs no Hydra file of its own (a recipe file may still set them, and wins)."""
    needs = get_method(method).all_needs
    critic = needs.critic != "none"
    return {
        "critic.enable": critic,
        "algorithm.adv_estimator": "gae" if critic else CRITIC_FREE_ESTIMATOR,
        "actor_rollout_ref.actor.loss_agg_mode": VERL_LOSS_AGG[needs.loss_agg],
        "agentcredit.tree.strategy": needs.rollout or "independent",
    }


def register_needs_resolver() -> None:
    """Make :data:`NEEDS_RESOLVER` known to OmegaConf in this process (idempotent; a no-op without OmegaConf).
    :mod:`.register` (every verl process) and this module's import call it."""
    try:
        from omegaconf import OmegaConf
    except ImportError:
        return
    if not OmegaConf.has_resolver(NEEDS_RESOLVER):
        OmegaConf.register_new_resolver(NEEDS_RESOLVER, lambda key, method: verl_keys(method)[key])


register_needs_resolver()


def _plain(config: Any) -> Any:
    """An OmegaConf node (or anything mapping-like) as plain Python containers."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # only plain dicts then
        return config
    if isinstance(config, DictConfig | ListConfig):
        return OmegaConf.to_container(config, resolve=True)
    return config


def load_settings(config: Any, *, where: str = "agentcredit") -> AgentCreditSettings:
    """Validate the ``agentcredit`` block (an OmegaConf node or a dict); errors name the dotted key."""
    block = _plain(config)
    if not isinstance(block, Mapping):
        raise ValueError(f"{where} must be a mapping with at least `method`, got {type(block).__name__}")
    try:
        return AgentCreditSettings.model_validate(dict(block))
    except ValidationError as err:
        problems = []
        for e in err.errors():
            text = str(e["msg"]).removeprefix("Value error, ")
            if not e["loc"] and text.startswith("imports"):  # a user module: the message names the entry
                problems.append(f"{where}.{text}")
                continue
            key = ".".join([where, *(str(p) for p in e["loc"])])
            problems.append(f"{key}: {e['msg']}")
        raise ValueError("invalid agentcredit config:\n  " + "\n  ".join(problems)) from None
