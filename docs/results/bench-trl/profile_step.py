"""Profile one rollout: python profile_step.py PROMPTS EPISODES ours|theirs (agentcredit engine | transformers generate)."""

import cProfile
import io
import os
import pstats
import sys
import time

import torch

from agentcredit.config import load_config
from agentcredit.environment import build_environment
from agentcredit.models.loading import load_base_model
from agentcredit.rollout.engine import EngineConfig, RolloutEngine
from agentcredit.rollout.sampling import SamplingParams
from agentcredit.rollout.strategies import independent
from agentcredit.tasks import load_examples

P, N = int(sys.argv[1]), int(sys.argv[2])
which = sys.argv[3]
cfg = load_config("grpo-arith-tools")
examples = load_examples(cfg, limit=P)
env = build_environment(cfg)
model, tok = load_base_model("embedded", "float32", seed=0)
model.eval()
r = cfg.rollout


def ours():
    ec = EngineConfig(
        sampling=SamplingParams(temperature=1.0),
        max_segment_tokens=r.max_new_tokens,
        max_episode_tokens=r.max_episode_tokens,
        max_turns=r.max_turns,
        seed=0,
        max_batch=r.max_batch,
    )
    eng = RolloutEngine.for_hf_model(model, tok, env.protocol, env.tools, ec)
    with torch.no_grad():
        eng.run(examples, independent(N), env.reward)
    return eng.stats.generated_tokens, eng


def theirs():
    from transformers import GenerationConfig

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
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=am, generation_config=gc)
    comp = out[:, L:]
    n = 0
    for row in comp.tolist():
        for t in row:
            n += 1
            if t in (tok.eos_token_id, tok.pad_token_id):
                break
    return n, None


fn = ours if which == "ours" else theirs
fn()  # warm
prof = cProfile.Profile()
c0, w0 = time.process_time(), time.perf_counter()
prof.enable()
n, eng = fn()
prof.disable()
c1, w1 = time.process_time(), time.perf_counter()
print(
    f"{which} {P}x{N}: tokens {n} cpu {c1 - c0:.2f}s wall {w1 - w0:.2f}s tok/cpu-s {n / (c1 - c0):.1f} load {os.getloadavg()}"
)
if eng is not None:
    print(eng.stats.to_dict())
    print(eng.backend.stats)
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(35)
print(s.getvalue())
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("cumtime").print_stats(45)
print(s.getvalue())
env.close()
