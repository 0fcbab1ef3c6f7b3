"""examples/sqlite-shop ("bring your own agent", issue 15): its data, its tool, its environment, and run.sh itself.

The example's own files are used as a user runs them: make_data.py writes the database and the JSONL task,
shop_env.ShopEnv is loaded through ``tools.environment`` (shop_tools.query, the same tool as a plain function,
through ``tools.functions``), and the configs are the example's YAML files with the tiny model's CPU-sized
settings on top. ``./run.sh`` runs whole, on the tiny model through its own override hook (``SET`` and the size
variables), as a user runs it (issue 54: a pipeline re-assembled here in Python missed that the script stopped
at carl-segment's gate).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sqlite-shop"

# the tiny model's CPU-sized settings (tests/train/train_helpers.py); the example's token caps are kept, since
# its gold calls are up to 76 tokens long
TINY = ["model.name=tiny", "rollout.prompts_per_step=2", "rollout.n=3", "train.tensorboard=false"]
FITTED_KINDS = ("price_of_product", "customers_in_city")  # short calls: the tiny model learns them fast


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"sqlite_shop_{name}", EXAMPLE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _load("make_data").make_data(tmp_path_factory.mktemp("shop") / "data")


@pytest.fixture
def shop(data, monkeypatch):
    """The example as configured: shop_tools importable (PYTHONPATH=. in run.sh), the test's database."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.setenv("SHOP_DB", str(data["db"]))
    return data


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def config(name: str, data, *overrides):
    from agentcredit.config import load_config

    task = f"task.name=jsonl:{data['db'].parent}/{{split}}.jsonl"
    return load_config(EXAMPLE / f"{name}.yaml", [task, *TINY, *overrides])


def test_the_data_is_deterministic_and_the_splits_ask_different_questions(data, tmp_path):
    again = _load("make_data").make_data(tmp_path / "again")
    for split in ("train", "test"):
        assert again[split].read_bytes() == data[split].read_bytes()
    import sqlite3

    dumps = [list(sqlite3.connect(p["db"]).iterdump()) for p in (data, again)]
    assert dumps[0] == dumps[1] and len(dumps[0]) > 200  # 3 tables, 224 rows
    train, test = rows(data["train"]), rows(data["test"])
    assert len(train) == 142 and len(test) == 48
    asked = {(r["kind"], r["demo_calls"][0][0]["arguments"]["sql"]) for r in train}
    assert not asked & {(r["kind"], r["demo_calls"][0][0]["arguments"]["sql"]) for r in test}
    assert {r["tier"] for r in test} == {"one-table", "join"}


def test_the_tool_answers_the_gold_sql_and_is_read_only(shop):
    from agentcredit.tools.base import ToolCall, ToolRuntime
    from agentcredit.tools.functions import function_tools

    (tool,) = function_tools(["shop_tools:query"])
    assert tool.schema["function"]["parameters"]["required"] == ["sql"]
    for row in rows(shop["train"]) + rows(shop["test"]):
        result = tool(row["demo_calls"][0][0]["arguments"])
        assert result.splitlines()[1] == row["answers"][0], row
    runtime = ToolRuntime({"query": tool})
    update, bad = runtime.run(
        [
            ToolCall("query", {"sql": "UPDATE products SET price = 0"}),
            ToolCall("query", {"query": "SELECT 1"}),
        ]
    )
    assert update.output == "ERROR: attempt to write a readonly database" and not update.ok
    assert bad.output.startswith("ERROR: query: invalid arguments") and not bad.ok
    assert tool({"sql": "SELECT MIN(price) FROM products"}).splitlines()[1] != "0"  # nothing was written
    assert "more than 20 rows" in tool({"sql": "SELECT * FROM orders"})


def test_a_missing_database_stops_the_run_instead_of_training_on_errors(shop, monkeypatch, tmp_path):
    from agentcredit.tools.base import ToolCall, ToolRuntime
    from agentcredit.tools.functions import function_tools

    monkeypatch.setenv("SHOP_DB", str(tmp_path / "none.db"))
    (result,) = ToolRuntime({"query": function_tools(["shop_tools:query"])[0]}).run(
        [ToolCall("query", {"sql": "SELECT 1"})]
    )
    assert result.infra and "run make_data.py first" in result.output


def test_the_environment_shows_the_same_tool_and_keeps_one_connection_per_episode(shop):
    from agentcredit.tasks import load_examples
    from agentcredit.tools.base import ToolCall
    from agentcredit.tools.episodes import EpisodeEnvironments
    from agentcredit.tools.functions import function_tools

    envs = EpisodeEnvironments("shop_env:ShopEnv", {"error_reward": -0.1})
    (tool,) = function_tools(["shop_tools:query"])
    assert envs.schemas == [tool.schema]  # the same prompt whichever of the two shop.yaml names
    example = load_examples(config("grpo", shop), limit=1)[0]
    session = envs.open(example)
    db = session.env.db
    gold = example.info["demo_calls"][0][0]["arguments"]
    good = session.step([ToolCall("query", gold)])
    assert good.results[0].output.splitlines()[1] == example.answers[0] and good.reward == 0.0
    bad = session.step([ToolCall("query", {"sql": "UPDATE products SET price = 0"})])
    assert bad.results[0].output == "ERROR: attempt to write a readonly database" and bad.reward == -0.1
    assert session.env.db is db  # one connection for the episode
    session.close()
    assert session.closed


