"""BFCL v4 as a task family (issue 38): read from the installed bfcl-eval, scored by bfcl-eval's own checker.

The agreement test feeds the same fixed model messages (Hermes ``<tool_call>`` blocks, the chat protocol's dialect for
SmolLM2 and Qwen) to agentcredit's scoring (protocol ``chat`` -> answer -> :func:`bfcl_reward`) and to bfcl-eval's own
evaluator (its Hermes decoder ``QwenFCHandler.decode_ast`` and ``eval_runner``'s per-entry evaluation), and needs the
same verdict on every one.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from agentcredit.protocols.native import ChatToolProtocol, write_calls
from agentcredit.tasks import Example, bfcl, load_task

needs_bfcl = pytest.mark.skipif(
    importlib.util.find_spec("bfcl_eval") is None,
    reason="bfcl-eval is not installed (make setup-bfcl; `make test` installs it)",
)


# ------------------------------------------------------------------------------------------- no bfcl-eval needed
def test_ground_truth_calls_take_each_first_accepted_value_and_leave_out_optional_ones():
    truth = [
        {"calc.area": {"base": [10], "height": [5, 5.0], "unit": ["", "units"]}},
        {"f": {"x": ["a", "b"]}},
    ]
    assert bfcl.ground_truth_calls(truth) == [
        {"name": "calc.area", "arguments": {"base": 10, "height": 5}},
        {"name": "f", "arguments": {"x": "a"}},
    ]


def test_ground_truth_calls_resolve_nested_option_lists_and_can_skip_a_listed_omission():
    truth = [{"q": {"where": [{"field": ["age", "Age"], "limit": ["", 5]}], "eff": ["", 25.0], "n": [3]}}]
    assert bfcl.ground_truth_calls(truth) == [{"name": "q", "arguments": {"where": {"field": "age"}, "n": 3}}]
    assert bfcl.ground_truth_calls(truth, skip_omission=True) == [
        {"name": "q", "arguments": {"where": {"field": "age", "limit": 5}, "eff": 25.0, "n": 3}}
    ]


@needs_bfcl
def test_every_training_question_has_a_demonstration_the_checker_accepts():
    """Regression: taking each first option as it stands left 9 of the 600 training questions (nested dict
    answers such as simple_python_89, a required parameter listed as ``["", 25.0]``) with a demonstration that BFCL's
    own checker rejects, so SFT silently dropped them."""
    examples = load_task("bfcl:simple_python,multiple")
    assert len(examples) == 600
    for example in examples:
        calls = {"calls": example.info["demo_calls"][0]}
        assert bfcl.verdict(example, json.dumps(calls))["valid"], example.id


def test_decoded_answer_reads_the_protocols_three_answer_forms():
    calls = {"calls": [{"name": "a.b", "arguments": {"x": 1}}, {"name": "c", "arguments": {}}]}
    assert bfcl.decoded_answer(json.dumps(calls)) == [{"a.b": {"x": 1}}, {"c": {}}]
    assert bfcl.decoded_answer(json.dumps({"text": "no call needed"})) == []
    assert bfcl.decoded_answer(None) is None


def test_category_names_groups_and_unsupported_categories():
    assert bfcl.categories_of("bfcl:simple_python, multiple,simple_python") == ["simple_python", "multiple"]
    assert bfcl.categories_of("bfcl:all") == list(bfcl.CATEGORIES)
    with pytest.raises(ValueError, match="simple_java.*not supported"):
        bfcl.categories_of("bfcl:simple_java")
    with pytest.raises(ValueError, match="unknown BFCL category 'nope'"):
        load_task("bfcl:nope")
    # the training task's split: held-out categories are never training categories
    assert set(bfcl.TRAIN_CATEGORIES) == {"simple_python", "multiple"}
    assert not set(bfcl.TRAIN_CATEGORIES) & set(bfcl.HELDOUT_CATEGORIES)
    assert set(bfcl.TRAIN_CATEGORIES) | set(bfcl.HELDOUT_CATEGORIES) == set(bfcl.CATEGORIES)


def test_leaderboard_metrics_use_the_leaderboards_column_names():
    summary = {"irrelevance/accuracy": 0.75, "live_relevance/accuracy": 0.5, "accuracy": 0.6}
    assert bfcl.leaderboard_metrics(summary) == {
        "Non-Live Irrelevance Detection (irrelevance)": 0.75,
        "Live Relevance Detection (live_relevance)": 0.5,
    }


def test_summary_tables_are_empty_for_a_task_that_is_not_bfcl():
    assert bfcl.summary_tables("arith-tools", {"accuracy": 0.5}) == {}


@needs_bfcl
def test_summary_tables_carry_the_leaderboard_and_checker_version_for_eval_and_train():
    """Regression: train's eval_summary.json had ``leaderboard: null`` where `agentcredit eval` filled it in; both
    now take their tables from this one function."""
    tables = bfcl.summary_tables("bfcl:irrelevance", {"irrelevance/accuracy": 1.0})
    assert tables["leaderboard"] == {"Non-Live Irrelevance Detection (irrelevance)": 1.0}
    assert tables["bfcl_eval_version"] == bfcl.bfcl_eval().version
    for module in ("eval/runner.py", "run.py"):
        source = (Path(bfcl.__file__).parents[1] / module).read_text(encoding="utf-8")
        assert "summary_tables(" in source, module


def _episode(protocol: ChatToolProtocol, example: Example, message: str):
    state = protocol.new_episode(example.question, **example.info["episode_options"])
    return protocol.read_segment(state, message + "<|im_end|>", "eos")


def test_chat_protocol_ends_a_calls_end_episode_at_the_first_message_without_running_its_calls():
    """Single-turn: the calls are the answer (recorded on the turn, not run: a done turn's calls never run)."""
    example = Example(
        "q", "Area of a 10 by 5 triangle?", [], "bfcl:x", {"episode_options": {"calls_end_episode": True}}
    )
    protocol = ChatToolProtocol()
    text = write_calls([("calc.area", {"base": 10}), ("calc.area", {"base": 11})], "hermes")
    turn = _episode(protocol, example, text + "\n<tool_call>\n{bad json\n</tool_call>")
    assert turn.done and [c.name for c in turn.calls] == ["calc.area", "calc.area"]
    assert json.loads(turn.answer) == {
        "calls": [
            {"name": "calc.area", "arguments": {"base": 10}},
            {"name": "calc.area", "arguments": {"base": 11}},
        ]
    }
    plain = _episode(protocol, example, "It is 25.")
    assert plain.done and json.loads(plain.answer) == {"text": "It is 25."}
    # without the option the same message is an ordinary tool turn
    state = protocol.new_episode(example.question)
    assert not protocol.read_segment(state, text + "<|im_end|>", "eos").done


def test_chat_protocol_shows_each_episodes_own_tools(tiny_tokenizer):
    schema = {"name": "geo.distance", "description": "d", "parameters": {"type": "object", "properties": {}}}
    protocol = ChatToolProtocol()  # no tools of its own: they come with each episode
    state = protocol.new_episode("How far?", schemas=[schema], system_prompt="Be brief.")
    prompt = protocol.prompt(state, tiny_tokenizer)
    assert '"geo.distance"' in prompt and "Be brief." in prompt
    assert "geo.distance" not in protocol.prompt(protocol.new_episode("How far?"), tiny_tokenizer)


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from agentcredit.models.tiny import tiny_llama

    return tiny_llama(seed=0)[1]


# ------------------------------------------------------------------------------------------------ bfcl-eval
@needs_bfcl
def test_the_installed_bfcl_eval_loads_a_category_and_its_checker():
    """The way of installing (make setup-bfcl): the pinned wheel, its data and checker import without its SDKs."""
    b = bfcl.bfcl_eval()
    assert b.version == bfcl.BFCL_EVAL_VERSION
    examples = load_task("bfcl:simple_python", limit=3, seed=0)
    assert len(examples) == 3 and all(e.task == "bfcl:simple_python" for e in examples)
    for example in examples:
        info = example.info
        assert info["metric"] == "bfcl" and info["tier"] == "simple_python"
        names = [s["function"]["name"] for s in info["episode_options"]["schemas"]]
        assert names == [f["name"] for f in info["bfcl_functions"]]  # dotted names kept
        # BFCL's types became JSON schema (dict -> object ...), so the protocol accepts them
        ChatToolProtocol(schemas=info["episode_options"]["schemas"])
        # the ground-truth demonstration passes BFCL's own checker
        calls = {"calls": info["demo_calls"][0]}
        assert bfcl.verdict(example, json.dumps(calls)) == {"valid": True, "error": []}
    assert load_task("bfcl:simple_python", limit=3, seed=0)[0].id == examples[0].id  # seeded subset
    assert len(load_task("bfcl:parallel,irrelevance", limit=2)) == 4  # limit is per category


def _bfcl_entry(category: str, index: int):
    b = bfcl.bfcl_eval()
    prompt = b.load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False)[index]
    truth = None
    if bfcl.CATEGORIES[category].kind == "ast":
        truth = b.load_ground_truth_entry(category)[index]["ground_truth"]
    example = next(e for e in load_task(f"bfcl:{category}") if e.id == prompt["id"])
    return prompt, truth, example


