"""models/scoring.py: bf16 autocast runs on the device type of the model's weights (issue 11, item 3).

It used to be ``torch.autocast("cpu")`` whatever the device, so on a GPU ``model.autocast_bf16`` did nothing.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from agentcredit.models import scoring


class _MetaDecoder(nn.Module):
    """A decoder whose weights live on the 'meta' device (no CUDA needed to see which device type is used)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(4, 4, device="meta"))

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        return SimpleNamespace(last_hidden_state=torch.zeros(*input_ids.shape, 4))


class _MetaModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.decoder = _MetaDecoder()
        self.head = nn.Linear(4, 8, bias=False, device="meta")

    def get_decoder(self):
        return self.decoder

    def get_output_embeddings(self):
        return self.head


@pytest.fixture
def recorded(monkeypatch):
    calls = []

    def fake_autocast(device_type, dtype=None, **kwargs):
        calls.append((device_type, dtype))
        return contextlib.nullcontext()

    monkeypatch.setattr(torch, "autocast", fake_autocast)
    return calls


def test_autocast_uses_the_models_device_type(recorded):
    ids = torch.zeros(1, 3, dtype=torch.long)
    scoring.hidden_states(_MetaModel(), ids, torch.ones_like(ids), autocast=True)
    assert recorded == [("meta", torch.bfloat16)]


def test_no_autocast_when_off(recorded):
    ids = torch.zeros(1, 3, dtype=torch.long)
    scoring.hidden_states(_MetaModel(), ids, torch.ones_like(ids), autocast=False)
    assert recorded == []


def test_cpu_model_autocasts_on_cpu_for_real():
    """On a CPU model the bf16 context is really active: the decoder's matmuls run in bfloat16."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 50, (2, 5))
    attn = torch.ones_like(ids)
    seen = []
    hook = model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    try:
        with torch.no_grad():
            scoring.hidden_states(model, ids, attn, autocast=True)
            scoring.hidden_states(model, ids, attn, autocast=False)
    finally:
        hook.remove()
    assert seen == [torch.bfloat16, torch.float32]
    want = torch.zeros_like(ids, dtype=torch.bool)
    want[:, 1:] = True
    scores = scoring.score_tokens(model, ids, attn, want, autocast=True, with_entropy=True)
    assert scores.logprobs.dtype == torch.float32 and torch.isfinite(scores.logprobs).all()
