"""Helpers for the rollout tests (demonstrations, tools, overfitting, teacher forcing); fixtures are in conftest.

The tiny Llama, and a copy of it overfit on tool-using demonstrations:

A random tiny model almost never writes a tool call, so the engine tests could not exercise tools, splices
and observations for real. ``trained_tiny`` is the tiny model trained for a few seconds (cross-entropy on the
policy tokens) on one demonstration episode per protocol below. Sampling from it then reproduces the
demonstrations (tool calls, tool outputs, ``<context>`` splices...) through the real engine, real protocols
and real (deterministic) tool functions.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from agentcredit.protocols import get_protocol
from agentcredit.protocols.base import Protocol
from agentcredit.rollout.tree import RolloutTree, Segment
from agentcredit.tools.base import ToolRuntime

PARIS = "Doc 1 (Title: Paris) Paris is the capital and largest city of France."
CALC_SCHEMA = {
    "name": "calc",
    "description": "Evaluate an arithmetic expression.",
    "parameters": {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    },
}


def arithmetic(expression: str) -> str:
    """A deterministic calculator tool: digits, + - * / ( ) and spaces only."""
    if not re.fullmatch(r"[\d+\-*/() ]+", expression):
        return f"ERROR: not an arithmetic expression: {expression!r}"
    return str(eval(expression))  # noqa: S307 - the regex above admits arithmetic only


def python_print(args: dict[str, Any]) -> str:
    """A deterministic stand-in for the sandbox on the demo's ``print(<arithmetic>)`` code."""
    match = re.fullmatch(r"print\((.*)\)", args.get("code", "").strip())
    return (
        (arithmetic(match.group(1)) + "\n") if match else "ERROR: only print(<arithmetic>) is supported here"
    )


def make_tools() -> ToolRuntime:
    return ToolRuntime(
        {
            "python": python_print,
            "search": lambda args: PARIS,
            "calc": lambda args: arithmetic(str(args.get("expression", ""))),
        },
        max_workers=4,
    )


@dataclass
class Demo:
    """A protocol (name + options), a question and the policy texts of one correct episode."""

    name: str
    protocol: str
    options: dict[str, Any]
    question: str
    texts: list[str]
    answer: str
    extra: dict[str, Any] = field(default_factory=dict)

    def build_protocol(self) -> Protocol:
        return get_protocol(self.protocol, **self.options)


EOS = "<|im_end|>"
DEMOS = [
    Demo(
        "codefence-replace",
        "codefence",
        {"replacement": True},
        "What is 17*23?",
        [
            "I will compute it.\n```python\nprint(17*23)\n```",
            "<context>17*23 = 391</context>",
            "The answer is \\boxed{391}." + EOS,
        ],
        "391",
    ),
    Demo(  # the same texts without replacement: the raw output stays in the context of the commit
        "codefence-keep",
        "codefence",
        {"replacement": False},
        "What is 17*23?",
        [
            "I will compute it.\n```python\nprint(17*23)\n```",
            "<context>17*23 = 391</context>",
            "The answer is \\boxed{391}." + EOS,
        ],
        "391",
    ),
    Demo(
        "tags-search-r1",
        "tags",
        {"style": "search-r1"},
        "What is the capital of France",
        [
            "<think>I need to search.</think>\n<search> capital of France </search>",
            "<think>Paris.</think>\n<answer> Paris </answer>",
        ],
        "Paris",
    ),
    Demo(
        "tags-asearcher",
        "tags",
        {"style": "asearcher"},
        "Which city is the capital of France?",
        [
            "I should search.</think>\n<search> capital of France </search>",
            "Paris is the capital.</think>",
            "\n<answer> Paris </answer>",
        ],
        "Paris",
    ),
    Demo(
        "tags-qwen-tools",
        "tags",
        {"style": "qwen-tools"},
        "Name the capital of France.",
        [
            '<tool_call>\n{"name": "search", "arguments": {"query_list": ["capital of France"]}}\n</tool_call>'
            + EOS,
            "<answer> Paris </answer>" + EOS,
        ],
        "Paris",
    ),
    Demo(
        "jsoncall",
        "jsoncall",
        {"schemas": [CALC_SCHEMA]},
        "What is 25*4?",
        [
            '<think>Use the calculator.</think>\n<tool_call>\n[{"name": "calc", "arguments": {"expression": "25*4"}}]\n</tool_call>'
            + EOS,
            '<think>Done.</think>\n<tool_call>\n[{"name": "response_gen", "arguments": {"response": "100"}}]\n</tool_call>'
            + EOS,
        ],
        "100",
    ),
]