def _messages(category: str, example: Example) -> dict[str, str]:
    """A handful of fixed model messages for one question: right, wrong and no-call ones."""
    if bfcl.CATEGORIES[category].kind != "ast":
        fn = example.info["bfcl_functions"][0]
        required = fn["parameters"].get("required", [])
        return {
            "text": "I cannot help with that using these functions.",
            "call": write_calls([(fn["name"], {k: "x" for k in required})], "hermes"),
            "bad-json": '<tool_call>\n{"name": oops}\n</tool_call>',
        }
    calls = [(c["name"], c["arguments"]) for c in example.info["demo_calls"][0]]
    first_name, first_args = calls[0]
    wrong_value = {
        k: (v + 1 if isinstance(v, int) and not isinstance(v, bool) else "WRONG")
        for k, v in first_args.items()
    }
    return {
        "right": write_calls(calls, "hermes"),
        "right-reversed": write_calls(list(reversed(calls)), "hermes"),
        "wrong-value": write_calls([(first_name, wrong_value), *calls[1:]], "hermes"),
        "wrong-name": write_calls([(first_name + "_x", first_args), *calls[1:]], "hermes"),
        "one-too-few": write_calls(calls[:-1], "hermes") if len(calls) > 1 else "",
        "text": "The answer is 42.",
    }


