"""Benchmarks: seconds, tokens and FLOPs of the training step (``train``) and of the rollout engine
(``rollout``), as ``agentcredit bench train|rollout`` and the scripts under ``benchmarks/`` print them."""
