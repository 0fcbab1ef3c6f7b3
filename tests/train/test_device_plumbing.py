"""Nothing on the native path hard-codes a device (issue 50), checked on the CPU.

A CPU-only machine cannot show a tensor on the wrong device (there is one), so two checks stand in for a GPU run
(``scripts/gpu_check.py`` is the run itself):

* a device spy: during one whole training step (rollout, signals, credit, update) of methods with a critic and a
  teacher, every tensor a factory makes without naming a device is recorded with the file that made it. Only files
  that build host-side bookkeeping may do that (the batch layout, the credit maths, score holders on the host, the
  HF engine's inputs built on the host and moved once); anything that meets the model's activations (scoring,
  losses, the trainer's update) must name the model's device, or a GPU run mixes devices;
* a reading of the source: no ``"cpu"`` device, ``.cpu()`` or ``map_location="cpu"`` on the native path except
  where a file is read into host memory on purpose (each listed with its reason).
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode
from train_helpers import EXAMPLES, SMALL

from agentcredit.config import load_config
from agentcredit.models.loading import load_base_model
from agentcredit.train.trainer import Trainer

PACKAGE = Path(__file__).resolve().parents[2] / "agentcredit"

FACTORIES = {
    torch.zeros,
    torch.ones,
    torch.full,
    torch.empty,
    torch.tensor,
    torch.as_tensor,
    torch.arange,
    torch.rand,
    torch.randn,
    torch.randint,
}

#: Where tensors may be made without naming a device (a file's functions, or a whole folder): host-side data that
#: reaches the model only through an explicit ``.to(device)`` (or never).
HOST_SIDE = {
    "credit/": "pure credit maths on the host batch",
    "train/batch.py:build_batch": "the batch layout lives on the host",
    "train/batch.py:pad": "(build_batch's padding)",
    "train/signals.py:pad_rows": "padded rows, moved by score_tokens",
    "train/signals.py:score_batch": "host holders of the scores (written with .to(holder.device))",
    "train/signals.py:critic_values": "a host holder of the values",
    "train/signals.py:teacher_logprobs": "a host holder of GEAR's teacher log-probs",
    "rollout/backend.py:_step": "the HF engine's ids, positions and mask, built on the host and moved once per forward",
    "rollout/sampling.py:draw_uniforms": "uniforms from the episodes' CPU generators (moved to the logits' device)",
    "models/packing.py:pack_shared_prefixes": "the tree mask, built on the host (P row copies) and moved once",
}


def host_side(site: tuple[str, str]) -> bool:
    path, function = site
    return any(
        path.startswith(key) if key.endswith("/") else f"{path}:{function}" == key for key in HOST_SIDE
    )


class FactorySpy(TorchFunctionMode):
    """Records ``(file, function, factory)`` of every tensor an agentcredit file makes without a device."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None:
            frame = sys._getframe(1)
            while frame is not None and f"{Path('torch')}/" in frame.f_code.co_filename:
                frame = frame.f_back
            # a comprehension is a frame of its own before Python 3.12: name the function it sits in
            while frame is not None and frame.f_code.co_name.startswith("<") and frame.f_back is not None:
                if frame.f_code.co_name == "<module>":
                    break
                frame = frame.f_back
            name = frame.f_code.co_filename if frame is not None else ""
            if str(PACKAGE) in name:
                rel = Path(name).relative_to(PACKAGE).as_posix()
                self.calls[(rel, frame.f_code.co_name, func.__name__)] += 1
        return func(*args, **kwargs)


def device_free_factories(preset: str, overrides: list[str]) -> Counter:
    config = load_config(preset, [*SMALL, *overrides, "model.device=cpu"])
    model, tokenizer = load_base_model("tiny", seed=0)
    trainer = Trainer(config, model=model, tokenizer=tokenizer, examples=list(EXAMPLES), log=False)
    spy = FactorySpy()
    try:
        with spy:
            trainer.train_step()
    finally:
        trainer.close()
    return spy.calls


@pytest.mark.parametrize(
    ("preset", "overrides"),
    [
        ("ppo-arith-tools", []),  # a separate critic model and a token value head
        ("carl-segment-arith-tools", []),  # a boundary head on the policy's backbone
        ("gear-arith-tools", []),  # a teacher pass of the policy's own weights
        ("tips-arith-tools", []),  # a frozen teacher copy
    ],
)
def test_only_host_side_files_make_tensors_without_a_device(preset, overrides):
    calls = device_free_factories(preset, overrides)
    assert calls, "the spy saw nothing: it is not recording"
    stray = {k: n for k, n in calls.items() if not host_side(k[:2])}
    assert not stray, f"tensors made without the model's device on the device path: {stray}"


def test_the_spy_catches_a_tensor_made_without_a_device():
    """The check's own control: a factory call without a device in the package is recorded, one with it is not."""
    from agentcredit.train import losses

    spy = FactorySpy()
    with spy:
        losses.value_weights(torch.ones(2, 3, dtype=torch.bool), torch.tensor([0, 1]), "boundary")
    assert not spy.calls  # losses.value_weights names the mask's device
    source = compile("import torch\nx = torch.zeros(3)\n", str(PACKAGE / "train" / "probe.py"), "exec")
    spy = FactorySpy()
    with spy:
        exec(source, {})
    assert spy.calls == Counter({("train/probe.py", "<module>", "zeros"): 1})
    assert not host_side(("train/probe.py", "<module>"))
    # before issue 50, sampling's nucleus fallback made its holders without the logits' device
    assert not host_side(("rollout/sampling.py", "_truncate")) and host_side(
        ("credit/methods/ppo.py", "anything")
    )