@needs_bfcl
@pytest.mark.parametrize(
    ("category", "index"),
    [("simple_python", 0), ("multiple", 3), ("parallel", 0), ("parallel_multiple", 0), ("live_simple", 0),
     ("irrelevance", 0), ("live_irrelevance", 0), ("live_relevance", 0)],
)  # fmt: skip
def test_agentcredit_and_bfcl_evals_own_evaluator_give_the_same_verdicts(category, index):
    pytest.importorskip("openai", reason="bfcl-eval's Hermes decoder imports openai (the bfcl extra)")
    pytest.importorskip("pandas", reason="bfcl-eval's eval_runner imports pandas (the bfcl extra)")
    bfcl.bfcl_eval()  # registers the stand-in model config before bfcl-eval's runner imports it
    from bfcl_eval.constants.enums import Language, ReturnFormat
    from bfcl_eval.eval_checker import eval_runner
    from bfcl_eval.model_handler.local_inference.qwen_fc import QwenFCHandler

    handler = QwenFCHandler("Qwen/Qwen3-8B", 0.001, bfcl.CHECKER_MODEL_NAME, True)
    prompt, truth, example = _bfcl_entry(category, index)
    protocol = ChatToolProtocol()
    verdicts = {}
    for label, message in _messages(category, example).items():
        if not message:
            continue
        ours = bfcl.bfcl_reward(example, _episode(protocol, example, message).answer) == 1.0
        if truth is None:
            theirs = eval_runner._evaluate_single_relevance_entry(
                handler, prompt["id"], message, prompt, bfcl.CHECKER_MODEL_NAME, category
            )
        else:
            theirs = eval_runner._evaluate_single_ast_entry(
                handler, prompt["id"], message, truth, prompt, bfcl.CHECKER_MODEL_NAME, category,
                language=Language.PYTHON, return_format=ReturnFormat.PYTHON,
            )  # fmt: skip
        verdicts[label] = (ours, theirs["valid"])
    assert all(o == t for o, t in verdicts.values()), verdicts
    # the handful is informative: each question has at least one accepted and one rejected message
    assert {o for o, _ in verdicts.values()} == {True, False}, verdicts


