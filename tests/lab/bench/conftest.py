"""Fixtures for the benchmark tests: the tiny random Llama (on SmolLM2's tokenizer), torch on one thread."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    # the tiny model's ops are too small to gain from two threads, and OpenMP threads spinning against other
    # processes on a shared machine make them several times slower
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny():
    from agentcredit.models.tiny import tiny_llama

    return tiny_llama(seed=0)
