"""Your own outcome reward, ``task.reward: "module:function"``, with verl's or TRL's signature (issue 15)."""

from __future__ import annotations

import textwrap

import pytest

from agentcredit.config import load_config
from agentcredit.environment import build_environment
from agentcredit.rewards import UserReward
from agentcredit.rollout.engine import episode_reward
from agentcredit.rollout.tree import RolloutTree, Segment
from agentcredit.tasks import Example

REWARDS = """
import math

seen = []

def verl_style(data_source, solution_str, ground_truth, extra_info=None):
    seen.append((data_source, solution_str, ground_truth, extra_info))
    return {"score": 1.0 if str(ground_truth) in solution_str else 0.25, "acc": True}

def trl_style(completions, ground_truth, **kwargs):
    seen.append((completions, ground_truth, kwargs))
    return [0.5 * len(completions[0].split())]

def not_a_number(data_source, solution_str, ground_truth, extra_info):
    return "high"

def nan(completions, **kwargs):
    return [math.nan]

def skipped(completions, **kwargs):
    return [None]

def numpy_scalar(data_source, solution_str, ground_truth, extra_info):
    import numpy
    return numpy.float32(0.5)

def torch_list(completions, **kwargs):
    import torch
    return torch.tensor([0.25])

def two(completions, **kwargs):
    return [1.0, 2.0]

def raises(data_source, solution_str, ground_truth, extra_info):
    raise KeyError("target")

def unknown(text, gold):
    return 1.0
"""


@pytest.fixture
def rewards(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent(REWARDS))
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    import my_rewards

    return importlib.reload(my_rewards)


def episode():
    """A prompt, a call, its result and the final message: the transcript is everything after the prompt."""
    tree = RolloutTree(Segment([1, 2], "PROMPT", role="prompt", kind="prompt"))
    call = tree.add(Segment([3], "<tool_call>q</tool_call>", role="policy", kind="invoke"), 0)
    result = tree.add(Segment([4], "\ntool: 391\n", role="observation", kind="tool_response"), call)
    leaf = tree.add(Segment([5], "It is 391", role="policy", kind="commit"), result)
    return tree, leaf


EXAMPLE = Example("q7", "What is 17*23?", ["391"], "jsonl:mine.jsonl", {"tier": "hard"})


def test_verl_signature_gets_the_episode_text_and_its_score_is_read_from_a_dict(rewards):
    tree, leaf = episode()
    reward = UserReward("my_rewards:verl_style")
    assert episode_reward(reward, EXAMPLE, "It is 391", tree, leaf) == 1.0
    source, solution, truth, extra = rewards.seen[-1]
    assert source == "jsonl:mine.jsonl" and truth == "391"
    assert solution == "<tool_call>q</tool_call>\ntool: 391\nIt is 391"  # no prompt
    assert extra == {
        "tier": "hard",
        "id": "q7",
        "question": "What is 17*23?",
        "extracted_answer": "It is 391",
    }
    # the task file's own fields are never overwritten (gsm8k-style data keeps its gold "answer" there)
    gsm = Example("q9", "?", ["4"], "jsonl:mine.jsonl", {"answer": "2+2 = 4 #### 4", "question": "raw"})
    reward.score_episode(gsm, "5", "5")
    assert rewards.seen[-1][3] == {
        "id": "q9",
        "question": "raw",
        "answer": "2+2 = 4 #### 4",
        "extracted_answer": "5",
    }
    # a task file's own ground_truth wins over the answers
    gt = Example("q8", "?", ["a", "b"], "jsonl:mine.jsonl", {"ground_truth": {"target": ["zzz"]}})
    assert reward.score_episode(gt, None, "no") == 0.25 and rewards.seen[-1][2] == {"target": ["zzz"]}
    with pytest.raises(TypeError, match="reads the whole episode"):
        reward(EXAMPLE, "391")


def test_trl_signature_gets_one_element_columns(rewards):
    tree, leaf = episode()
    assert (
        episode_reward(UserReward("my_rewards:trl_style"), EXAMPLE, None, tree, leaf) == 3.0
    )  # 6 words * 0.5
    completions, truth, kwargs = rewards.seen[-1]
    assert completions == ["<tool_call>q</tool_call>\ntool: 391\nIt is 391"] and truth == ["391"]
    assert kwargs == {
        "tier": ["hard"], "prompts": ["What is 17*23?"], "completion_ids": [[3, 4, 5]], "extracted_answer": [None]
    }  # fmt: skip


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("not_a_number", r"returned 'high'; a reward must be one finite number"),
        ("nan", r"returned nan; a reward must be one finite number"),
        ("two", r"raised ValueError: returned \[1.0, 2.0\], not a list with one number"),
        ("raises", r"raised KeyError: 'target'"),
        ("skipped", r"returned None; a reward must be one finite number"),
    ],
)
def test_a_broken_reward_stops_with_its_name_and_the_example(rewards, name, message):
    with pytest.raises(
        (ValueError, RuntimeError), match=f"task.reward my_rewards:{name} on example 'q7' {message}"
    ):
        UserReward(f"my_rewards:{name}").score_episode(EXAMPLE, "391", "It is 391")


