"""Per-episode environments (issue 15): ``reset(example)`` / ``step(calls) -> observations, done, reward`` /
``close()``, one per episode, through SFT, the engine (tree branches included) and every step-reward method."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from calculator_env import CalculatorEnv, DriftingEnv
from train_helpers import EXAMPLES, METHODS, SMALL, assert_a_real_step, fit_tiny, one_step

from agentcredit.config import load_config
from agentcredit.environment import build_environment
from agentcredit.rollout.engine import EngineConfig, Job, RolloutEngine, Strategy, recorded_steps
from agentcredit.rollout.sampling import SamplingParams
from agentcredit.tools.base import ToolCall
from agentcredit.tools.episodes import EpisodeEnvironments, ToolEnv, UserEnvironmentError
from agentcredit.train.trainer import Trainer

ENV = [
    "protocol.name=chat",
    "protocol.options={max_segments: 3}",
    "tools.environment=calculator_env:CalculatorEnv",
    "tools.suite_tools=[]",  # the portool preset shows suite tools; an environment owns every tool
]


@pytest.fixture(scope="module")
def fitted_env():
    # SFT itself runs the demonstrations through the environment (their observations are its answers)
    return fit_tiny("grpo-arith-tools", ENV, epochs=100)  # 100: it calls the tool often, not always


def _policy_nodes(tree):
    return [n for n in range(len(tree.nodes)) if tree.segment(n).role == "policy"]


@pytest.mark.parametrize("name", ["grpo", "ppo", "carl-segment", "portool"])
def test_one_step_with_a_per_episode_environment(name, fitted_env):
    model, tokenizer = copy.deepcopy(fitted_env[0]), fitted_env[1]
    preset, overrides = METHODS[name]
    config = load_config(preset, [*SMALL, *overrides, *ENV])
    CalculatorEnv.reset_counters()
    trainer, result, before = one_step(config, model, tokenizer)
    assert_a_real_step(trainer, result, before)
    assert CalculatorEnv.opened > 0 and CalculatorEnv.opened == CalculatorEnv.closed
    assert set(CalculatorEnv.resets) <= {e.id for e in EXAMPLES}
    paid = 0
    for tree in result.trees:
        for node in _policy_nodes(tree):
            info = tree.segment(node).info
            assert ("env_reward" in info) == bool(info["calls"])  # every tool step, and only those
            paid += info.get("env_reward", 0.0) > 0
        for leaf in tree.leaves():
            info = tree.nodes[leaf].info
            steps = sum(tree.segment(n).info.get("env_reward", 0.0) for n in tree.path(leaf))
            assert tree.nodes[leaf].reward == pytest.approx(info["outcome_reward"] + steps)
    assert paid > 0, "the fitted model computes the question's own expression, which the environment pays"


class BranchAfterFirstStep(Strategy):
    """One episode paused after its first step, then two continuations of it: the first takes the paused
    episode over (its environment too), the second is a branch that needs a fresh, replayed environment."""

    name = "branch-after-first-step"
    needs_prefix_store = True

    def plan(self, ctx):
        (first,) = yield [Job(0, max_steps=1)]
        assert not first.finished, "the fitted model calls the tool first on 17*23"
        yield [Job(first.end), Job(first.end)]
        return None


def _branch(fitted_env, env_class):
    model, tokenizer = fitted_env
    config = load_config("grpo-arith-tools", [*SMALL, *ENV, f"tools.environment=calculator_env:{env_class}"])
    env = build_environment(config)
    try:
        # greedy: the fitted model then writes the tool call (both continuations are equal; the replay is what counts)
        config = EngineConfig(
            sampling=SamplingParams(temperature=0.0), max_segment_tokens=40, max_episode_tokens=96
        )
        engine = RolloutEngine.for_hf_model(model, tokenizer, env.protocol, env.tools, config)
        with torch.no_grad():
            return engine.run(EXAMPLES[:1], BranchAfterFirstStep(), env.reward)[0]
    finally:
        env.close()


def test_a_tree_branch_continues_the_paused_environment_and_replays_for_the_others(fitted_env):
    CalculatorEnv.reset_counters()
    tree = _branch(fitted_env, "CalculatorEnv")
    assert len(tree.leaves()) == 2
    # the first continuation took the paused episode's environment over; the second (a branch) answers without
    # a call, so no environment was made for it: one is opened at an episode's first call
    assert CalculatorEnv.resets == ["q-hard"]
    assert CalculatorEnv.opened == CalculatorEnv.closed == 1
    for leaf in tree.leaves():  # both carry the first step's reward in their return
        assert tree.nodes[leaf].reward == pytest.approx(tree.nodes[leaf].info["outcome_reward"] + 0.25)
    # a branch that does call replays the recorded steps up to the branch point into a fresh environment
    branch_point = tree.parent(tree.leaves()[0])
    steps = recorded_steps(tree, branch_point)
    assert [([c.to_dict() for c in calls], outputs) for calls, outputs in steps] == [
        (
            [{"name": "math_calculation", "arguments": {"expression": "17*23"}, "raw": steps[0][0][0].raw}],
            ["391"],
        )
    ]
    EpisodeEnvironments(CalculatorEnv).open(EXAMPLES[0]).replay(steps)
    with pytest.raises(
        UserEnvironmentError, match=r"DriftingEnv\.step on example 'q-hard': replaying step 0"
    ):
        EpisodeEnvironments(DriftingEnv).open(EXAMPLES[0]).replay(steps)


def test_a_step_that_raises_stops_training_naming_the_class_and_example(fitted_env):
    model, tokenizer = copy.deepcopy(fitted_env[0]), fitted_env[1]
    config = load_config("grpo-arith-tools", [*SMALL, *ENV, "tools.environment=calculator_env:BrokenStepEnv"])
    CalculatorEnv.reset_counters()
    trainer = Trainer(config, model=model, tokenizer=tokenizer, examples=list(EXAMPLES), log=False)
    with pytest.raises(
        UserEnvironmentError,
        match=r"calculator_env:BrokenStepEnv\.step on example 'q-(hard|easy)' raised KeyError: .no such table",
    ):
        try:
            trainer.train_step()
        finally:
            trainer.close()
    assert CalculatorEnv.opened == CalculatorEnv.closed  # the other episodes' environments were closed too


def test_an_environment_can_end_the_episode(fitted_env):
    model, tokenizer = copy.deepcopy(fitted_env[0]), fitted_env[1]
    config = load_config("grpo-arith-tools", [*SMALL, *ENV, "tools.environment=calculator_env:FinishingEnv"])
    env = build_environment(config)
    try:
        from agentcredit.rollout.run import run_episodes

        trees = run_episodes(model, tokenizer, env, EXAMPLES[:1], samples=4, temperature=1.0, seed=0)
    finally:
        env.close()
    ended = [
        leaf for tree in trees for leaf in tree.leaves() if tree.nodes[leaf].info["finish"] == "env_done"
    ]
    assert ended, "the fitted model computes 17*23 with the tool, which ends FinishingEnv's episode"
    for leaf in ended:
        tree = trees[0]
        assert tree.segment(leaf).role == "policy"  # the last tool results are recorded, not shown
        assert tree.segment(leaf).info["results"][0]["output"] == "391"
        assert tree.segment(leaf).info["format"]["n_success"] == 1  # observation() still read the results
        assert tree.nodes[leaf].reward == pytest.approx(tree.nodes[leaf].info["outcome_reward"] + 1.0)


# ----------------------------------------------------------------------------------------- bad user code
class _Untyped(ToolEnv):
    tools = ("query",)

    def query(self, sql):
        """Run SQL.

        Args:
            sql: a statement
        """


class _NoTools(ToolEnv):
    pass


class _Shape(ToolEnv):
    tools = ("ping",)

    def ping(self, host: str) -> str:
        """Ping a host.

        Args:
            host: its name
        """
        return "pong"


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (_Untyped, r"_Untyped\.query: .*cannot build its JSON schema"),
        (_NoTools, r"_NoTools\.tools must list the names of the methods"),
        (len, r"is a builtin_function_or_method, not a class"),
    ],
)
def test_a_bad_environment_class_is_refused_when_loaded(cls, message):
    with pytest.raises(ValueError, match=message):
        EpisodeEnvironments(cls)


def test_a_missing_module_names_the_field():
    with pytest.raises(ValueError, match=r"tools.environment: cannot import module 'no_such_env_module'"):
        EpisodeEnvironments("no_such_env_module:Env")


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        ("pong", r"expected \(observations, done, reward\)"),
        (([], False, 0.0), r"expected a list of 1 \(one per call\)"),
        ((["pong"], 1, 0.0), r"done=1; expected True or False"),
        ((["pong"], False, "high"), r"reward='high'; a step reward is one finite number or None"),
        ((["pong"], False, float("nan")), r"reward=nan"),
        (([3], False, None), r"observation 0 = 3; expected a string"),
    ],
)
def test_a_step_that_returns_the_wrong_shape_is_an_error_naming_it(returned, message):
    class Env(_Shape):
        def step(self, calls):
            return returned

    session = EpisodeEnvironments(Env).open(EXAMPLES[0])
    with pytest.raises(UserEnvironmentError, match=rf"Env\.step on example 'q-hard' returned .*{message}"):
        session.step([ToolCall("ping", {"host": "a"})])


def test_the_default_step_turns_bad_calls_and_tool_exceptions_into_observations():
    class Env(_Shape):
        def ping(self, host: str) -> str:
            """Ping a host.

            Args:
                host: its name
            """
            raise ConnectionError(f"{host} is down")

    session = EpisodeEnvironments(Env).open(EXAMPLES[0])
    out = session.step(
        [ToolCall("ping", {"host": "db"}), ToolCall("ping", {"port": 1}), ToolCall("traceroute", {})]
    )
    assert (out.done, out.reward) == (False, 0.0)
    assert [r.ok for r in out.results] == [False, False, False]
    assert out.results[0].output == "ERROR: tool 'ping' failed: ConnectionError: db is down"
    assert "invalid arguments" in out.results[1].output
    assert out.results[2].output == "ERROR: unknown tool 'traceroute'; available: ping"
    session.close()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["protocol.name=tags"], "tools.environment needs a protocol that shows tool schemas"),
        (["tools.functions=[calculator_env:CalculatorEnv]"], "list its tools in the environment class"),
    ],
)
def test_an_environment_is_refused_beside_other_tools_or_protocols(extra, message):
    config = load_config("grpo-arith-tools", [*SMALL, *ENV, *extra])
    with pytest.raises(ValueError, match=message):
        build_environment(config)


def test_a_reset_that_fails_still_closes_the_environment():
    closed = []

    class Env(_Shape):
        def reset(self, example):
            raise FileNotFoundError("shop.db")

        def close(self):
            closed.append(True)

    with pytest.raises(
        UserEnvironmentError, match=r"Env\.reset on example 'q-hard' raised FileNotFoundError"
    ):
        EpisodeEnvironments(Env).open(EXAMPLES[0])
    assert closed == [True]


def test_every_method_of_an_environment_runs_on_one_thread_of_its_own():
    import sqlite3
    import threading
    from concurrent.futures import ThreadPoolExecutor

    class Env(_Shape):
        def __init__(self):
            self.threads = {threading.get_ident()}

        def reset(self, example):
            self.db = sqlite3.connect(":memory:")  # usable only on the thread that made it
            self.threads.add(threading.get_ident())

        def ping(self, host: str) -> str:
            """Ping a host.

            Args:
                host: its name
            """
            self.threads.add(threading.get_ident())
            return str(self.db.execute("SELECT 1").fetchone()[0])

        def close(self):
            self.threads.add(threading.get_ident())
            self.db.close()

    session = EpisodeEnvironments(Env).open(EXAMPLES[0])
    with ThreadPoolExecutor(4) as pool:  # the engine steps from a pool and closes from its loop
        outs = list(pool.map(lambda _: session.step([ToolCall("ping", {"host": "a"})]), range(4)))
    assert [o.results[0].output for o in outs] == ["1"] * 4
    session.close()
    assert len(session.env.threads) == 1 and threading.get_ident() not in session.env.threads


@pytest.mark.slow
def test_portool_in_its_own_format_with_an_environment(fitted_jsoncall):
    """jsoncall (PORTool's format) with an environment: the model sees its tools and response_gen, which the
    protocol keeps (it ends the episode and never reaches the environment). The scripted demonstrations show the
    path exactly (the tiny model's own jsoncall samples rarely parse); then one PORTool step trains on it."""
    from agentcredit.train.sft import demonstrations

    jsoncall = [
        "protocol.name=jsoncall",
        "tools.environment=calculator_env:CalculatorEnv",
        "tools.suite_tools=[]",
    ]
    preset, overrides = METHODS["portool"]
    config = load_config(preset, [*SMALL, *overrides, *jsoncall])
    env = build_environment(config)
    CalculatorEnv.reset_counters()
    try:
        assert [s["function"]["name"] for s in env.protocol.schemas] == ["math_calculation", "response_gen"]
        # the model fitted on the suite's jsoncall format: the step below needs a real update, not tool calls
        model, tokenizer = copy.deepcopy(fitted_jsoncall[0]), fitted_jsoncall[1]
        (hard, easy) = demonstrations(env, tokenizer, EXAMPLES, "jsoncall")
    finally:
        env.close()
    steps = [hard.segment(n).info for n in _policy_nodes(hard)]
    # the answer step's response_gen is the protocol's: no call reaches the environment, no step reward
    assert [[c["name"] for c in i["calls"]] for i in steps] == [["math_calculation"], []]
    assert steps[0]["env_reward"] == 0.25 and "env_reward" not in steps[1]
    assert hard.nodes[hard.leaves()[0]].info["answer"] == "391"
    assert steps[0]["format_reward"] == 0.25  # a well-formed step with a successful call
    assert CalculatorEnv.opened == CalculatorEnv.closed == 1  # the one demonstration that calls
    trainer, result, before = one_step(config, model, tokenizer)
    # the tiny model's episodes all score the same here: PORTool's formatting reward is the step's only signal, so
    # a non-zero advantage is not required (assert_a_real_step's check), a real update is
    m = result.metrics
    assert all(math.isfinite(v) for v in m.values()) and m["tokens/trained"] > 0
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters() if p.requires_grad)
