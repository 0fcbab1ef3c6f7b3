"""The trainer's advantage step: what it reads from TransferQueue, and what it writes back.

TransferQueue needs a running Ray cluster with its storage actors, which does not start within a CPU test's
budget here, so the step runs against an in-memory stand-in with the same three calls (``kv_batch_get`` with
``select_fields``, ``kv_batch_put`` of a TensorDict) that stores rows in verl's own nested layout
(``list_of_dict_to_tensordict``). The trainer is built by its real constructor, which starts no worker (verl's
``init()`` does); the sync-path test runs ``init()`` too, up to where it would start the Ray worker groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

pytest.importorskip("verl")

from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from transformers import LlamaConfig  # noqa: E402
from verl.single_controller.ray import ResourcePoolManager  # noqa: E402
from verl.trainer.ppo.padding_utils import construct_minimal_padding_template  # noqa: E402
from verl.trainer.ppo.v1 import get_trainer_cls  # noqa: E402
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer  # noqa: E402
from verl.utils.tensordict_utils import list_of_dict_to_tensordict  # noqa: E402

import agentcredit.integrations.verl.trainer as trainer_module  # noqa: E402
from agentcredit.integrations.verl import TRAINER_NAME, config_dir  # noqa: E402
from agentcredit.integrations.verl.__main__ import main as verl_main  # noqa: E402
from agentcredit.integrations.verl.advantages import apply_to_dataproto  # noqa: E402
from agentcredit.integrations.verl.trainer import AgentCreditTrainer, check_trainer_config  # noqa: E402

from .test_verl_advantages import _carl_eps, build_batch, search_ep  # noqa: E402

pytestmark = pytest.mark.verl


@dataclass
class Meta:
    keys: list[str]
    partition_id: str = "train"
    tags: list[dict] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.keys)


class MemoryTQ:
    def __init__(self, rows: dict[str, dict]):
        self.rows = rows
        self.selected: list[list[str]] = []

    def kv_batch_get(self, keys, partition_id, select_fields):
        self.selected.append(list(select_fields))
        return list_of_dict_to_tensordict([{f: self.rows[k][f] for f in select_fields} for k in keys])

    def kv_batch_put(self, keys, partition_id, fields):
        for name in fields.keys():
            column = fields[name]
            if not isinstance(column, torch.Tensor):  # non-tensor data (extra_fields): a NonTensorStack
                values = column.tolist() if hasattr(column, "tolist") else list(column)
            else:
                values = column.unbind(0) if column.is_nested else list(column)
            for k, v in zip(keys, values, strict=True):
                self.rows[k][name] = v
        return Meta(list(keys), partition_id, [{} for _ in keys])


FIELDS = ("responses", "response_mask", "old_log_probs", "entropy", "values", "rollout_log_probs")


def _stored_rows(batch) -> dict[str, dict]:
    """The batch's rows back in TQ's per-row layout (unpadded tensors, extra_fields dict, uid)."""
    proto = batch.proto
    rows = {}
    for r in range(len(batch.row_of)):
        rec = proto.non_tensor_batch["agentcredit"][r]
        length = rec["spans"][-1]["end"]  # the row's unpadded response length
        rows[f"u{r}_0_0"] = {
            "uid": proto.non_tensor_batch["uid"][r],
            "extra_fields": {"agentcredit": rec, "turn_scores": []},
            **{f: proto.batch[f][r, :length].clone() for f in FIELDS},
        }
    return rows


def _trainer(cfg) -> AgentCreditTrainer:
    # the real constructor: it builds no worker (PPOTrainer.init, not called here, starts them)
    return AgentCreditTrainer(cfg)


def _compose_method(method: str):
    """The method's verl config: its paper recipe, else the generic config with agentcredit.method (issue 37)."""
    from agentcredit.integrations.verl import GENERIC_CONFIG, config_name

    name = config_name(method)
    return compose(name, overrides=[f"agentcredit.method={method}"] if name == GENERIC_CONFIG else [])


