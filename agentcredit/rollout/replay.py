"""Play given policy texts through a protocol and real tools, producing the same tree the engine would.

Used for demonstrations (SFT) and for tests: the scripted policy writes the text of each policy segment, the
protocol reads it exactly as in a rollout (segment kind, tool calls, answer), the tools really run, and the
observations are tokenised alone and appended. A segment the protocol does not end by itself ends at EOS, as in
the engine (the EOS token is part of the segment, its text included).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentcredit.protocols.base import Protocol
from agentcredit.rollout.tree import RolloutTree, Segment
from agentcredit.tools.base import ToolRuntime

# (turn index, last observation text or None) -> the next policy segment's text
NextText = Callable[[int, "str | None"], str]


def replay(
    protocol: Protocol,
    tokenizer: Any,
    tools: ToolRuntime,
    question: str,
    next_text: NextText,
    *,
    reward_fn: Callable[[str | None], float] | None = None,
    max_turns: int | None = None,
    episode_options: dict[str, Any] | None = None,
) -> RolloutTree:
    """One episode as a single-path tree; ``reward_fn(answer)`` scores its leaf (0.0 when not given).

    ``episode_options``: the protocol's per-episode options (an example's ``info["episode_options"]``, as the
    engine passes them)."""
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos_id, eos_text = tokenizer.eos_token_id, tokenizer.eos_token
    state = protocol.new_episode(question, **(episode_options or {}))
    prompt = protocol.prompt(state, tokenizer)
    tree = RolloutTree(Segment(encode(prompt), prompt, role="prompt", kind="prompt"))
    node, observation, answer = 0, None, None
    limit = max_turns or protocol.max_segments
    for turn_index in range(limit):
        text = next_text(turn_index, observation)
        if protocol.segment_ends(state, text):
            finish, ids = "stop", encode(text)
        else:
            finish, ids = "eos", encode(text) + [eos_id]
            text = text + eos_text
        turn = protocol.read_segment(state, text, finish)
        protocol.record(state, turn, text)
        segment = Segment(ids, text, role="policy", kind=turn.kind, info={"finish": finish})
        segment.info["calls"] = [c.to_dict() for c in turn.calls]
        node = tree.add(segment, node)
        if turn.done:
            segment.info.update(turn.info)
            answer = turn.answer
            break
        results = tools.run(turn.calls) if turn.calls else []
        if turn.calls and getattr(tools, "reward", None) is not None:  # a per-episode environment's step
            segment.info["env_reward"] = tools.reward
            if tools.done:  # it ended the episode: its results are recorded, not shown (as in the engine)
                protocol.observation(state, turn, results)  # completes turn.info; its text is dropped
                segment.info.update(turn.info)
                segment.info["results"] = [r.to_dict() for r in results]
                break
        obs = protocol.observation(state, turn, results)
        segment.info.update(turn.info)
        observation = None
        if obs is not None and obs.text:
            observation = obs.text
            node = tree.add(
                Segment(
                    encode(obs.text), obs.text, role="observation", kind=obs.kind, transient=obs.transient
                ),
                node,
            )
    tree.set_reward(node, reward_fn(answer) if reward_fn is not None else 0.0)
    tree.nodes[node].info.update(
        {"answer": answer, "n_tool_calls": state.n_tool_calls, "n_turns": state.n_turns}
    )
    return tree