@needs_bfcl
def test_bfcl_examples_are_scored_by_the_checker_in_the_environment_and_need_the_chat_protocol():
    from agentcredit.config import load_config
    from agentcredit.environment import build_environment
    from agentcredit.rewards import outcome_reward

    example = load_task("bfcl:irrelevance", limit=1)[0]
    assert outcome_reward(example, json.dumps({"text": "no"})) == 1.0
    assert outcome_reward(example, json.dumps({"calls": [{"name": "f", "arguments": {}}]})) == 0.0
    with pytest.raises(ValueError, match="scored by BFCL's checker only"):
        outcome_reward(example, None, metric="em")
    with pytest.raises(ValueError, match="set protocol.name=chat"):
        build_environment(load_config("grpo-bfcl", ["protocol.name=jsoncall"]))
    env = build_environment(load_config("grpo-bfcl", ["model.name=tiny"]))
    env.close()


@needs_bfcl
def test_sft_demonstrations_of_bfcl_are_the_ground_truth_calls_and_pass_the_checker(tiny_tokenizer):
    from agentcredit.config import load_config
    from agentcredit.environment import build_environment
    from agentcredit.train.sft import demonstrations

    env = build_environment(load_config("grpo-bfcl", ["model.name=tiny"]))
    try:
        examples = load_task("bfcl:simple_python,multiple", limit=3, seed=1)
        trees = demonstrations(env, tiny_tokenizer, examples, "chat")
    finally:
        env.close()
    assert len(trees) == len(examples)  # every ground-truth demonstration is accepted by the checker
    for tree, example in zip(trees, examples, strict=True):
        (policy,) = [tree.segment(i) for i in range(len(tree.nodes)) if tree.segment(i).role == "policy"]
        assert "<tool_call>" in policy.text
        assert (
            example.info["bfcl_functions"][0]["name"] in tree.segment(0).text
        )  # its own tools in the prompt


# ------------------------------------------------------------------------------------------------ studies
def _bfcl_study(heldout: list[dict], preset: str = "grpo-bfcl") -> dict:
    return {
        "name": "bfcl-heldout",
        "set": ["model.name=tiny"],
        "start": {"preset": preset},
        "heldout": heldout,
        "seeds": [0],
        "steps": 1,
        "arms": [{"name": "grpo", "preset": preset}],
    }


def _write(path, data):
    import yaml

    path.write_text(yaml.safe_dump(data))
    return path


def test_a_study_names_a_bfcl_category_as_a_held_out_set_and_old_fingerprints_stay(tmp_path):
    from agentcredit.lab.study import HeldoutSpec, StudyError, load_study

    spec = load_study(_write(tmp_path / "s.yaml", _bfcl_study([{"name": "irr", "task": "bfcl:irrelevance"}])))
    assert spec.heldout[0].task == "bfcl:irrelevance"
    # a set without its own task serialises as before the field existed (fingerprints of older studies unchanged)
    assert "task" not in HeldoutSpec(name="test").model_dump()
    with pytest.raises(StudyError, match="simple_java.*not supported"):
        load_study(_write(tmp_path / "j.yaml", _bfcl_study([{"name": "j", "task": "bfcl:simple_java"}])))
    with pytest.raises(StudyError, match=r"heldout.0.task: 'bfcl:irrelevance' .* needs protocol chat"):
        load_study(
            _write(
                tmp_path / "c.yaml",
                _bfcl_study([{"name": "i", "task": "bfcl:irrelevance"}], "grpo-arith-tools"),
            )
        )


@needs_bfcl
def test_a_studys_bfcl_held_out_set_is_written_from_bfcl_eval(tmp_path):
    from agentcredit.lab.study import Study, load_study

    heldout = [
        {"name": "irr", "task": "bfcl:irrelevance", "limit": 3, "seed": 2},
        {"name": "own", "limit": 2},
    ]
    study = Study(load_study(_write(tmp_path / "s.yaml", _bfcl_study(heldout))), tmp_path / "out")
    study.dir.mkdir()
    study._fix_heldout()
    sets = study.heldout_sets()
    assert [e.id for e in sets["irr"]] == [e.id for e in load_task("bfcl:irrelevance", limit=3, seed=2)]
    assert all(e.info["bfcl_category"] == "irrelevance" for e in sets["irr"])
    assert {e.info["bfcl_category"] for e in sets["own"]} <= set(
        bfcl.TRAIN_CATEGORIES
    )  # the study's own task