def test_bad_specs_are_named(rewards):
    with pytest.raises(
        ValueError, match=r"my_rewards:unknown takes \(text, gold\); a reward function takes verl"
    ):
        UserReward("my_rewards:unknown")
    with pytest.raises(ValueError, match="task.reward: module 'my_rewards' has no attribute 'missing'"):
        UserReward("my_rewards:missing")


def test_config_task_reward_replaces_the_built_in_scoring(rewards):
    env = build_environment(load_config("grpo-arith-tools", ["task.reward=my_rewards:verl_style"]))
    try:
        assert isinstance(env.reward, UserReward) and env.reward.style == "verl"
    finally:
        env.close()


def test_numpy_and_torch_numbers_are_numbers(rewards):
    assert UserReward("my_rewards:numpy_scalar").score_episode(EXAMPLE, "391", "391") == 0.5
    assert UserReward("my_rewards:torch_list").score_episode(EXAMPLE, "391", "391") == 0.25


def test_the_solution_is_decoded_without_special_tokens_as_verl_and_trl_decode(rewards):
    """With the tokenizer, the solution is decode(ids, skip_special_tokens=True): no chat-template markers."""

    class Tokenizer:
        def decode(self, ids, skip_special_tokens=False):
            assert skip_special_tokens
            return " ".join(str(i) for i in ids if i != 4)  # 4 plays a special token

    tree, leaf = episode()
    episode_reward(UserReward("my_rewards:verl_style"), EXAMPLE, "It is 391", tree, leaf, Tokenizer())
    assert rewards.seen[-1][1] == "3 5"


def test_a_list_of_rewards_is_their_weighted_sum_and_each_is_kept(rewards):
    """Issue 35: TRL users bring reward_funcs with reward_weights. 0.5 * verl_style (1.0: "391" is in the text)
    + 2.0 * trl_style (0.5 per word; the transcript "<tool_call>q</tool_call> / tool: 391 / It is 391" has 6 words:
    3.0) = 0.5 + 6.0."""
    from agentcredit.rewards import WeightedReward, user_reward

    tree, leaf = episode()
    reward = user_reward(["my_rewards:verl_style", "my_rewards:trl_style"], [0.5, 2.0])
    assert isinstance(reward, WeightedReward) and reward.names == ["verl_style", "trl_style"]
    assert episode_reward(reward, EXAMPLE, "It is 391", tree, leaf) == pytest.approx(0.5 * 1.0 + 2.0 * 3.0)
    assert tree.nodes[leaf].info["reward_parts"] == {"verl_style": 1.0, "trl_style": 3.0}
    assert user_reward(["my_rewards:verl_style", "my_rewards:trl_style"]).weights == [
        1.0,
        1.0,
    ]  # TRL's default
    assert isinstance(user_reward("my_rewards:verl_style"), UserReward)
    with pytest.raises(RuntimeError, match=r"task.reward my_rewards:raises on example 'q7' raised KeyError"):
        user_reward(["my_rewards:verl_style", "my_rewards:raises"]).score_episode(EXAMPLE, "391", "391")


def test_reward_weights_must_match_the_functions(rewards):
    from agentcredit.config import ConfigError

    c = load_config("grpo-arith-tools", ["task.reward=[my_rewards:verl_style, my_rewards:trl_style]",
                                         "task.reward_weights=[1.0, 0.1]"])  # fmt: skip
    assert c.task.reward == ["my_rewards:verl_style", "my_rewards:trl_style"] and c.task.reward_weights == [
        1,
        0.1,
    ]
    with pytest.raises(ConfigError, match="reward_weights has 1 weights for 2 reward function"):
        load_config("grpo-arith-tools", ["task.reward=[my_rewards:verl_style, my_rewards:trl_style]",
                                         "task.reward_weights=[1.0]"])  # fmt: skip
    with pytest.raises(ConfigError, match="reward_weights has 1 weights for 0 reward function"):
        load_config("grpo-arith-tools", ["task.reward_weights=[1.0]"])


def test_each_reward_function_is_logged_per_step_in_metrics_jsonl(rewards, tmp_path):
    import json

    from agentcredit.train.trainer import Trainer

    overrides = [
        "model.name=tiny", "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=8",
        "rollout.max_episode_tokens=16", "train.tensorboard=false", "train.steps=1", "task.limit=4",
        "task.reward=[my_rewards:verl_style, my_rewards:trl_style]", "task.reward_weights=[1.0, 0.0]",
    ]  # fmt: skip
    trainer = Trainer(load_config("grpo-arith-tools", overrides), run_dir=tmp_path / "run")
    try:
        trainer.train(progress=False)
    finally:
        trainer.close()
    (step,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for name in ("verl_style", "trl_style"):
        assert f"rewards/{name}/mean" in step and f"rewards/{name}/std" in step
    assert step["rewards/trl_style/mean"] > 0  # 0.5 per word of the transcript: weighted 0, still logged
    assert step["reward/mean"] == pytest.approx(step["rewards/verl_style/mean"])  # weight 0 on trl_style
