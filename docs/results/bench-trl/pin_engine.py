"""Equality fingerprint: python pin_engine.py OUT.json (tokens, log-probs, entropies for fixed seeds; diff two trees)."""

import json
import sys

import torch

from agentcredit.models.embedded import load_model
from agentcredit.protocols import get_protocol
from agentcredit.rollout.backend import HFBackend
from agentcredit.rollout.engine import EngineConfig, RolloutEngine
from agentcredit.rollout.sampling import SamplingParams
from agentcredit.rollout.strategies import entropy_guided, independent
from agentcredit.tasks import load_task, task_corpus
from agentcredit.tools.base import ToolRuntime
from agentcredit.tools.search import load_retriever

model, tok = load_model("embedded", dtype="float32")
examples = load_task("kb-multihop", split="train", limit=2, seed=0)
tools = ToolRuntime({"search": load_retriever(task_corpus("kb-multihop")).as_tool(3)})
protocol = get_protocol("tags", style="search-r1")
out = {}
for name, sampling, strat in [
    ("t1", SamplingParams(), independent(3)),
    ("topp", SamplingParams(temperature=0.8, top_p=0.9), independent(2)),
    ("greedy", SamplingParams(temperature=0.0), independent(1)),
    ("eg", SamplingParams(), entropy_guided(2, 2)),
]:
    cfg = EngineConfig(sampling=sampling, max_segment_tokens=32, max_episode_tokens=96, max_turns=3, seed=1)
    eng = RolloutEngine(HFBackend(model), tok, protocol, tools, cfg)
    with torch.no_grad():
        trees = eng.run(examples, strat, lambda ex, a: 0.0)
    segs = []
    for t in trees:
        for n in range(len(t)):
            s = t.segment(n)
            segs.append(
                [
                    s.role,
                    s.token_ids,
                    list(map(float, s.logprobs or [])),
                    [None if e is None else float(e) for e in (s.entropies or [])],
                ]
            )
    out[name] = segs
    print(name, eng.stats.generated_tokens, eng.stats.tool_calls, file=sys.stderr)
tools.close()
json.dump(out, open(sys.argv[1], "w"))
