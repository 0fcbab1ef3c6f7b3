"""The CPU-checkable parts of ``scripts/verl_gpu_check.py`` (issue 36): the GPU run itself has not happened.

Checked here: its arguments; the random two-layer Qwen2 it builds (loads back, finite logits); its data rows as
the agent loop reads them; every method's config composed with its one-GPU overrides and accepted by verl's own
``validate_config`` and agentcredit's trainer checks (``--dry-run``); its scripted server's answers; its rollout
backend's registration in verl's registries; and the per-step check (finite losses, agentcredit fields).
"""

from __future__ import annotations

import asyncio
import importlib
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")

pytestmark = pytest.mark.verl

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture(scope="module")
def check():
    sys.path.insert(0, str(SCRIPTS))
    try:
        yield importlib.import_module("verl_gpu_check")
    finally:
        sys.path.remove(str(SCRIPTS))


@pytest.fixture(scope="module")
def model(check, tmp_path_factory):
    return check.build_model(tmp_path_factory.mktemp("gpu-check") / "tiny-qwen2")


def test_arguments(check):
    args = check.parse_args(["--methods", "grpo, ppo", "--steps", "3"])
    assert args.methods == ["grpo", "ppo"] and args.steps == 3 and not args.dry_run
    assert check.parse_args([]).methods == ["carl-segment", "grpo", "ppo"]
    with pytest.raises(SystemExit):
        check.parse_args(["--methods", "gear"])


def test_tiny_qwen2_loads_back_with_two_layers(check, model):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    net = AutoModelForCausalLM.from_pretrained(model)
    tok = AutoTokenizer.from_pretrained(model)
    assert net.config.model_type == "qwen2" and net.config.num_hidden_layers == 2
    ids = tok("who wrote X", return_tensors="pt")["input_ids"]
    assert tok.decode(ids[0]) == "who wrote X"  # byte-level: exact round trip
    with torch.no_grad():
        logits = net(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok)) and torch.isfinite(logits).all()


@pytest.mark.parametrize("method", ["carl-segment", "grpo", "ppo"])
def test_one_gpu_configs_pass_verls_and_agentcredits_validation(check, model, tmp_path, method, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    data = check.write_data(tmp_path / "d.parquet", *check.protocol_of(method))
    cfg = check.compose_config(method, model, data, tmp_path, steps=2)
    assert cfg.actor_rollout_ref.rollout.name == check.SCRIPTED and cfg.trainer.n_gpus_per_node == 1
    assert cfg.agentcredit.method == method
    # issue 51: 2 questions at batch 2 are one step per epoch, and total_epochs defaulted to 1: --steps 2 ran one
    assert cfg.trainer.total_training_steps == 2 == cfg.trainer.total_epochs
    assert cfg.data.train_batch_size == len(check.QUESTIONS)
    env = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert env.VERL_USE_EXTERNAL_MODULES == "agentcredit.integrations.verl.register,verl_gpu_check"
    assert env.PYTHONPATH.split(":")[-1] == "/somewhere/else"  # appended to, not overwritten
    # issue 51: max_prompt_length=256 was below every prompt (596 / 299 tokens): verl's filter left no row
    assert check.check_dataset(cfg) == len(check.QUESTIONS)


def test_dry_run_builds_and_validates_every_method(check, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert check.main(["--dry-run", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("DRY-RUN")]
    assert [line.split()[1] for line in lines] == ["carl-segment:", "grpo:", "ppo:"]
    assert all("2 prompts" in line and "2 steps" in line for line in lines)


def test_data_rows_are_what_the_agent_loop_reads(check, tmp_path):
    import pyarrow.parquet as pq

    from agentcredit.integrations.verl.agent_loop import sample_fields

    rows = pq.read_table(check.write_data(tmp_path / "d.parquet", *check.protocol_of("grpo"))).to_pylist()
    messages, question, golds = sample_fields({"raw_prompt": rows[0]["prompt"], **rows[0]})
    assert question == "who wrote X" and golds == ["Jane Doe"] and messages[-1]["role"] == "user"


@pytest.mark.parametrize("protocol", ["tags", "codefence"])
def test_scripted_server_calls_a_tool_then_answers(check, model, protocol):
    """issue 51: the server walked its script per request id, but verl gives every call a fresh id: every turn was
    turn 0, no episode answered, every reward 0, and the check would still have printed OK. The turn is read from
    the prompt; here every call has a fresh id, as from verl, and two episodes interleave."""
    server = check.ScriptedModel(str(model), protocol)
    tok = server.tok
    prompt = tok.encode("<|im_start|>user\nwho wrote X<|im_end|>\n<|im_start|>assistant\n")
    params = {"max_new_tokens": 64, "logprobs": True}
    fresh = iter(range(100))

    async def turn(context):
        out = await server.generate(context, params, f"uuid-{next(fresh)}")
        return context + out.token_ids + tok.encode("\nobservation\n"), tok.decode(
            out.token_ids, skip_special_tokens=True
        )

    async def two_episodes():
        a, b, texts = list(prompt), list(prompt), ([], [])
        for _ in range(len(check.SCRIPTS[protocol])):
            a, t = await turn(a)
            texts[0].append(t)
            b, t = await turn(b)
            texts[1].append(t)
        return texts

    right, wrong = asyncio.run(two_episodes())
    first, *rest = check.SCRIPTS[protocol]
    assert right == [first[0], *rest[:-1], rest[-1].format(answer="Jane Doe")]
    assert wrong == [first[1], *rest[:-1], rest[-1].format(answer="nobody")]  # groups have variance
    assert server.turns == [t for t in range(len(check.SCRIPTS[protocol])) for _ in range(2)]


def test_scripted_backend_is_registered_in_verl(check):
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    assert get_rollout_replica_class(check.SCRIPTED) is check.ScriptedReplica
    assert get_rollout_class(check.SCRIPTED, "async") is check.ScriptedRollout


def test_step_check_prints_losses_and_fields_and_refuses_bad_ones(check):
    lines = check.check_step("grpo", 1, {"actor/pg_loss": 0.25, "agentcredit/episodes": 10.0, "perf/x": 1.0})
    assert lines == [
        "CHECK grpo step 1 actor/pg_loss = 0.25",
        "CHECK grpo step 1 agentcredit/episodes = 10",
    ]
    with pytest.raises(RuntimeError, match="not finite"):
        check.check_step("ppo", 2, {"critic/vf_loss": math.nan})
    with pytest.raises(RuntimeError, match="no loss"):
        check.check_step("ppo", 2, {"agentcredit/episodes": 1.0})
