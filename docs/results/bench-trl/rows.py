"""One decode step by rows at a 300-token context: python rows.py (HFBackend vs the model with a DynamicCache)."""

import time

import torch
from transformers import DynamicCache

from agentcredit.models.loading import load_base_model
from agentcredit.rollout.backend import HFBackend

model, tok = load_base_model("embedded", "float32", seed=0)
model.eval()
ctx = 300
for rows in (1, 8, 32):
    be = HFBackend(model)
    seqs = [be.new_sequence() for _ in range(rows)]
    be.reserve(rows)
    be.extend({s: list(range(100, 100 + ctx)) for s in seqs})
    # ours: 10 decode steps
    c = time.process_time()
    for k in range(10):
        be.extend({s: [200 + k] for s in seqs})
    ours = (time.process_time() - c) / 10
    # plain HF forward with a DynamicCache
    with torch.no_grad():
        cache = DynamicCache()
        ids = torch.arange(100, 100 + ctx).repeat(rows, 1)
        model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        am = torch.ones(rows, ctx, dtype=torch.long)
        c = time.process_time()
        for k in range(10):
            am = torch.cat([am, torch.ones(rows, 1, dtype=torch.long)], 1)
            model(
                input_ids=torch.full((rows, 1), 200 + k),
                attention_mask=am,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        hf = (time.process_time() - c) / 10
    print(f"rows {rows}: ours {ours * 1000:.1f} ms/step  hf {hf * 1000:.1f} ms/step", flush=True)