def demo_tree(demo: Demo, tokenizer: Any, tools: ToolRuntime) -> RolloutTree:
    """The demonstration as a one-path tree, built the way the engine builds contexts (appended token ids)."""
    protocol = demo.build_protocol()
    state = protocol.new_episode(demo.question)
    prompt = protocol.prompt(state, tokenizer)
    tree = RolloutTree(
        Segment(tokenizer(prompt, add_special_tokens=False)["input_ids"], prompt, role="prompt")
    )
    node = 0
    for i, text in enumerate(demo.texts):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        finish = "eos" if ids[-1] == tokenizer.eos_token_id else "stop"
        assert protocol.segment_ends(state, tokenizer.decode(ids)) or finish == "eos", (demo.name, i)
        turn = protocol.read_segment(state, text, finish)
        protocol.record(state, turn, text)
        node = tree.add(Segment(ids, text, role="policy", kind=turn.kind, logprobs=[0.0] * len(ids)), node)
        if turn.done:
            assert i == len(demo.texts) - 1 and turn.answer == demo.answer, (demo.name, turn)
            break
        results = tools.run(turn.calls)
        obs = protocol.observation(state, turn, results)
        if obs is not None:
            obs_ids = tokenizer(obs.text, add_special_tokens=False)["input_ids"]
            node = tree.add(Segment(obs_ids, obs.text, role="observation", transient=obs.transient), node)
    tree.set_reward(node, 1.0)
    return tree


def overfit(
    model: Any,
    sequences: list[tuple[list[int], list[bool]]],
    *,
    steps: int = 40,
    lr: float = 3e-2,
    negatives: int = 2048,
) -> None:
    """Teach ``model`` the policy tokens of ``sequences`` (next-token cross-entropy on the masked positions).

    For speed the softmax runs over the tokens of the sequences plus ``negatives`` random other tokens, not
    the whole 49k vocabulary; with ``initializer_range=0.1`` the untouched logits stay small enough that the
    demonstrated tokens get most of the full-vocabulary probability after ~40 steps.
    """
    vocab = {t for ids, _ in sequences for t in ids}
    generator = torch.Generator().manual_seed(0)
    vocab.update(torch.randperm(model.config.vocab_size, generator=generator)[:negatives].tolist())
    subset = torch.tensor(sorted(vocab))
    index = torch.full((model.config.vocab_size,), -1, dtype=torch.long)
    index[subset] = torch.arange(len(subset))
    batches = []
    for ids, mask in sequences:
        x = torch.tensor([ids])
        where = torch.tensor(mask[1:]).nonzero().squeeze(-1)  # position t predicts token t + 1
        batches.append((x, where, index[x[0, 1:][where]]))
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps, eta_min=lr / 10)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.zeros(())
        for x, where, target in batches:
            hidden = model.model(input_ids=x).last_hidden_state[0, where]
            loss = loss + torch.nn.functional.cross_entropy(hidden @ model.lm_head.weight[subset].T, target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    model.eval()


def overfit_on_demos(model: Any, tokenizer: Any) -> None:
    """:func:`overfit` ``model`` on the first leaf's training views of every :data:`DEMOS` tree."""
    tools = make_tools()
    sequences = []
    for demo in DEMOS:
        tree = demo_tree(demo, tokenizer, tools)
        for view in tree.training_views(tree.leaves()[0]):
            sequences.append((view.token_ids, view.policy_mask))
    tools.close()
    with one_thread():
        overfit(model, sequences)


def greedy_engine(backend: Any, tokenizer: Any, demo: Demo, tools: ToolRuntime) -> Any:
    """A greedy :class:`RolloutEngine` on ``backend`` with the demo's protocol and the budgets the backend tests
    compare at (60 tokens per segment, 200 per episode)."""
    from agentcredit.rollout.engine import EngineConfig, RolloutEngine
    from agentcredit.rollout.sampling import SamplingParams

    config = EngineConfig(
        sampling=SamplingParams(temperature=0), max_segment_tokens=60, max_episode_tokens=200
    )
    return RolloutEngine(backend, tokenizer, demo.build_protocol(), tools, config)


@contextlib.contextmanager
def one_thread():
    """Run torch on one thread: the tiny model's ops are too small to gain from two, and on a shared machine
    OpenMP threads spinning against other processes made them several times slower (measured here). It also fixes
    the reduction order, which a test comparing two computations bit for bit needs: on two threads with a busy
    process beside them, two identical PPO updates of the tiny model differed in the last bits in 2 of 12 tries
    (up to 2e-8), and a CI run failed on it; on one thread, 0 of 16 under two busy processes."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def teacher_forced(
    model: Any, token_ids: list[int], temperature: float = 1.0, mask: list[bool] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each token given its prefix, and the entropy there, from one forward pass over the sequence.

    Only positions whose token is in ``mask`` (default: all but the first) go through the LM head, which is
    what makes this cheap on long prompts; the others are 0.
    """
    wanted = torch.tensor(mask if mask is not None else [False] + [True] * (len(token_ids) - 1))
    wanted[0] = False
    targets = wanted.nonzero().squeeze(-1)
    with torch.no_grad():
        hidden = model.model(input_ids=torch.tensor([token_ids])).last_hidden_state[0]
        logits = model.lm_head(hidden[targets - 1]).float()
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    chosen = logp.gather(-1, torch.tensor(token_ids)[targets].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    out_lp, out_ent = torch.zeros(len(token_ids)), torch.zeros(len(token_ids))
    out_lp[targets], out_ent[targets] = chosen, entropy
    return out_lp, out_ent
