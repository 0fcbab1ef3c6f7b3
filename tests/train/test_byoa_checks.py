"""Bringing your own agent (issue 35): demo_calls checked against the tools' schemas before any work, errors of
your own code (environment, reward, a tool a demonstration calls) as one line with exit 2, and the episode cap
warning when demonstrations need more messages than it allows. A small warehouse task (``stock``, ``price``)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentcredit.cli import app
from agentcredit.tasks import Example
from agentcredit.train.demos import check_demo_calls

WAREHOUSE = textwrap.dedent(
    '''
    """The test's warehouse: two stateless tools, environments and rewards, some of them broken on purpose."""
    from agentcredit.tools.episodes import ToolEnv

    STOCK = {"bolt": 40, "nut": 12}


    def stock(item: str) -> str:
        """Units of an item in stock.

        Args:
            item: the item's name
        """
        return str(STOCK[item])  # KeyError for an item the warehouse does not keep


    def price(item: str, quantity: int = 1) -> str:
        """Price of some units of an item, in cents.

        Args:
            item: the item's name
            quantity: how many units
        """
        return str(3 * quantity)


    class WarehouseEnv(ToolEnv):
        tools = ("stock",)

        def stock(self, item: str) -> str:
            """Units of an item in stock.

            Args:
                item: the item's name
            """
            return str(STOCK[item])


    class TwoTupleEnv(WarehouseEnv):
        def step(self, calls):
            observations, done, _ = super().step(calls)
            return observations, done  # the wrong shape: no reward


    def raising_reward(data_source, solution_str, ground_truth, extra_info):
        return {"score": extra_info["no_such_field"]}
    '''
)


@pytest.fixture
def warehouse(tmp_path: Path, monkeypatch) -> Path:
    module = f"warehouse_{tmp_path.name.replace('-', '_')}"  # one module per test: its own classes
    (tmp_path / f"{module}.py").write_text(WAREHOUSE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / module


def write_task(path: Path, demo_calls: list) -> Path:
    rows = [
        {"question": "How many bolts are in stock?", "answers": ["40"],
         "demo_calls": [[{"name": "stock", "arguments": {"item": "bolt"}}]]},
        {"question": "How many nuts are in stock?", "answers": ["12"], "demo_calls": demo_calls},
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_config(warehouse: Path, task: Path, *extra: str) -> Path:
    module = warehouse.name
    lines = [
        "base: grpo",
        "model: {name: tiny}",
        f"task: {{name: 'jsonl:{task}'}}",
        "protocol: {name: chat}",
        f"tools: {{functions: ['{module}:stock', '{module}:price']}}",
        "train: {tensorboard: false}",
        *extra,
    ]
    config = warehouse.parent / "warehouse.yaml"
    config.write_text("\n".join(lines) + "\n")
    return config


def sft(config: Path, out: Path):
    return CliRunner().invoke(
        app, ["sft", "--out", str(out), "--config", str(config), "--examples", "2", "--epochs", "1"]
    )


def one_error_line(result) -> str:
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2, result.output
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    return errors[0]


SCHEMAS = [
    {"type": "function", "function": {"name": "stock", "parameters": {
        "type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]}}},
    {"type": "function", "function": {"name": "price", "parameters": {
        "type": "object", "properties": {"item": {"type": "string"}, "quantity": {"type": "integer"}},
        "required": ["item"]}}},
]  # fmt: skip


def ex(calls, ident="w1") -> Example:
    return Example(ident, "How many nuts?", ["12"], "jsonl:w.jsonl", {"demo_calls": calls})


@pytest.mark.parametrize(
    ("calls", "message"),
    [
        ([[{"name": "stok", "arguments": {"item": "nut"}}]], r"demo_calls\[0\]\[0\] stok\(.*no tool is named 'stok' \(tools: price, stock\)"),
        ([[{"name": "stock", "arguments": {"itm": "nut"}}]], r"demo_calls\[0\]\[0\] stock.*\['itm'\] are not parameters of stock \(it takes \['item'\]\)"),
        ([[{"name": "price", "arguments": {"quantity": 2}}]], r"demo_calls\[0\]\[0\] price.*'item' is a required property"),
        ([{"name": "stock", "arguments": {"item": "nut"}}, [{"name": "price", "arguments": {"item": "nut", "quantity": "two"}}]],
         r"demo_calls\[1\]\[0\] price.*invalid arguments \(argument 'quantity'\): 'two' is not of type 'integer'"),
        ("stock", r"demo_calls must be a list of turns"),
    ],
)  # fmt: skip
def test_bad_demo_calls_name_the_file_line_and_call(calls, message):
    with pytest.raises(ValueError, match=rf"^w.jsonl line 7 \(example 'w1'\): .*{message}"):
        check_demo_calls([ex(calls)], SCHEMAS, locate={"w1": "w.jsonl line 7"})


def test_good_demo_calls_pass_and_every_bad_row_is_counted():
    good = [
        [{"name": "stock", "arguments": {"item": "nut"}}, {"name": "price", "arguments": {"item": "nut"}}]
    ]
    assert check_demo_calls([ex(good), ex(None, "w2")], SCHEMAS) == []
    bad = [[{"name": "stok", "arguments": {}}]]
    with pytest.raises(ValueError, match=r"^example 'w1': .*stok.*\(and 2 more bad demo_calls\)$"):
        check_demo_calls([ex(bad), ex(bad, "w2"), ex(bad, "w3"), ex(good, "w4")], SCHEMAS)


def test_a_demonstration_longer_than_the_episode_cap_is_warned_about():
    calls = [[{"name": "stock", "arguments": {"item": "nut"}}]] * 3  # 3 tool turns + the answer = 4 messages
    (line,) = check_demo_calls([ex(calls)], SCHEMAS, max_messages=3)
    assert "need 4 assistant messages" in line and "capped at 3" in line and "rollout.max_turns" in line
    assert check_demo_calls([ex(calls)], SCHEMAS, max_messages=4) == []


def test_a_demonstration_whose_calls_end_the_episode_needs_no_answer_message():
    # regression: BFCL's questions (episode_options.calls_end_episode) are one message, the calls; the cap check
    # counted an answer message after them and warned about every BFCL demonstration that SFT then kept
    calls = [[{"name": "stock", "arguments": {"item": "nut"}}]]
    ending = Example("b1", "How many nuts?", [], "bfcl:simple_python",
                     {"demo_calls": calls, "episode_options": {"calls_end_episode": True}})  # fmt: skip
    assert check_demo_calls([ending], SCHEMAS, max_messages=1) == []
    two = Example("b2", "How many nuts?", [], "bfcl:simple_python",
                  {"demo_calls": calls * 2, "episode_options": {"calls_end_episode": True}})  # fmt: skip
    (line,) = check_demo_calls([two], SCHEMAS, max_messages=1)
    assert (
        "need 2 assistant messages (2 tool turns, the last ending the episode)" in line
        and "capped at 1" in line
    )


def test_sft_stops_on_a_bad_demo_call_before_loading_the_model(warehouse, tmp_path):
    task = write_task(tmp_path / "train.jsonl", [[{"name": "stock", "arguments": {"itm": "nut"}}]])
    out = tmp_path / "sft"
    result = sft(write_config(warehouse, task), out)
    line = one_error_line(result)
    assert f"{task} line 2 (example 'train-2')" in line and "['itm'] are not parameters of stock" in line
    assert "SFT on" not in result.output and not out.exists()


def test_a_demo_call_that_errors_is_no_demonstration(warehouse, tmp_path):
    # valid by the schema, but the tool raises: the ERROR: observation must not become an SFT target
    task = write_task(tmp_path / "train.jsonl", [[{"name": "stock", "arguments": {"item": "washer"}}]])
    out = tmp_path / "sft"
    line = one_error_line(sft(write_config(warehouse, task), out))
    assert f"{task} line 2 (example 'train-2')" in line and 'stock({"item": "washer"})' in line
    assert "KeyError" in line and "must not teach an error" in line and not out.exists()


def test_an_environment_step_of_the_wrong_shape_exits_2_naming_it(warehouse, tmp_path):
    task = write_task(tmp_path / "train.jsonl", [[{"name": "stock", "arguments": {"item": "nut"}}]])
    config = write_config(warehouse, task, f"tools: {{environment: '{warehouse.name}:TwoTupleEnv'}}")
    text = config.read_text().replace(
        f"tools: {{functions: ['{warehouse.name}:stock', '{warehouse.name}:price']}}\n", ""
    )
    config.write_text(text)
    line = one_error_line(sft(config, tmp_path / "sft"))
    assert f"{warehouse.name}:TwoTupleEnv.step on example 'train-1' returned" in line
    assert "expected (observations, done, reward)" in line


def test_a_reward_that_raises_exits_2_naming_it_and_the_example(warehouse, tmp_path):
    task = write_task(tmp_path / "train.jsonl", [[{"name": "stock", "arguments": {"item": "nut"}}]])
    config = write_config(warehouse, task)
    config.write_text(
        config.read_text().replace("task: {", f"task: {{reward: '{warehouse.name}:raising_reward', ")
    )
    line = one_error_line(sft(config, tmp_path / "sft"))
    assert f"task.reward {warehouse.name}:raising_reward on example 'train-1' raised KeyError" in line


def test_sft_warns_about_a_demonstration_the_episode_cap_cuts(warehouse, tmp_path):
    two_turns = [
        [{"name": "stock", "arguments": {"item": "nut"}}],
        [{"name": "price", "arguments": {"item": "nut"}}],
    ]
    task = write_task(tmp_path / "train.jsonl", two_turns)  # row 1: 2 messages, row 2: 3 messages
    config = write_config(warehouse, task, "rollout: {max_turns: 2}")
    config.write_text(
        config.read_text().replace(
            "protocol: {name: chat}", "protocol: {name: chat, options: {max_segments: 2}}"
        )
    )
    result = sft(config, tmp_path / "sft")
    assert result.exit_code == 0, result.output
    warned = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and f"{task} line 2 (example 'train-2')" in warned[0], result.output
    assert "need 3 assistant messages" in warned[0] and "capped at 2" in warned[0]
    assert "SFT on 1 episodes" in result.output  # the cut demonstration has no answer: dropped, not trained


def test_two_different_caps_warn_once_at_build_and_the_smaller_applies(warehouse, tmp_path):
    from agentcredit.config import load_config
    from agentcredit.environment import build_environment
    from agentcredit.protocols.base import EpisodeCapWarning, episode_cap

    task = write_task(tmp_path / "train.jsonl", [[{"name": "stock", "arguments": {"item": "nut"}}]])
    config = load_config(
        write_config(warehouse, task), ["protocol.options.max_segments=3", "rollout.max_turns=8"]
    )
    with pytest.warns(
        EpisodeCapWarning,
        match=r"rollout.max_turns=8 and protocol.options.max_segments=3 .* the smaller, 3, applies",
    ):
        build_environment(config).close()
    assert episode_cap(8, 3) == episode_cap(3, 8) == 3 and episode_cap(None, 5) == 5


def test_no_preset_has_two_different_caps():
    import warnings

    from agentcredit.config import load_config, preset_names
    from agentcredit.protocols import get_protocol
    from agentcredit.protocols.base import warn_on_two_caps

    warned = {}
    for name in preset_names():
        config = load_config(
            name
        )  # every preset loads (carl-segment-bfcl once merged codefence options into chat)
        options = dict(config.protocol.options)
        if config.protocol.name == "chat":
            options.setdefault("schemas", [])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warn_on_two_caps(
                config.rollout.max_turns, get_protocol(config.protocol.name, **options).max_segments, True
            )
        if caught:
            warned[name] = [str(w.message) for w in caught]
    assert warned == {}, warned
