"""Generation alone, interleaved: python ab.py 2x4,4x8 ROUNDS (agentcredit engine vs transformers generate, CPU s)."""

import json
import os
import sys
import time

import torch
from transformers import GenerationConfig

from agentcredit.config import load_config
from agentcredit.environment import build_environment
from agentcredit.models.loading import load_base_model
from agentcredit.rollout.engine import EngineConfig, RolloutEngine
from agentcredit.rollout.sampling import SamplingParams
from agentcredit.rollout.strategies import independent
from agentcredit.tasks import load_examples

batches = [tuple(map(int, b.split("x"))) for b in sys.argv[1].split(",")]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 1
cfg = load_config("grpo-arith-tools")
env = build_environment(cfg)
model, tok = load_base_model("embedded", "float32", seed=0)
model.eval()
r = cfg.rollout


def ours(examples, N, seed):
    ec = EngineConfig(
        sampling=SamplingParams(temperature=1.0),
        max_segment_tokens=r.max_new_tokens,
        max_episode_tokens=r.max_episode_tokens,
        max_turns=r.max_turns,
        seed=seed,
        max_batch=r.max_batch,
    )
    eng = RolloutEngine.for_hf_model(model, tok, env.protocol, env.tools, ec)
    with torch.no_grad():
        eng.run(examples, independent(N), env.reward)
    return eng.stats.generated_tokens, {
        "forwards": eng.stats.forward_calls,
        "tool_calls": eng.stats.tool_calls,
    }


def theirs(examples, N, seed):
    rows = []
    for ex in examples:
        st = env.protocol.new_episode(ex.question)
        text = tok.apply_chat_template(env.protocol.messages(st), tokenize=False, add_generation_prompt=True)
        rows.append(tok(text, add_special_tokens=False)["input_ids"])
    rows = [x for x in rows for _ in range(N)]
    L = max(map(len, rows))
    ids = torch.tensor([[tok.pad_token_id] * (L - len(x)) + x for x in rows])
    am = torch.tensor([[0] * (L - len(x)) + [1] * len(x) for x in rows])
    gc = GenerationConfig(
        max_new_tokens=r.max_new_tokens,
        do_sample=True,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=[tok.eos_token_id],
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        disable_compile=True,
    )
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=am, generation_config=gc)
    n = 0
    for row in out[:, L:].tolist():
        for t in row:
            n += 1
            if t == tok.eos_token_id:
                break
    return n, {"forwards": out.shape[1] - L}


ours(load_examples(cfg, limit=1), 2, 99)
theirs(load_examples(cfg, limit=1), 2, 99)  # warm
for P, N in batches:
    examples = load_examples(cfg, limit=P)
    for k in range(rounds):
        for name, fn in (
            (("agentcredit", ours), ("generate", theirs))
            if k % 2 == 0
            else (("generate", theirs), ("agentcredit", ours))
        ):
            c0, w0 = time.process_time(), time.perf_counter()
            n, extra = fn(examples, N, k)
            c, w = time.process_time() - c0, time.perf_counter() - w0
            print(
                json.dumps(
                    {
                        "batch": f"{P}x{N}",
                        "round": k,
                        "side": name,
                        "tokens": n,
                        "cpu": round(c, 2),
                        "wall": round(w, 2),
                        "tok_per_cpu_s": round(n / c, 1),
                        **extra,
                        "load": os.getloadavg()[0],
                    }
                ),
                flush=True,
            )
env.close()
