"""Supervised fine-tuning on demonstrations in a protocol's format (what RL starts from on a small model).

Demonstrations come from either
* a scripted policy (:mod:`agentcredit.train.demos`) played through the real protocol and tools — for the synthetic
  tasks and for tasks whose examples carry a solution path; or
* rejection sampling: the model's own episodes from the rollout engine, kept when they are correct.

The loss is the token-mean negative log-likelihood of the policy tokens (observations and the prompt are never
trained), computed with the same scoring path and microbatching as RL.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentcredit.config import MICRO_BATCH_TOKENS
from agentcredit.credit import aggregation_weights
from agentcredit.credit.signals import NoReference
from agentcredit.environment import Environment
from agentcredit.models.scoring import micro_batches, score_tokens
from agentcredit.progress import Progress
from agentcredit.protocols.base import episode_cap
from agentcredit.rollout.engine import episode_reward
from agentcredit.rollout.infra import raise_on_infra_failures
from agentcredit.rollout.replay import replay
from agentcredit.rollout.tree import RolloutTree
from agentcredit.tasks import Example
from agentcredit.tools.base import ToolUnavailableError
from agentcredit.tools.episodes import EpisodeTools
from agentcredit.train.batch import build_batch
from agentcredit.train.demos import ScriptedPolicy, check_demo_calls, demo_turns, scripted_policy
from agentcredit.train.optim import adamw
from agentcredit.train.signals import row_tokens


def demonstrations(
    env: Environment,
    tokenizer: Any,
    examples: Sequence[Example],
    protocol_name: str,
    *,
    tool_share: float | None = None,
    locate: Mapping[str, str] | None = None,
    max_turns: int | None = None,
    warn: Callable[[str], None] | None = None,
    direct_answers: str = "plain",
) -> list[RolloutTree]:
    """Scripted episodes for ``examples``, played through the environment; only correct ones are kept.

    A task file's ``demo_calls`` are checked against the tools' schemas first (:func:`check_demo_calls`; ``locate``
    maps example ids to ``"<file> line <n>"``). A call that then answers an error (``ERROR: ...``, a tool that
    raised) stops SFT with a ValueError naming the row and call: a demonstration must never teach an error as the
    tool's answer. ``max_turns`` caps the assistant messages as the engine does (``rollout.max_turns``; the
    protocol's ``max_segments`` caps them too); a demonstration that needs more is reported through ``warn``.

    ``tool_share``: see :func:`agentcredit.train.demos.calls_tool`; ``direct_answers`` (``plain`` / ``worked``):
    :func:`agentcredit.train.demos.direct_answer`.
    """
    policy = scripted_policy(
        protocol_name, env.protocol, tool_share=tool_share, tokenizer=tokenizer, direct_answers=direct_answers
    )
    cap = episode_cap(max_turns, env.protocol.max_segments)
    if protocol_name == "chat":
        schemas = env.tools.episodes.schemas if env.tools.episodes is not None else env.protocol.schemas
        for line in check_demo_calls(examples, schemas, locate=locate, max_messages=cap):
            (warn or _warn)(line)
    trees = []
    for example in examples:
        where = (locate or {}).get(example.id)
        # an error answering a task file's own demo_calls stops SFT (the built-in scripts keep their error texts)
        errors = protocol_name == "chat" and demo_turns(example) is not None
        tree = demonstration(env, tokenizer, example, policy, where=where, errors=errors, max_turns=cap)
        if max(tree.rewards().values()) >= 1.0:
            trees.append(tree)
    return trees


def demonstration(
    env: Environment,
    tokenizer: Any,
    example: Example,
    policy: ScriptedPolicy,
    *,
    where: str | None = None,
    errors: bool = False,
    max_turns: int | None = None,
) -> RolloutTree:
    """One scripted episode of ``example``, played through the environment's protocol and tools, and scored as the
    engine scores an episode. Raises ToolUnavailableError when a tool could not run, and (``errors``) a ValueError
    naming ``where`` when a scripted call answers an error (:class:`_DemoTools`)."""
    tools = env.tools if env.tools.episodes is None else EpisodeTools(env.tools.episodes, example)
    where = f"{where} (example {example.id!r})" if where else f"example {example.id!r}"
    try:
        tree = replay(
            env.protocol,
            tokenizer,
            _DemoTools(tools, where, errors=errors),
            example.question,
            lambda turn, obs: policy(example, turn, obs),
            max_turns=max_turns,
            episode_options=example.info.get("episode_options"),
        )
    finally:
        if tools is not env.tools:
            tools.close()
    leaf = tree.leaves()[0]  # scored as the engine scores an episode (a reward may read the whole episode)
    tree.set_reward(leaf, episode_reward(env.reward, example, tree.nodes[leaf].info["answer"], tree, leaf))
    return tree


class ReferenceTrajectories:
    """The reference trajectory tau* of each example, as text: the task's scripted demonstration
    (:mod:`agentcredit.train.demos`: kb-multihop's ``info["chain"]``, a row's ``info["demo_calls"]``, the
    arith-tools script) played through the episode's own protocol and tools, so that it reads exactly like the
    student's turns (policy turns and tool outputs, the prompt left out).

    A teacher conditioned on it can disagree with a student's tool call, which an answer alone cannot (the
    paper's teacher state "constructed from the same prompt under a reference trajectory tau*" is a method's,
    :meth:`agentcredit.credit.signals.ProviderContext.reference_trajectories`). Each example is played once, the
    first time it is asked for, and kept (the scripted calls and the tools are deterministic), so later steps run
    no tool for it. A protocol without scripted demonstrations raises :class:`~agentcredit.credit.signals.NoReference`.
    """

    def __init__(self, env: Environment, tokenizer: Any, protocol_name: str):
        self.env, self.tokenizer = env, tokenizer
        try:
            self.policy = scripted_policy(protocol_name, env.protocol, tokenizer=tokenizer)
        except ValueError as exc:
            raise NoReference(str(exc)) from None
        self._texts: dict[str, str] = {}

    def __call__(self, example: Example) -> str:
        if example.id not in self._texts:
            tree = demonstration(self.env, self.tokenizer, example, self.policy)
            self._texts[example.id] = reference_text(tree, self.tokenizer.eos_token)
        return self._texts[example.id]


def reference_text(tree: RolloutTree, eos_text: str | None = None) -> str:
    """The text of a single-episode tree after its prompt: every policy turn and tool output in order, a policy
    turn's closing EOS text (``eos_text``, which the replay appends to a turn the protocol does not end by
    itself) removed, since inside the teacher's prompt it would end the message it is quoted in."""
    parts = []
    for node in tree.path(tree.leaves()[0])[1:]:
        segment = tree.segment(node)
        text = segment.text
        if segment.is_policy and eos_text and text.endswith(eos_text):
            text = text[: -len(eos_text)]
        parts.append(text)
    return "".join(parts).strip()


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)