@pytest.mark.parametrize(
    ("method", "method_eps"),
    [
        ("carl-segment", _carl_eps),
        ("grpo", lambda: [search_ep("p0", 1.0), search_ep("p0", 0.0, 2, (3, 6, 2))]),
        # gigpo reads the response tokens (a step's anchor state); the trainer did not fetch them (issue 14)
        ("gigpo", lambda: [search_ep("p0", 1.0), search_ep("p0", 0.0, 2, (5, 4, 2)), search_ep("p0", 1.0)]),
        # a tree strategy: each row's own outcome goes back as its score (verl copies one onto all leaves)
        ("portool", lambda: [search_ep("p0", 1.0, fmt=[0.25, 0.0]), search_ep("p0", 0.0, fmt=[0.1, -0.2])]),
    ],
)
def test_advantage_step_reads_fields_and_writes_nested_advantages(monkeypatch, method, method_eps):
    with initialize_config_dir(str(config_dir()), version_base=None):
        cfg = _compose_method(method)  # gigpo: no recipe file, the generic config
    batch = build_batch(method_eps(), seed=5)
    rows = _stored_rows(batch)
    tags = [{"status": "success"} for _ in rows]
    # one synthetic row, made by verl's own padding helper from the first row (as _balance_batch does); the
    # fields computed after padding (log-probs, entropy, values) get its 1-token length
    first = next(iter(rows))
    pad, pad_tag = construct_minimal_padding_template(rows[first], tags[0], eos_token_id=0)
    for name in ("old_log_probs", "entropy", "values"):
        pad[name] = torch.zeros(1)
    rows["pad_0_0"], n_real = pad, len(rows)
    tags.append(pad_tag)
    memory = MemoryTQ(rows)
    monkeypatch.setattr(trainer_module, "tq", memory)
    trainer = _trainer(cfg)
    metrics: dict = {}
    out = trainer._compute_advantage(Meta(list(rows), tags=tags), metrics)

    assert set(memory.selected[0]) >= {"uid", "response_mask", "old_log_probs", "entropy", "extra_fields"}
    assert ("values" in memory.selected[0]) == (method == "carl-segment")
    assert ("responses" in memory.selected[0]) == (method == "gigpo")
    n_episodes = len(method_eps())
    assert out.keys == list(rows) and metrics["agentcredit/episodes"] == n_episodes  # padding is no episode

    # the same batch through the adapter directly
    reference = build_batch(method_eps(), seed=5)
    apply_to_dataproto(
        reference.proto, trainer.agentcredit
    )  # the config's settings (carl-segment: segment-mean)
    assert rows["pad_0_0"]["advantages"].tolist() == [0.0] and rows["pad_0_0"]["returns"].tolist() == [0.0]
    for r, key in enumerate(list(rows)[:n_real]):
        n = rows[key]["response_mask"].shape[0]
        torch.testing.assert_close(rows[key]["advantages"], reference.proto.batch["advantages"][r, :n])
        torch.testing.assert_close(rows[key]["returns"], reference.proto.batch["returns"][r, :n])
        if method == "portool":
            outcome = rows[key]["extra_fields"]["agentcredit"]["outcome"]
            assert rows[key]["rm_scores"].tolist() == [0.0] * (n - 1) + [outcome]
        else:
            assert "rm_scores" not in rows[key]


