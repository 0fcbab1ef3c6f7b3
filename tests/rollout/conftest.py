"""Fixtures for the rollout tests; the helpers they use live in ``rollout_helpers`` (a unique module name:
every test directory has a ``conftest``, so ``from conftest import ...`` would pick whichever loaded first)."""

from __future__ import annotations

import pytest
from rollout_helpers import make_tools, one_thread, overfit_on_demos

from agentcredit.models.tiny import tiny_llama


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="session")
def tiny():
    """The random tiny Llama and the SmolLM2 tokenizer (do not train this one: it is shared)."""
    return tiny_llama(seed=0)


@pytest.fixture(scope="session")
def trained_tiny(tiny):
    """A tiny Llama overfit on :data:`DEMOS` (all protocols at once), with the tokenizer."""
    _, tokenizer = tiny
    model, _ = tiny_llama(
        seed=1, tokenizer=tokenizer, hidden_size=64, intermediate_size=256, initializer_range=0.1
    )
    overfit_on_demos(model, tokenizer)
    return model, tokenizer


@pytest.fixture
def tools():
    runtime = make_tools()
    yield runtime
    runtime.close()
