"""Per-episode environments: tools with state per episode (a database connection, a simulator), gymnasium-style.

A stateless tool is a function (:mod:`agentcredit.tools.functions`). A tool that needs state for the length of one
episode lives in an *environment*: a class, created once per episode, with gymnasium's method names::

    class ShopEnv(ToolEnv):
        tools = ("query",)                 # the methods the model may call (their schemas: type hints, docstring)

        def reset(self, example):          # a new episode on this example (Example: question, answers, info)
            self.db = sqlite3.connect(...)

        def query(self, sql: str) -> str:
            '''Run one read-only SELECT on the shop database.

            Args:
                sql: one SELECT statement
            '''
            ...

        def close(self):                   # the episode ended (always called, also when it failed)
            self.db.close()

:class:`ToolEnv`'s ``step(calls)`` runs each call on the method it names: arguments are checked against the
method's schema, and a bad call or an exception inside the method becomes an ``ERROR:`` observation (as for
function tools), never a crashed batch. Override ``step`` for rewards or an end decided by the environment::

        def step(self, calls):
            observations, done, reward = super().step(calls)
            return observations, self.solved, (1.0 if self.solved else 0.0)

``step(calls) -> (observations, done, reward)``: one observation per call (a string, or the
:class:`~agentcredit.tools.base.ToolResult` the default step makes), ``done`` True ends the episode after this step
(its observations are recorded, not shown: no turn follows), and ``reward`` is this step's reward (None = 0).
An environment need not subclass :class:`ToolEnv`: any class with ``tools``, ``reset``, ``step`` and ``close``
works. All its methods, the constructor included, run on one thread of its own (a ``sqlite3`` connection made in
``reset`` may be used in ``step`` and closed in ``close``); environments of different episodes run concurrently. Config: ``tools.environment: "package.module:Class"`` plus ``tools.environment_options`` (keyword arguments
of the class).

Where step rewards go (one rule for every trainer, :mod:`agentcredit.rollout.engine`): each step's reward is
recorded on the policy step whose calls it answered (``info["env_reward"]``); the episode's reward is its outcome
reward (``task.reward`` or the task's scorer) plus the sum of its step rewards, the undiscounted return; the
critic methods (PPO's GAE, carl-segment; TIPS's shaping adds its turn rewards to them) place each step reward on
its step, the outcome on the last; PORTool adds a step's reward to that step's own term R_fm(v) of Eq. 2, the
paper's only per-step reward, and its outcome terms read the outcome alone, so no reward counts twice.

Errors are the user's code failing, not the model's: a class that cannot be loaded, a ``tools`` entry that is not
a typed, documented method, a ``reset``/``step``/``close`` that raises or a ``step`` that returns the wrong shape
stop the command with an :class:`UserEnvironmentError` naming ``module:Class.method``, the example and what is wrong.

Tree strategies branch an episode from a middle state. An environment has no copy operation in gymnasium, so a
branch gets a fresh environment that is ``reset`` and *replays* the calls on the path to the branch point; the
replayed observations must equal the recorded ones (an environment that answers the same calls differently cannot
be branched: that is an error naming the step). :data:`~agentcredit.rollout.strategies.independent` never replays.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import numbers
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

from agentcredit.tools.base import (
    ToolCall,
    ToolResult,
    ToolUnavailableError,
    UnavailableText,
    UserCodeError,
    run_call,
)
from agentcredit.tools.functions import FunctionTool, load_function

__all__ = ["UserEnvironmentError", "EpisodeEnvironments", "EpisodeSession", "StepOutcome", "ToolEnv"]


class UserEnvironmentError(UserCodeError):
    """A user environment failed (its own code, not the model's call): the command stops with this message."""


class ToolEnv:
    """Optional base class of an environment: ``step`` runs each call on the method it names (see the module)."""

    tools: ClassVar[Sequence[str]] = ()

    def reset(self, example: Any) -> None:
        """Start an episode on ``example``; the default keeps no state."""

    def step(self, calls: Sequence[ToolCall]) -> tuple[list[ToolResult], bool, float | None]:
        """Each call run on its method: arguments checked, a raised exception an ``ERROR:`` observation."""
        bound = getattr(self, "_bound_tools", None)
        if bound is None:
            bound = self._bound_tools = {
                t.name: t for t in (FunctionTool(getattr(self, n)) for n in self.tools)
            }
        return [run_call(bound, call) for call in calls], False, None

    def close(self) -> None:
        """Release what ``reset`` opened; the default has nothing to release."""


@dataclass
class StepOutcome:
    results: list[ToolResult]
    done: bool
    reward: float


class EpisodeEnvironments:
    """The environment class a config names: its tools' schemas, and :meth:`open` for one episode."""

    def __init__(
        self, spec: str | type, options: Mapping[str, Any] | None = None, *, field: str = "tools.environment"
    ):
        cls = load_function(spec, field=field) if isinstance(spec, str) else spec
        self.where = f"{getattr(cls, '__module__', '?')}:{getattr(cls, '__qualname__', repr(cls))}"
        if not inspect.isclass(cls):
            raise ValueError(f"{field}: {self.where} is a {type(cls).__name__}, not a class")
        missing = [m for m in ("reset", "step", "close") if not callable(getattr(cls, m, None))]
        if missing:
            raise ValueError(
                f"{field}: {self.where} has no {', '.join(missing)} method (see agentcredit.tools.episodes)"
            )
        names = getattr(cls, "tools", None)
        if isinstance(names, str) or not isinstance(names, Sequence) or not names:
            raise ValueError(
                f"{field}: {self.where}.tools must list the names of the methods the model may call"
            )
        self.schemas: list[dict[str, Any]] = []
        for name in names:
            method = getattr(cls, str(name), None)
            if not callable(method):
                raise ValueError(
                    f"{field}: {self.where}.tools names {name!r}, which is not a method of the class"
                )
            try:
                # the schema of the unbound method: get_json_schema leaves out self
                tool = FunctionTool(method)
            except ValueError as exc:
                raise ValueError(f"{field}: {self.where}.{name}: {exc}") from exc
            self.schemas.append(tool.schema)
        self.cls, self.options, self.field = cls, dict(options or {}), field
        self.names = [str(n) for n in names]

    def open(self, example: Any) -> EpisodeSession:
        """A new environment, ``reset`` on ``example``; the caller closes it. One that fails in ``reset`` is
        closed here (quietly: the reset's error is the one reported)."""
        session = EpisodeSession(self, example)
        try:
            session.call("reset", example)
        except BaseException:
            with contextlib.suppress(Exception):
                session.close()
            raise
        return session

    def _where(self, method: str, example: Any) -> str:
        ident = getattr(example, "id", None)
        return f"environment {self.where}.{method}" + (f" on example {ident!r}" if ident is not None else "")


class EpisodeSession:
    """One episode's environment: :meth:`step` checks what the user's ``step`` returns; :meth:`close` once.

    Every method of the environment, its constructor included, runs on one thread of the session's own: the
    engine steps episodes from a thread pool and closes them from its loop, and resources such as a ``sqlite3``
    connection may only be used on the thread that made them.
    """

    def __init__(self, owner: EpisodeEnvironments, example: Any):
        self.owner, self.example = owner, example
        self.closed = False
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentcredit-env")
        try:
            self.env = self._thread.submit(owner.cls, **owner.options).result()
        except Exception as exc:
            self._thread.shutdown(wait=False)
            where = owner._where("__init__", example)
            raise UserEnvironmentError(f"{where} raised {type(exc).__name__}: {exc}") from exc

    def call(self, method: str, *args: Any) -> Any:
        try:
            return self._thread.submit(getattr(self.env, method), *args).result()
        except (
            ToolUnavailableError
        ):  # the environment's own resource is missing: the machine's fault, said as is
            raise
        except Exception as exc:
            raise UserEnvironmentError(
                f"{self.owner._where(method, self.example)} raised {type(exc).__name__}: {exc}"
            ) from exc

    def step(self, calls: Sequence[ToolCall]) -> StepOutcome:
        out = self.call("step", list(calls))
        where = self.owner._where("step", self.example)
        if not isinstance(out, tuple | list) or len(out) != 3:
            raise UserEnvironmentError(
                f"{where} returned {out!r:.200}; expected (observations, done, reward)"
            )
        observations, done, reward = out
        if (
            isinstance(observations, str)
            or not isinstance(observations, Sequence)
            or len(observations) != len(calls)
        ):
            raise UserEnvironmentError(
                f"{where} returned observations {observations!r:.200}; expected a list of {len(calls)} (one per call)"
            )
        results = [
            _result(call, obs, where, i)
            for i, (call, obs) in enumerate(zip(calls, observations, strict=True))
        ]
        if not isinstance(done, bool):
            raise UserEnvironmentError(f"{where} returned done={done!r}; expected True or False")
        if reward is None:
            reward = 0.0
        if hasattr(reward, "item") and not isinstance(reward, numbers.Real):
            reward = reward.item()
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
            raise UserEnvironmentError(
                f"{where} returned reward={reward!r}; a step reward is one finite number or None"
            )
        return StepOutcome(results, done, float(reward))

    def replay(self, steps: Sequence[tuple[Sequence[ToolCall], Sequence[str]]]) -> None:
        """Re-run recorded steps (calls, their recorded outputs) to rebuild a middle state for a branch."""
        for k, (calls, recorded) in enumerate(steps):
            outputs = [r.output for r in self.step(calls).results]
            if list(outputs) != list(recorded):
                raise UserEnvironmentError(
                    f"{self.owner._where('step', self.example)}: replaying step {k} to branch the episode gave "
                    f"{outputs!r:.200}, but the episode recorded {list(recorded)!r:.200}. A tree strategy branches "
                    "an episode by replaying its calls in a fresh environment, so the environment must answer the "
                    "same calls the same way; use strategy 'independent' for this environment"
                )

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.call("close")
            finally:
                self._thread.shutdown(wait=False)


class EpisodeTools:
    """One episode's environment behind :class:`~agentcredit.tools.base.ToolRuntime`'s ``run`` (what
    :func:`agentcredit.rollout.replay.replay` calls for scripted demonstrations): opened at the first call,
    ``done`` and ``reward`` of the last step kept for the caller, closed by :meth:`close`."""

    def __init__(self, episodes: EpisodeEnvironments, example: Any):
        self.episodes, self.example = episodes, example
        self.session: EpisodeSession | None = None
        self.done, self.reward = False, 0.0

    def run(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        if self.session is None:
            self.session = self.episodes.open(self.example)
        out = self.session.step(calls)
        self.done, self.reward = out.done, out.reward
        return out.results

    def close(self) -> None:
        if self.session is not None:
            self.session.close()


def _result(call: ToolCall, obs: Any, where: str, index: int) -> ToolResult:
    if isinstance(obs, ToolResult):
        return obs
    if not isinstance(obs, str):
        raise UserEnvironmentError(f"{where} returned observation {index} = {obs!r:.200}; expected a string")
    infra = isinstance(obs, UnavailableText)
    return ToolResult(call.name, str(obs), ok=not infra and not obs.startswith("ERROR:"), infra=infra)