def test_a_missing_database_stops_the_environment_with_the_setup_step(shop, monkeypatch, tmp_path):
    from agentcredit.tasks import load_examples
    from agentcredit.tools.base import ToolUnavailableError
    from agentcredit.tools.episodes import EpisodeEnvironments

    monkeypatch.setenv("SHOP_DB", str(tmp_path / "none.db"))
    example = load_examples(config("grpo", shop), limit=1)[0]
    with pytest.raises(ToolUnavailableError, match="run make_data.py first"):
        EpisodeEnvironments("shop_env:ShopEnv").open(example)


@pytest.fixture
def demos(shop):
    """The chat-protocol demonstrations of three training questions, played through the example's tool."""
    from agentcredit.environment import build_environment
    from agentcredit.models.loading import load_base_model
    from agentcredit.tasks import load_examples
    from agentcredit.train.sft import demonstrations

    cfg = config("grpo", shop)
    examples = load_examples(cfg, limit=3)
    _, tokenizer = load_base_model("tiny", seed=0)
    env = build_environment(cfg)
    try:
        return examples, demonstrations(env, tokenizer, examples, cfg.protocol.name)
    finally:
        env.close()


def test_sft_demonstrations_call_the_tool_in_the_chat_format(demos):
    examples, trees = demos
    assert len(trees) == len(examples)  # every demonstration was correct
    for example, tree in zip(examples, trees, strict=True):
        segments = [tree.segment(i) for i in range(len(tree)) if tree.segment(i).role != "prompt"]
        assert [s.kind for s in segments if s.role == "policy"] == ["invoke", "commit"]
        sql = example.info["demo_calls"][0][0]["arguments"]["sql"]
        assert "<tool_call>" in segments[0].text and json.dumps(sql) in segments[0].text
        assert example.answers[0] in segments[1].text  # the tool's result, in a tool turn
        assert segments[2].text.startswith(example.answers[0]) and max(tree.rewards().values()) == 1.0


def length_parity_reward(data_source, solution_str, ground_truth, extra_info) -> float:
    """The training-step tests' reward (task.reward): a random tiny model answers no shop question, so the
    parity of the response's length gives the groups mixed rewards and GRPO's update something to move."""
    return float(len(solution_str) % 2)


@pytest.mark.parametrize("method", ["grpo", "carl-segment"])
def test_one_training_step_of_each_method(method, shop):
    from agentcredit.tasks import load_examples
    from agentcredit.train.trainer import Trainer

    cfg = config(method, shop, f"task.reward={__name__}:length_parity_reward", "rollout.max_new_tokens=24")
    trainer = Trainer(cfg, examples=load_examples(cfg, limit=2), log=False)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    try:
        result = trainer.train_step()
    finally:
        trainer.close()
    m = result.metrics
    assert all(math.isfinite(v) for v in m.values()), {k: v for k, v in m.items() if not math.isfinite(v)}
    assert m["adv/nonzero_frac"] > 0 and m["tokens/trained"] > 0
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters() if p.requires_grad)
    assert (trainer.value_head is None) == (method == "grpo")


# run.sh's override hook, sized for the tiny model: every stage runs, each in a few seconds of CPU
TINY_RUN = {
    "SET": "model.name=tiny task.eval_limit=2 rollout.max_new_tokens=16 rollout.prompts_per_step=1 rollout.n=2 "
    "train.tensorboard=false",
    "SFT_EXAMPLES": "2",
    "SFT_EPOCHS": "1",
    "WARMUP_QUESTIONS": "4",
    "STEPS": "1",
    "OUT": "runs/tiny",
}


def run_sh(folder: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": f"{EXAMPLE.parents[1]}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "OMP_NUM_THREADS": "1",
        **TINY_RUN,
        **env,
    }
    environ.pop("SHOP_DB", None)  # the script's own data/shop.db
    return subprocess.run(["./run.sh"], cwd=folder, env=environ, capture_output=True, text=True)


@pytest.mark.slow
def test_run_sh_runs_to_its_end_and_says_carl_segment_started_on_a_failed_gate(tmp_path):
    """./run.sh as a user runs it, in a copy of the example folder. No shop question is answered without the tool,
    so carl-segment's gate cannot pass (AUC undefined): carl-segment runs on it by the script's explicit choice,
    and the run's table and record say so; ALLOW_FAILED_GATE=false stops there with the gate's words."""
    folder = tmp_path / "sqlite-shop"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("data", "runs", "__pycache__"))
    done = run_sh(folder)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    out = folder / "runs" / "tiny"
    table = (out / "table.md").read_text()
    assert "| accuracy |" in table and "after carl-segment" in table
    assert "carl-segment started on a FAILED critic warm-up gate, by choice (ALLOW_FAILED_GATE)" in table
    assert (
        "auc undefined: all 4 warm-up questions were Tier 1" in table and "nan" not in table.split("\n\n")[1]
    )
    warm = json.loads((out / "start-model" / "warmup_summary.json").read_text())
    assert set(warm["buckets"]) == {"tier1/forced", "tier1/no_tool"}  # the chat protocol's two prompt modes
    assert json.loads((out / "carl-segment" / "warmup_gate.json").read_text())["allowed_failed"]
    assert (out / "report" / "report.md").is_file()
    # a rerun continues: finished stages are skipped; carl-segment again, now obeying the gate
    shutil.rmtree(out / "carl-segment")
    stopped = run_sh(folder, ALLOW_FAILED_GATE="false")
    assert stopped.returncode == 2, stopped.stdout[-4000:] + stopped.stderr[-4000:]
    assert "== sft: done before" in stopped.stdout
    assert "the critic warm-up gate failed (auc undefined" in stopped.stdout + stopped.stderr