class _DemoTools:
    """The environment's tools for one demonstration. A result that is an infrastructure failure (a tool that could
    not run, ``ToolResult.infra``) raises ToolUnavailableError; with ``errors``, for the calls a task file scripts
    (``demo_calls``), one that is an error (an ``ERROR:`` answer, a tool that raised) raises a ValueError naming
    the row: neither may become an SFT target. The built-in scripts' tools keep their own error texts (code that
    prints "ERROR: ..." is an answer)."""

    def __init__(self, tools: Any, where: str, *, errors: bool):
        self.tools, self.where, self.turn, self.errors = tools, where, 0, errors

    def __getattr__(self, name: str) -> Any:  # a per-episode environment's episodes, done and reward
        return getattr(self.tools, name)

    def run(self, calls: Sequence[Any]) -> list[Any]:
        results = self.tools.run(calls)
        self.turn += 1
        broken = [r for r in results if r.infra]
        if broken:
            raise ToolUnavailableError(
                f"demonstrations stopped: the {broken[0].name!r} tool could not run, so the demonstration would "
                f"teach its infrastructure error as the tool's answer: {broken[0].output[:500]}"
            )
        for j, (call, result) in enumerate(zip(calls, results, strict=True)):
            if self.errors and not result.ok:
                raise ValueError(
                    f"{self.where}: the demonstration's call {j} of tool turn {self.turn - 1}, {call.name}"
                    f"({json.dumps(call.arguments, ensure_ascii=False)[:120]}), answered {result.output[:300]!r}; "
                    "a demonstration must not teach an error as the tool's answer: fix the row's demo_calls "
                    "or the tool"
                )
        return results


