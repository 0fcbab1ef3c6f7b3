"""Fixtures for the benchmark tests: the tiny random Llama (on SmolLM2's tokenizer), torch on one thread."""

from __future__ import annotations

import pytest

from tests.rollout.rollout_helpers import one_thread


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="session")
def tiny():
    from agentcredit.models.tiny import tiny_llama

    return tiny_llama(seed=0)
