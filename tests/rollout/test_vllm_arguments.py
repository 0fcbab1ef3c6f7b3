"""``rollout.backend: vllm`` on one GPU beside the trainer (issue 50): the arguments vLLM starts with, per device.
Pure: vLLM is not imported (the engine itself is tested in test_vllm_backend.py, on the CPU, with ``make test-vllm``)."""

from __future__ import annotations

import pytest

from agentcredit.config import ConfigError, load_config
from agentcredit.rollout.vllm_backend import llm_arguments


def test_on_a_gpu_vllm_takes_the_stated_share_of_its_memory_beside_the_trainer():
    args = llm_arguments(
        "/m", dtype="bfloat16", device_type="cuda", max_model_len=4096, gpu_memory_fraction=0.25
    )
    assert args["gpu_memory_utilization"] == 0.25 and args["tensor_parallel_size"] == 1
    assert args["dtype"] == "bfloat16"  # the rollout copy's dtype (bf16 under auto precision on a GPU)
    # the CPU build's workarounds stay off the GPU (chunked prefill is fine with CUDA generators)
    assert "enable_chunked_prefill" not in args and "max_num_batched_tokens" not in args
    # weights come only from the trainer's push; nothing is read from or written to disk
    assert args["load_format"] == "dummy" and args["model"] == args["tokenizer"] == "/m"


def test_on_the_cpu_the_arguments_are_as_before():
    args = llm_arguments("/m", dtype="float32", device_type="cpu", max_model_len=2048)
    assert args["enable_chunked_prefill"] is False and args["max_num_batched_tokens"] == 8192
    assert "gpu_memory_utilization" not in args


@pytest.mark.parametrize(
    ("temperature", "mode"), [(1.0, "raw_logprobs"), (0.0, "raw_logprobs"), (0.7, "processed_logprobs")]
)
def test_the_logprobs_vllm_returns_match_the_engines_recorded_distribution(temperature, mode):
    # rollout/logp_gap compares these with the trainer's recomputed log-probs: on either device
    for device in ("cpu", "cuda"):
        assert (
            llm_arguments(
                "/m", dtype="float32", device_type=device, max_model_len=64, temperature=temperature
            )["logprobs_mode"]
            == mode
        )


def test_the_memory_share_is_a_fraction():
    assert load_config("grpo-arith-tools").rollout.vllm_gpu_memory_fraction == 0.3  # TRL's colocate default
    for bad in ("0", "1", "1.5"):
        with pytest.raises(ConfigError, match="rollout.vllm_gpu_memory_fraction"):
            load_config("grpo-arith-tools", [f"rollout.vllm_gpu_memory_fraction={bad}"])