@pytest.mark.parametrize(
    ("config_name", "method_eps"),
    [
        ("carl_segment", _carl_eps),
        ("grpo", lambda: [search_ep("p0", 1.0), search_ep("p0", 0.0, 2, (3, 6, 2))]),
    ],
)
def test_rollout_rejection_keeps_the_credit_and_masks_the_rejected_tokens(
    monkeypatch, config_name, method_eps
):
    """verl's rollout correction zeroes rejected tokens of response_mask before the advantage step sees it."""
    rs = [
        "algorithm.rollout_correction.rollout_rs=token_k2",
        "algorithm.rollout_correction.rollout_rs_threshold=2.0",
    ]
    with initialize_config_dir(str(config_dir()), version_base=None):
        cfg = compose(config_name, overrides=rs)
    rows = _stored_rows(build_batch(method_eps(), seed=5))
    rejected = {}  # row key -> positions of policy tokens where the actor disagrees with the rollout engine
    for r, (key, row) in enumerate(rows.items()):
        row["old_log_probs"] = row["rollout_log_probs"].clone()
        if r < 2:
            on = row["response_mask"].nonzero().flatten().tolist()
            rejected[key] = [on[0], on[-1]] if r == 0 else [on[len(on) // 2]]
            row["old_log_probs"][rejected[key]] -= 5.0  # k2 = 12.5 > 2.0: rejected; the others have k2 = 0
    generated = {key: row["response_mask"].clone() for key, row in rows.items()}
    monkeypatch.setattr(trainer_module, "tq", MemoryTQ(rows))
    metrics: dict = {}
    _trainer(cfg)._compute_advantage(Meta(list(rows), tags=[{} for _ in rows]), metrics)

    reference = build_batch(method_eps(), seed=5)  # the credit of the batch as generated
    apply_to_dataproto(reference.proto, check_trainer_config(cfg))
    for r, (key, row) in enumerate(rows.items()):
        kept = generated[key].clone()
        kept[rejected.get(key, [])] = 0
        assert torch.equal(row["response_mask"], kept)  # verl's corrected mask, written back for the update
        n = kept.shape[0]
        torch.testing.assert_close(row["advantages"], reference.proto.batch["advantages"][r, :n] * kept)
        torch.testing.assert_close(row["returns"], reference.proto.batch["returns"][r, :n] * kept)
        # the rejected tokens had credit to lose (the check above would pass vacuously on zeros)
        assert all(reference.proto.batch["advantages"][r, p] != 0 for p in rejected.get(key, []))
    assert metrics["agentcredit/episodes"] == 2


class _WorkerStart(Exception):
    """Raised where verl would start the Ray worker groups: the real set-up runs up to that point."""


def _tiny_model_dir(path, tokenizer):
    """A model directory with the byte tokenizer and a tiny Llama config (verl's HFModelConfig reads both)."""
    tokenizer.save_pretrained(path)
    LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        architectures=["LlamaForCausalLM"],
    ).save_pretrained(path)
    return path


@pytest.mark.parametrize("config_name", ["grpo", "portool"])
def test_trainer_runs_verls_sync_path(config_name, tmp_path, monkeypatch, byte_tokenizer):
    """main_ppo picks the class by trainer_mode=agentcredit; verl's set-up must then take its sync branches.
    Under a tree strategy (portool) each prompt goes to one agent-loop session, which grows its whole tree."""
    questions = tmp_path / "qa.jsonl"
    questions.write_text(
        "".join(f'{{"id": "q{i}", "question": "who wrote X{i}", "answers": ["A{i}"]}}\n' for i in range(8))
    )
    data = tmp_path / "data"
    prepare = [
        "prepare-data",
        "--method",
        config_name,  # the method (its recipe's name here): its protocol renders the prompts
        "--train",
        f"jsonl:{questions}",
        "--val",
        f"jsonl:{questions}",
        "--out",
        str(data),
    ]
    assert verl_main(prepare) == 0
    model = _tiny_model_dir(tmp_path / "model", byte_tokenizer)
    with initialize_config_dir(str(config_dir()), version_base=None):
        cfg = compose(
            config_name,
            overrides=[
                f"actor_rollout_ref.model.path={model}",
                f"data.train_files={data / 'train.parquet'}",
                f"data.val_files={data / 'val.parquet'}",
                "data.train_batch_size=4",
                "data.val_batch_size=4",
                "data.dataloader_num_workers=0",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                # PORTool's prompt lists its 17 tools' schemas: one byte-level token per byte here
                "data.max_prompt_length=32768",
            ],
        )
    assert cfg.trainer.v1.trainer_mode == TRAINER_NAME

    def worker_start(self):
        raise _WorkerStart

    monkeypatch.setattr(ResourcePoolManager, "create_resource_pool", worker_start)
    # as verl's TaskRunnerV1.run: look the class up by trainer_mode, resolve, construct, init
    trainer_cls = get_trainer_cls(cfg.trainer.v1.trainer_mode)
    OmegaConf.resolve(cfg)
    trainer = trainer_cls(config=cfg)
    with pytest.raises(_WorkerStart):
        trainer.init()

    assert trainer_cls is AgentCreditTrainer
    assert type(trainer.replay_buffer) is ReplayBuffer  # not ReplayBufferAsync
    # the async path fetches prompts one at a time (it forces data.gen_batch_size=1)
    assert trainer.train_dataloader.batch_size == 4 and trainer.replay_buffer.gen_batch_size == 4
    # every other branch (TransferQueue checkpoints, prompt submission) reads the mode verl stored
    assert trainer.trainer_mode == trainer.replay_buffer.trainer_mode == "sync"
    assert trainer.parameter_sync_step == 1
    batch = trainer._fetch_one_gen_batch()
    if config_name == "portool":
        assert batch["__rollout_n__"].tolist() == [1, 1, 1, 1]  # verl's sessions per prompt
    else:
        assert "__rollout_n__" not in batch.keys()


def test_the_trainer_refuses_data_written_for_another_protocol(tmp_path, byte_tokenizer):
    """issue 51: prepare-data used to render every method's prompts with the tags protocol; carl-segment parses code
    fences, so its episodes were scored ~0 with no error. The trainer reads each file's recorded protocol first."""
    questions = tmp_path / "qa.jsonl"
    questions.write_text('{"id": "q0", "question": "who wrote X", "answers": ["A"]}\n')
    data = tmp_path / "data"
    args = [
        "prepare-data",
        "--method",
        "grpo",
        "--train",
        f"jsonl:{questions}",
        "--val",
        "",
        "--out",
        str(data),
    ]
    assert verl_main(args) == 0
    with initialize_config_dir(str(config_dir()), version_base=None):
        cfg = compose(
            "carl_segment", overrides=[f"data.train_files={data / 'train.parquet'}", "data.val_files=null"]
        )
    OmegaConf.resolve(cfg)
    trainer = AgentCreditTrainer(config=cfg)
    with pytest.raises(
        ValueError, match=r"train\.parquet: prompts rendered for protocol .*tags.* parse .*codefence"
    ):
        trainer._init_dataloader()  # before verl reads the files
    assert verl_main([*args[:2], "carl-segment", *args[3:]]) == 0  # written for the method: accepted
    import pyarrow.parquet as pq

    from agentcredit.integrations.verl.data import check_data_files

    check_data_files(str(data / "train.parquet"), "codefence", {})
    assert "\\boxed{}" in pq.read_table(data / "train.parquet").to_pylist()[0]["prompt"][0]["content"]


def test_a_tree_needs_rollout_n_equal_to_its_leaves():
    with initialize_config_dir(str(config_dir()), version_base=None):
        cfg = compose("carl_critical", overrides=["actor_rollout_ref.rollout.n=16"])
    with pytest.raises(ValueError, match=r"grows 17 leaves per prompt .* set actor_rollout_ref.rollout.n=17"):
        trainer_module.check_trainer_config(cfg)


def test_gear_teacher_logprobs_travel_as_a_tensor_field(monkeypatch):
    """issue 36: GEAR's teacher log-probs were per-token Python lists in extra_fields, which verl hands to every
    worker call. Right after the rollout (_balance_batch) the trainer moves them into a tensor field and takes
    them out of the records; the advantage step reads the field and gives what the records gave."""
    with initialize_config_dir(str(config_dir()), version_base=None):
        cfg = compose("gear")
    eps = [search_ep("p0", 1.0), search_ep("p0", 0.0, 2, (3, 6, 2)), search_ep("p0", 1.0)]
    batch = build_batch(eps, seed=3, with_teacher=True)
    rows = _stored_rows(batch)
    memory = MemoryTQ(rows)
    monkeypatch.setattr(trainer_module, "tq", memory)
    trainer = _trainer(cfg)
    keys = list(rows)
    trainer._move_teacher_logprobs(Meta(keys), [rows[k]["extra_fields"] for k in keys])
    for r, key in enumerate(keys):
        assert rows[key]["extra_fields"]["agentcredit"]["teacher_logprobs"] is None
        n = rows[key]["response_mask"].shape[0]
        field = rows[key][trainer_module.TEACHER_FIELD]
        assert field.dtype == torch.float32 and field.shape == (n,)
        torch.testing.assert_close(field, batch.teacher[r, :n].float())
    metrics: dict = {}
    trainer._compute_advantage(Meta(keys, tags=[{} for _ in keys]), metrics)
    assert trainer_module.TEACHER_FIELD in memory.selected[-1]
    reference = build_batch(eps, seed=3, with_teacher=True)  # the records' lists, as before
    apply_to_dataproto(reference.proto, trainer.agentcredit)
    for r, key in enumerate(keys):
        n = rows[key]["response_mask"].shape[0]
        torch.testing.assert_close(rows[key]["advantages"], reference.proto.batch["advantages"][r, :n])
    assert trainer_module.teacher_to_tensor_field([{"agentcredit": {"teacher_logprobs": None}}]) is None


def test_tips_alpha_survives_a_checkpoint(monkeypatch, tmp_path):
    """issue 51: batch_target's alpha carries over a batch without non-zero deltas; it was not in the checkpoint, so
    after a resume such a batch was shaped with no alpha. It is saved beside verl's data.pt and read back."""
    from verl.trainer.ppo.v1 import PPOTrainerSync

    with initialize_config_dir(str(config_dir()), version_base=None):
        cfg = compose(
            "tips", overrides=[f"trainer.default_local_dir={tmp_path}", "agentcredit.tips.refresh_every=1"]
        )
    monkeypatch.setattr(PPOTrainerSync, "_save_checkpoint", lambda self: None)  # verl's part: models, data.pt

    def resume(self):  # verl's part: sets the step it resumed from
        self.global_steps = 7

    monkeypatch.setattr(PPOTrainerSync, "_load_checkpoint", resume)
    trainer = _trainer(cfg)
    trainer.global_steps, trainer._method_state = 7, {"tips_alpha": 0.37}
    trainer._save_checkpoint()
    assert (tmp_path / "global_step_7" / AgentCreditTrainer.STATE_FILE).is_file()
    resumed = _trainer(cfg)
    assert resumed._method_state is None
    resumed._load_checkpoint()
    assert resumed._method_state == {"tips_alpha": 0.37}
