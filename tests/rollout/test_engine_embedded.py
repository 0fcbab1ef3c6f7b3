"""The engine on the embedded SmolLM2-135M (slow): a real protocol with real tools, and exact log-probs."""

from __future__ import annotations

import pytest
import torch
from rollout_helpers import teacher_forced

from agentcredit.rollout.backend import HFBackend
from agentcredit.rollout.engine import EngineConfig, RolloutEngine
from agentcredit.rollout.strategies import entropy_guided, independent

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm():
    from agentcredit.models.embedded import load_model

    return load_model("embedded", dtype="float32")


@pytest.fixture(scope="module")
def kb():
    """kb-multihop with Search-R1 tags and BM25 over the task's corpus: a multi-turn task with real search."""
    from agentcredit.protocols import get_protocol
    from agentcredit.tasks import load_task, score, task_corpus
    from agentcredit.tools.base import ToolRuntime
    from agentcredit.tools.search import load_retriever

    examples = load_task("kb-multihop", split="train", limit=3, seed=0)
    tools = ToolRuntime({"search": load_retriever(task_corpus("kb-multihop")).as_tool(3)})

    def reward(example, answer):
        return 0.0 if answer is None else score(answer, example.answers, metric=example.metric)

    yield examples, get_protocol("tags", style="search-r1"), tools, reward
    tools.close()


def test_episode_batch_with_a_real_protocol_and_tools(smollm, kb):
    model, tokenizer = smollm
    examples, protocol, tools, reward = kb
    config = EngineConfig(max_segment_tokens=48, max_episode_tokens=160, max_turns=4, seed=0)
    engine = RolloutEngine(HFBackend(model), tokenizer, protocol, tools, config)
    trees = engine.run(examples, independent(3), reward)
    assert len(trees) == 3 and engine.stats.episodes == 9
    for tree, example in zip(trees, examples, strict=True):
        assert tree.info["question"] == example.question and len(tree.leaves()) == 3
        for leaf in tree.leaves():
            info = tree.nodes[leaf].info
            assert info["finish"] in {"done", "max_turns", "max_tokens", "context"}
            assert 1 <= info["n_turns"] <= 4 and info["generated_tokens"] <= 160
            assert 0.0 <= tree.nodes[leaf].reward <= 1.0
            for node in tree.path(leaf)[1:]:
                seg = tree.segment(node)
                if seg.role == "policy":
                    assert seg.kind in {"search", "answer", "invalid"} and len(seg.logprobs) == len(seg)
                    assert seg.info["finish"] in {"stop", "eos", "length"}
                else:  # an observation: search results or Search-R1's corrective text, tokenised alone
                    assert seg.token_ids == tokenizer(seg.text, add_special_tokens=False)["input_ids"]
    assert engine.stats.generated_tokens == sum(
        len(t.segment(n)) for t in trees for n in range(len(t)) if t.segment(n).role == "policy"
    )


def test_logprobs_equal_teacher_forcing_on_the_embedded_model(smollm, kb):
    model, tokenizer = smollm
    examples, protocol, tools, reward = kb
    config = EngineConfig(max_segment_tokens=32, max_episode_tokens=96, max_turns=3, seed=1)
    engine = RolloutEngine(HFBackend(model), tokenizer, protocol, tools, config)
    trees = engine.run(examples[:2], entropy_guided(2, 2), reward)  # forks from stored caches included
    worst, views = 0.0, 0
    for tree in trees:
        for leaf in tree.leaves():
            for view in tree.training_views(leaf):
                logprobs, _ = teacher_forced(model, view.token_ids, 1.0, view.policy_mask)
                mask = torch.tensor(view.policy_mask)
                worst = max(worst, (logprobs[mask] - torch.tensor(view.logprobs)[mask]).abs().max().item())
                views += 1
    assert views >= 8 and worst < 1e-4, worst