def rejection_sample(
    engine: Any, strategy: Any, env: Environment, examples: Sequence[Example], *, threshold: float = 1.0
) -> list[RolloutTree]:
    """The model's own episodes (one tree per question), pruned to the leaves whose reward reaches ``threshold``.

    Raises ToolUnavailableError when an episode holds an infrastructure failure (a tool that could not run).
    """
    kept = []
    trees = engine.run(list(examples), strategy, env.reward)
    raise_on_infra_failures(trees, "rejection sampling")
    for tree in trees:
        good = [leaf for leaf, r in tree.outcomes().items() if r >= threshold]
        if good:
            kept.append(tree.prune(good)[0])
    return kept


@dataclass
class SFTResult:
    losses: list[float]
    tokens: int
    seconds: float


#: the file of an SFT checkpoint inside its directory (:func:`sft`'s ``checkpoint_dir``)
SFT_CHECKPOINT = "sft-checkpoint.pt"


class SFTCheckpointMismatch(ValueError):
    """An SFT checkpoint that belongs to other demonstrations or settings than the run resuming from it."""


def sft(
    model: torch.nn.Module,
    trees: Sequence[RolloutTree],
    *,
    pad_id: int,
    epochs: int = 1,
    batch_trajectories: int = 8,
    lr: float = 5e-5,
    weight_decay: float = 0.0,
    grad_clip: float = 1.0,
    seed: int = 0,
    autocast: bool = False,
    max_tokens: int = MICRO_BATCH_TOKENS,
    on_step: Callable[[int, float], None] | None = None,
    progress: bool = False,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int = 1,
    log: Callable[[str], None] | None = None,
) -> SFTResult:
    """Token-mean NLL on the policy tokens of every trajectory in ``trees``; ``progress`` shows steps and an ETA.

    ``checkpoint_dir``: after every ``checkpoint_every``-th optimizer step (and the last) the trainable weights, the
    optimizer's state, the steps done, the losses so far, the elapsed seconds and torch's RNG state are written
    there atomically (:data:`SFT_CHECKPOINT`); on entry a checkpoint found there is loaded and training continues
    from the next step with the same data order, so the losses and final weights equal an uninterrupted run's.
    A checkpoint of other demonstrations or settings (its fingerprint) raises :class:`SFTCheckpointMismatch`.
    None (the default): nothing is written. The caller deletes the directory once the model is saved.
    """
    if not trees:
        raise ValueError("sft: no demonstrations to train on")
    if checkpoint_every < 1:
        raise ValueError(f"sft: checkpoint_every must be >= 1, got {checkpoint_every}")
    batch = build_batch(list(trees), pad_id=pad_id)
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    optimizer = adamw(params, lr=lr, weight_decay=weight_decay)
    rng = random.Random(seed)
    losses, start, step = [], time.perf_counter(), 0
    steps = epochs * math.ceil(len(batch.trajectories) / batch_trajectories)
    path = Path(checkpoint_dir) / SFT_CHECKPOINT if checkpoint_dir is not None else None
    fingerprint = _fingerprint(
        batch, named, steps=steps, epochs=epochs, batch_trajectories=batch_trajectories, lr=lr,
        weight_decay=weight_decay, grad_clip=grad_clip, seed=seed, autocast=autocast, max_tokens=max_tokens,
    )  # fmt: skip
    done, before = 0, 0.0
    if path is not None and path.is_file():
        done, losses, before = _load_checkpoint(path, fingerprint, named, optimizer)
        if log is not None:
            log(f"SFT: resuming from step {done} of {steps} ({path})")
    with Progress("sft", total=steps, unit="steps", enabled=progress) as bar:
        if done:
            bar.advance(done, info="resumed")
        model.train()
        for _ in range(epochs):
            order = list(range(len(batch.trajectories)))
            rng.shuffle(order)  # replayed for the steps a resumed run skips: the same order as one run
            for s in range(0, len(order), batch_trajectories):
                if step < done:
                    step += 1
                    continue
                rows = [r for j in order[s : s + batch_trajectories] for r in batch.trajectories[j].rows]
                mb = batch.select(rows)
                weights = aggregation_weights(mb.policy_mask, "token-mean").float()
                optimizer.zero_grad(set_to_none=True)
                total = 0.0
                # as the RL update: rows that share a prefix (the system prompt, the question) are packed and the
                # prefix forwarded once, equal to row-by-row forwarding up to float rounding (models.packing)
                for micro in micro_batches(model, row_tokens(mb), max_tokens):
                    sub = mb.select(micro)
                    scores = score_tokens(
                        model,
                        sub.input_ids,
                        sub.attention_mask,
                        sub.policy_mask,
                        with_entropy=False,
                        autocast=autocast,
                        share_prefixes=True,
                    )
                    w = weights[micro][:, : sub.input_ids.shape[1]].to(scores.logprobs.device)
                    loss = -(scores.logprobs * w).sum()
                    loss.backward()
                    total += float(loss.detach())
                torch.nn.utils.clip_grad_norm_(params, grad_clip)
                optimizer.step()
                # freed now, not kept until the next step: the gradients are as large as the weights
                optimizer.zero_grad(set_to_none=True)
                losses.append(total)
                step += 1
                if path is not None and (step % checkpoint_every == 0 or step == steps):
                    seconds = before + time.perf_counter() - start
                    _save_checkpoint(path, fingerprint, named, optimizer, step, losses, seconds)
                bar.advance(info=f"loss {total:.4f}")
                if on_step is not None:
                    on_step(step, total)
    model.eval()
    return SFTResult(losses, int(batch.policy_mask.sum()), before + time.perf_counter() - start)


