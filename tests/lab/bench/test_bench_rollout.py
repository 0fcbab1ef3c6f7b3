"""``agentcredit bench rollout`` end to end on the tiny random Llama (the numbers are meaningless; the shape of
the result, the equal work of both loops and the tree-reuse bookkeeping are not)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agentcredit.cli import app
from agentcredit.lab.bench.rollout import BenchSettings, bench_rollout, ceiling_efficiency, format_result

SMALL = BenchSettings(
    prompts=2, episodes=2, max_segment_tokens=12, max_episode_tokens=40, max_turns=2, tree_prompts=1
)


@pytest.mark.slow
def test_bench_rollout_reports_both_loops_and_tree_reuse():
    result = bench_rollout("tiny", settings=SMALL, threads=1, log=lambda _msg: None)
    assert result["engine"]["episodes"] == 2 * 2 and result["naive"]["episodes"] == 2
    for loop in ("engine", "naive", "engine_after"):
        assert result[loop]["generated_tokens"] > 0 and result[loop]["tokens_per_s"] > 0
    assert result["speedup"] == result["engine_tokens_per_s"] / result["naive_tokens_per_s"]
    ceiling = result["ceiling"]
    assert (
        ceiling["batch"] == 2 * 2
        and ceiling["decode_tokens_per_s"] > 0
        and ceiling["prefill_tokens_per_s"] > 0
    )
    assert set(result["of_ceiling"]) == {"decode", "work", "generated"}
    engine = result["engine"]
    assert 0 < engine["decode_step_tokens"] <= engine["generated_tokens"] and engine["decode_seconds"] > 0
    for name in SMALL.trees:
        tree = result["trees"][name]
        assert tree["same_trees"], f"{name}: reuse changed the sampled trees"
        assert tree["reuse"]["tree_nodes"] == tree["no_reuse"]["tree_nodes"]
        assert tree["reuse"]["prefill_tokens"] <= tree["no_reuse"]["prefill_tokens"]
        assert tree["prefill_ratio"] == tree["reuse"]["prefill_tokens"] / tree["no_reuse"]["prefill_tokens"]
    assert result["tree_prefill_ratio"] == result["trees"]["portool"]["prefill_ratio"]
    text = format_result(result)
    assert "speedup engine" in text and "tree portool" in text and "engine / ceiling" in text
    json.dumps(result)  # the --json output must serialise


def test_bench_rollout_cli_rejects_an_unknown_task():
    out = CliRunner().invoke(app, ["bench", "rollout", "--model", "tiny", "--task", "nope", "--json"])
    assert out.exit_code != 0
    assert "task must be one of" in out.output


@pytest.mark.slow
def test_bench_rollout_cli_skip_naive_prints_json_last():
    args = ["bench", "rollout", "--model", "tiny", "--prompts", "2", "--episodes", "2", "--tree-prompts", "1"]
    args += [
        "--max-segment-tokens",
        "8",
        "--max-episode-tokens",
        "24",
        "--threads",
        "1",
        "--skip-naive",
        "--json",
    ]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    result = json.loads(out.output.strip().splitlines()[-1])
    assert "naive" not in result and "speedup" not in result
    assert result["settings"]["max_episode_tokens"] == 24 and result["engine_tokens_per_s"] > 0
    assert 0 < result["tree_prefill_ratio"] <= 1


def test_ceiling_efficiency_by_hand():
    engine = {
        "prefill_tokens": 600,
        "decode_tokens": 100,
        "decode_step_tokens": 90,
        "decode_seconds": 3.0,
        "seconds": 10.0,
        "tokens_per_s": 10.0,
    }
    ceiling = {"prefill_tokens_per_s": 200.0, "decode_tokens_per_s": 50.0}
    share = ceiling_efficiency(engine, ceiling)
    assert share["decode"] == 30.0 / 50.0  # 90 tokens in 3 s of one-token steps, against 50 tok/s
    assert share["work"] == (600 / 200 + 100 / 50) / 10.0  # 3 s + 2 s at the ceiling's rates, 10 s taken
    assert share["generated"] == 10.0 / 50.0


def test_build_task_builds_what_training_builds_and_takes_overrides():
    """The benchmark's protocol and tools come from the task's preset, as in training (it had its own table of
    protocols, so PORTool's jsoncall format could not be benchmarked); --set reaches them."""
    from agentcredit.lab.bench.rollout import build_task

    examples, env = build_task("kb-multihop", 2)
    try:
        assert len(examples) == 2 and env.protocol.name == "tags" and "search" in env.tools.tools
    finally:
        env.close()
    overrides = ("protocol.name=jsoncall", "tools.suite_tools=[knowledge_search]")
    _, env = build_task("kb-multihop", 1, overrides)
    try:
        assert env.protocol.name == "jsoncall" and "knowledge_search" in env.tools.tools
        assert env.reward(examples[0], examples[0].answers[0]) == 1.0
    finally:
        env.close()


@pytest.mark.slow
def test_bench_rollout_closes_the_whole_environment(monkeypatch):
    """Regression: bench rollout closed only the tools, so the MCP servers a ``--set tools.mcp=...`` started stayed
    up until the process exited. It now closes the environment, which stops them too."""
    import agentcredit.lab.bench.rollout as bench

    closed = []

    class Server:
        def close(self):
            closed.append("mcp")

    real = bench.build_task

    def with_a_server(task, prompts, overrides=()):
        examples, env = real(task, prompts, overrides)
        env.resources.append(Server())
        return examples, env

    monkeypatch.setattr(bench, "build_task", with_a_server)
    bench_rollout("tiny", settings=SMALL, threads=1, log=lambda _msg: None, skip_naive=True)
    assert closed == ["mcp"]


def test_bench_rollout_cli_passes_set_and_names_a_bad_key():
    out = CliRunner().invoke(
        app, ["bench", "rollout", "--model", "tiny", "--skip-naive", "-s", "protocol.nope=1", "--json"]
    )
    assert out.exit_code == 2
    assert "protocol.nope" in out.output


@pytest.mark.slow
def test_bench_compare_runs_both_engine_paths_at_each_size_and_the_naive_loop():
    """Issue 33's comparison end to end on the tiny model, jsoncall (a long shared system prompt): both paths at
    both sizes on the same prompts and seed, the shared prefix prefilled once, the ratios printed."""
    from agentcredit.lab.bench.rollout import bench_compare, format_compare

    settings = BenchSettings(
        prompts=3,
        episodes=2,
        max_segment_tokens=4,
        max_episode_tokens=8,
        max_turns=2,
        overrides=("protocol.name=jsoncall", "tools.suite_tools=[knowledge_search]"),
    )
    result = bench_compare(
        "tiny", settings=settings, sizes=((2, 2), (3, 2)), threads=1, repeats=2, log=lambda _m: None
    )
    assert set(result["runs"]) == {"2x2", "3x2"}
    for runs in result["runs"].values():
        before, after = runs["hf_before"], runs["hf_shared_prefix"]
        assert before["shared_prefix_tokens"] == 0 and after["shared_prefix_tokens"] > 0
        assert after["prefill_tokens"] < before["prefill_tokens"]
        assert before["episodes"] == after["episodes"]
        assert 0 < after["of_fp32_peak"] and after["peak_rss_mib"] > 0
        assert len(after["all_seconds"]) == 2 and after["seconds"] == min(after["all_seconds"])
        assert after["cpu_seconds"] > 0
    assert result["naive"]["episodes"] == 2
    text = format_compare(result)
    assert "rollout seconds hf_before / hf_shared_prefix" in text and "load average" in text
    assert set(result["cpu_speedup"]) == {"2x2", "3x2"}
    assert result["baseline"] == "hf_before" and set(result["speedup"]["2x2"]) == {"hf_shared_prefix"}
    # the FLOP accounting (issue 33): what each run fed, computed and needed, and the Amdahl bound
    assert result["fp32_matmul_peak_gflop_per_cpu_second"] > 0
    for size, runs in result["runs"].items():
        before, after = runs["hf_before"], runs["hf_shared_prefix"]
        for r in (before, after):
            f, k = r["flops"], r["prefill_by_kind"]
            assert f["tokens_fed"] == r["prefill_tokens"] + r["decode_tokens"] <= f["tokens_computed"]
            assert f["computed_gflop"]["total"] >= f["real_tokens_gflop"] >= f["needed_gflop"]["total"] > 0
            assert 0 < f["forward_cpu_seconds"] <= r["cpu_seconds"] and f["of_cpu_peak"] > 0
            assert 0 < f["decode_rows_real"] <= f["decode_rows_computed"] and 0 < f["decode_steps"]
            assert 0 < f["decode_gflop"] < f["computed_gflop"]["total"]
            assert (
                k["shared_prompt"] + k["question_prompt"] + k["observations"] + k["refed"]
                == r["prefill_tokens"]
            )
            assert k["refed"] == 0  # independent episodes, no replacement: nothing is fed twice
        # the shared-prefix engine feeds exactly what no engine can skip (same trees: same work needed)
        assert after["flops"]["needed"] == before["flops"]["needed"]
        assert after["flops"]["tokens_fed"] == after["flops"]["needed"]["tokens"]
        bound = result["bound"][size]
        assert bound["max_speedup"] == pytest.approx(before["cpu_seconds"] / bound["min_cpu_seconds"])
        assert 0 < bound["both"]["max_speedup"] <= bound["max_speedup"]
        # the kernel floors: products timed hot (each weight alone) and streamed (every weight once per forward)
        for kernel in (bound["kernel"], bound["kernel_streamed"]):
            assert kernel["rows"] == int(size.split("x")[0]) * 2 and 0 < kernel["min_cpu_seconds"]
            assert kernel["min_cpu_seconds"] == pytest.approx(
                kernel["decode_seconds"]
                + kernel["head_seconds"]
                + kernel["attention_seconds"]
                + kernel["other_seconds"]
            )
        # the hot floor counts all attention at the peak; the streamed one times the sampled tokens' attention
        assert bound["kernel"]["attention_seconds"] == 0
        streamed = bound["kernel_streamed"]
        assert (
            streamed["attention_seconds"] > 0 and streamed["other_seconds"] < bound["kernel"]["other_seconds"]
        )
        need = before["flops"]["needed"]
        assert 0 < need["decode_attention_pairs"] < need["attention_pairs"]
        assert streamed["decode_context"] >= 1
        assert bound["weight_stream"]["steps"] == before["flops"]["needed"]["sequential_steps"] > 0
    assert "Amdahl bound" in text and "GFLOP per CPU-second" in text and "weight-streaming floor" in text
    assert "kernel floor (hot" in text and "kernel floor (streamed" in text


def test_needed_work_and_prefill_decomposition_by_hand():
    """A tree by hand: prompts of 5 and 4 tokens sharing 3; question 0 has one episode that searches (2 sampled
    tokens, a 3-token observation) and answers (2 tokens, a leaf); question 1 has a carl-segment replacement
    (invoke 2, transient observation 4, extraction 3 spliced back to the observation's place, answer 1)."""
    from agentcredit.lab.bench.rollout import needed_work, prefill_decomposition
    from agentcredit.rollout.engine import common_prompt_prefix
    from agentcredit.rollout.tree import RolloutTree, Segment

    a = RolloutTree(Segment([1, 2, 3, 4, 5], role="prompt"))
    n = a.add(Segment([6, 7]), 0)
    n = a.add(Segment([8, 8, 8], role="observation"), n)
    a.add(Segment([9, 10]), n)
    b = RolloutTree(Segment([1, 2, 3, 9], role="prompt"))
    n = b.add(Segment([6, 7]), 0)
    n = b.add(Segment([8, 8, 8, 8], role="observation", transient=True), n)
    n = b.add(Segment([5, 5, 5], info={"spliced": True}), n)
    b.add(Segment([2]), n)
    assert common_prompt_prefix([a.segment(0).token_ids, b.segment(0).token_ids]) == 3
    work = needed_work([a, b])
    # prompts: 3 shared + 2 + 1; observations 3 + 4; fed sampled tokens: a 2 + (2 - 1), b 2 + 3 + (1 - 1)
    assert (
        work["prompt_tokens"] == 6 and work["observation_tokens"] == 7 and work["generated_fed_tokens"] == 8
    )
    # logit rows: one per sampled token (4 + 6), the first token of each policy segment drawn from its parent's row
    assert work["tokens"] == 21 and work["logit_rows"] == 4 + 6
    # pairs (position p reads p + 1): shared prefix at 0..2 -> 1+2+3; a's prompt rest at 3, 4 -> 4+5; a's search
    # at 5, 6 -> 6+7; its observation at 7..9 -> 8+9+10; its answer at 10, 11, a leaf: only 10 is fed -> 11.
    # b's prompt rest at 3 -> 4; invoke at 4, 5 -> 5+6; observation at 6..9 -> 7+8+9+10; extraction sampled at
    # 10..12 -> 11+12+13 (spliced back to 6 afterwards: the re-feed is not needed work); its answer is a leaf's
    # only token (not fed)
    expected = (
        (1 + 2 + 3) + (4 + 5) + (6 + 7) + (8 + 9 + 10) + 11 + 4 + (5 + 6) + (7 + 8 + 9 + 10) + (11 + 12 + 13)
    )
    assert work["attention_pairs"] == expected
    # of which the sampled tokens fed back: a's search 6+7 and answer 11, b's invoke 5+6 and extraction 11+12+13
    assert work["decode_attention_pairs"] == (6 + 7) + 11 + (5 + 6) + (11 + 12 + 13) == 71
    # the longest chain of sampled tokens: b's 2 + 3 + 1 (a: 2 + 2)
    assert work["sequential_steps"] == 6
    # an engine run that prefilled 30 tokens with a 3-token shared prefix: 3 + (5 + 4 - 2 x 3) + 7 + the rest
    assert prefill_decomposition([a, b], 3, 30) == {
        "shared_prompt": 3,
        "question_prompt": 3,
        "observations": 7,
        "refed": 17,
    }
    assert prefill_decomposition([a, b], 0, 16)["question_prompt"] == 9


def test_build_task_passes_the_task_options():
    """Regression: build_task loaded the task without its options, so a study's ``task.options`` (arith-tools'
    tier fractions) did not reach the benchmarked questions."""
    from agentcredit.lab.bench.rollout import build_task

    examples, env = build_task("arith-tools", 6, ["task.options={easy_fraction: 1.0, medium_fraction: 0.0}"])
    try:
        assert {e.info["tier"] for e in examples} == {"easy"}
    finally:
        env.close()


@pytest.mark.slow
def test_bench_compare_refuses_unknown_or_missing_paths():
    from agentcredit.lab.bench.rollout import bench_compare
    from agentcredit.rollout.vllm_backend import vllm_available

    with pytest.raises(ValueError, match="--paths"):
        bench_compare("tiny", paths=["hf_fast"], log=lambda _m: None)
    if not vllm_available():
        with pytest.raises(ValueError, match="vllm is not installed"):
            bench_compare("tiny", sizes=((2, 2),), paths=["vllm"], skip_naive=True, log=lambda _m: None)
