"""Fixtures of the protocol tests; the helpers live in protocol_helpers.py (a unique module name, so the test
directories' helpers never shadow each other on sys.path)."""

from protocol_helpers import smollm2_tokenizer  # noqa: F401 - a session fixture