# ----------------------------------------------------------------------------------------------- source
NATIVE_PATH = ["models", "rollout", "train", "eval", "run.py", "lab", "environment.py"]

#: ``(file, what)`` allowed to name the CPU, with the reason.
CPU_ALLOWED = {
    ("models/device.py", "torch.device('cpu')"): "the device setting itself",
    (
        "models/heads.py",
        "map_location='cpu'",
    ): "a saved head is read into host memory, then moved with the head",
    (
        "train/checkpoint.py",
        "map_location='cpu'",
    ): "a checkpoint is read into host memory; load_state_dict copies",
    ("train/sft.py", "map_location='cpu'"): "the SFT checkpoint, read into host memory; copy_ moves it",
    ("train/sft.py", ".cpu()"): "the demonstrations' fingerprint hashes host bytes (once per SFT)",
    ("eval/loading.py", "map_location='cpu'"): "a saved head, read into host memory",
    (
        "eval/loading.py",
        "device='cpu'",
    ): "a checkpoint's policy loads on the host; the eval config's device moves it",
}


def cpu_mentions(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "cpu" and not node.args:
                out.append(".cpu()")
            if isinstance(func, ast.Attribute) and func.attr == "device" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and first.value == "cpu":
                    out.append("torch.device('cpu')")
            for kw in node.keywords:
                if kw.arg in ("device", "map_location") and isinstance(kw.value, ast.Constant):
                    if kw.value.value == "cpu":
                        out.append(f"{kw.arg}='cpu'")
    return out


def test_the_native_path_names_the_cpu_only_where_it_reads_files_into_host_memory():
    found = set()
    for part in NATIVE_PATH:
        root = PACKAGE / part
        for path in [root] if root.is_file() else sorted(root.rglob("*.py")):
            rel = path.relative_to(PACKAGE).as_posix()
            found |= {(rel, what) for what in cpu_mentions(path)}
    unexpected = found - set(CPU_ALLOWED)
    assert not unexpected, (
        f"a hard-coded CPU on the native path (use the model's device): {sorted(unexpected)}"
    )
    assert ("models/device.py", "torch.device('cpu')") in found  # the reader sees what it should


def test_a_trainer_on_the_cpu_puts_everything_on_the_model_device():
    config = load_config("ppo-arith-tools", [*SMALL, "model.device=cpu"])
    model, tokenizer = load_base_model("tiny", seed=0)
    trainer = Trainer(config, model=model, tokenizer=tokenizer, examples=list(EXAMPLES), log=False)
    try:
        parts = [trainer.model, trainer.value_head, trainer.critic_model, *trainer.frozen_models()]
        assert {p.device for part in parts if part is not None for p in part.parameters()} == {trainer.device}
        assert trainer.device == torch.device("cpu")
        assert trainer.precision.autocast is False and trainer.rollouts.model(trainer.step) is trainer.model
    finally:
        trainer.close()


def test_a_batch_already_on_the_device_is_not_copied():
    from agentcredit.train.batch import TrainBatch

    n, width = 2, 3
    z = torch.zeros(n, width)
    batch = TrainBatch(
        input_ids=torch.zeros(n, width, dtype=torch.long),
        attention_mask=torch.ones(n, width, dtype=torch.bool),
        policy_mask=torch.ones(n, width, dtype=torch.bool),
        loss_mask=torch.ones(n, width, dtype=torch.bool),
        segment_ids=torch.zeros(n, width, dtype=torch.long),
        row_traj=torch.arange(n),
        old_logp=z,
        advantages=z.clone(),
        behaviour_logp=z.clone(),
        behaviour_entropy=z.clone(),
    )
    assert batch.to(torch.device("cpu")) is batch
    moved = batch.to(torch.device("meta"))  # any other device: every tensor there, the bookkeeping kept
    assert moved is not batch and moved.input_ids.device.type == "meta" and moved.ref_logp is None
    assert batch.input_ids.device.type == "cpu"
    assert batch.select([1]).input_ids.shape == (1, width)


def test_memory_lines_give_the_gpu_peak_only_when_there_is_one():
    from agentcredit.runtime import format_memory

    assert format_memory(3.77) == "peak RSS 3.77 GiB (4.05 GB)"
    assert format_memory(3.77, 1.5) == "peak RSS 3.77 GiB (4.05 GB); GPU peak 1.50 GiB (1.61 GB)"


def test_base_models_and_value_heads_load_where_they_are_asked():
    from agentcredit.models.heads import initial_value_head

    model, _ = load_base_model("tiny", seed=0, device="meta")
    assert {p.device.type for p in model.parameters()} == {"meta"}
    cfg = load_config("ppo-arith-tools", [*SMALL, "model.device=cpu"])
    head = initial_value_head(cfg, 64)
    assert {p.device.type for p in head.parameters()} == {"cpu"}