def _fingerprint(batch: Any, named: Sequence[tuple[str, torch.Tensor]], **settings: Any) -> dict[str, Any]:
    """What an SFT checkpoint must agree on to be resumed: the settings that decide the steps, the number of
    trajectories, a hash of the demonstrations' token ids and policy masks, and the trainable weights' names and
    shapes."""
    digest = hashlib.sha256()
    for tensor in (batch.input_ids, batch.attention_mask, batch.policy_mask):
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    for trajectory in batch.trajectories:
        digest.update(str(list(trajectory.rows)).encode())
    weights = hashlib.sha256(str([(n, tuple(p.shape), str(p.dtype)) for n, p in named]).encode())
    return {
        **settings,
        "trajectories": len(batch.trajectories),
        "tokens": digest.hexdigest(),
        "weights": weights.hexdigest(),
    }


def _save_checkpoint(
    path: Path,
    fingerprint: dict[str, Any],
    named: Sequence[tuple[str, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    step: int,
    losses: list[float],
    seconds: float,
) -> None:
    """Written to a temporary name and renamed over ``path``: a run killed while writing leaves the last whole one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "fingerprint": fingerprint,
        "step": step,
        "losses": list(losses),
        "seconds": seconds,
        "weights": {name: p.detach() for name, p in named},
        "optimizer": optimizer.state_dict(),
        "torch_rng": torch.get_rng_state(),
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _load_checkpoint(
    path: Path,
    fingerprint: dict[str, Any],
    named: Sequence[tuple[str, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
) -> tuple[int, list[float], float]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    theirs = state.get("fingerprint", {})
    differ = sorted(k for k in set(theirs) | set(fingerprint) if theirs.get(k) != fingerprint.get(k))
    if differ:
        shown = ", ".join(f"{k}: {theirs.get(k)!r} there, {fingerprint.get(k)!r} now" for k in differ)
        raise SFTCheckpointMismatch(
            f"{path}: this SFT checkpoint belongs to other demonstrations or settings ({shown}); "
            f"delete {path.parent} to train from the start"
        )
    with torch.no_grad():
        for name, p in named:
            p.copy_(state["weights"][name])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["step"]), [float(x) for x in state["losses"]], float(state["seconds"])
