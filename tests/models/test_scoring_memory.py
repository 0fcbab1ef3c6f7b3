"""models/scoring.py keeps no [tokens, vocab] tensor for backward (issue 13), and computes exactly what the plain
full-logits computation does: the same log-probs, entropies and gradients, whatever the chunk size and micro-batch.
"""

from __future__ import annotations

import torch

from agentcredit.models.scoring import score_tokens
from agentcredit.models.tiny import tiny_llama


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1000, (3, 12), generator=g)
    attn = torch.ones(3, 12, dtype=torch.bool)
    attn[1, 9:] = False  # right padding
    want = torch.rand(3, 12, generator=g) > 0.4
    want &= attn
    want[:, 0] = False
    return ids, attn, want


def _loss(lp: torch.Tensor, ent: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    return -(lp * want).sum() + 0.1 * (ent * want).sum()


def _reference(model, ids, attn, want, temperature):
    """Full [B, T, vocab] logits from the model's own forward, log-softmax over the whole vocabulary."""
    logits = model(input_ids=ids, attention_mask=attn).logits.float()
    logp_all = torch.log_softmax(logits[:, :-1] / temperature, dim=-1)
    lp = torch.zeros(ids.shape)
    ent = torch.zeros(ids.shape)
    lp[:, 1:] = logp_all.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    ent[:, 1:] = -(logp_all.exp() * logp_all).sum(-1)
    return lp * want, ent * want


def test_chunked_checkpointed_head_matches_full_logits_in_value_and_gradient():
    model, _ = tiny_llama(seed=3)
    model.train()
    ids, attn, want = _inputs()
    ref_lp, ref_ent = _reference(model, ids, attn, want, temperature=0.7)
    _loss(ref_lp, ref_ent, want).backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    for chunk in (1, 5, 256):  # chunks that split rows, and one that holds every wanted token
        model.zero_grad(set_to_none=True)
        s = score_tokens(model, ids, attn, want, temperature=0.7, chunk=chunk)
        torch.testing.assert_close(s.logprobs, ref_lp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(s.entropies, ref_ent, atol=1e-5, rtol=1e-5)
        _loss(s.logprobs, s.entropies, want).backward()
        for name, p in model.named_parameters():
            # summation order differs across chunks: 4e-5 on gradients of magnitude 8 in the tied embedding
            torch.testing.assert_close(p.grad, ref_grads[name], atol=1e-4, rtol=1e-4, msg=name)


def test_no_vocab_sized_tensor_is_saved_for_backward():
    """Autograd keeps only what backward needs: with the head checkpointed, nothing as large as [chunk, vocab]."""
    model, _ = tiny_llama(seed=1)
    vocab = model.config.vocab_size
    ids, attn, want = _inputs(1)
    saved: list[torch.Size] = []

    def pack(t: torch.Tensor):
        saved.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        s = score_tokens(model, ids, attn, want, chunk=4)
    assert saved, "the forward kept nothing for backward: the test would pass vacuously"
    # the head's weight [vocab, d] is a parameter, saved by reference; no activation has a vocab-sized dimension
    activations = [shape for shape in saved if shape != model.get_output_embeddings().weight.shape]
    assert all(vocab not in shape for shape in activations), activations
    s.logprobs.sum().backward()  # and backward still works from what was kept
