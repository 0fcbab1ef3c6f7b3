"""Policies and heads: the embedded SmolLM2-135M-Instruct and any local HF model (:mod:`.embedded`,
``load_model``), the tiny random Llama for tests (:mod:`.tiny`, ``tiny_llama``), value heads and scoring.

Submodules are imported explicitly (``from agentcredit.models.embedded import load_model``) so that importing
the package stays free of torch / transformers.
"""
