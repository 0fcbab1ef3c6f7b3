"""Fixtures of the trainer tests (helpers in train_helpers.py, a module name no other test directory uses)."""

from __future__ import annotations

import pytest
from train_helpers import CHAT, fit_tiny


@pytest.fixture(scope="session")
def fitted_codefence():
    return fit_tiny("grpo-arith-tools")


@pytest.fixture(scope="session")
def fitted_jsoncall():
    return fit_tiny("portool-arith-tools")


@pytest.fixture(scope="session")
def fitted_chat():
    # 35 epochs: with 100 the tiny model answers every question right, so every advantage is 0
    return fit_tiny("grpo-arith-tools", CHAT, epochs=35)
