"""The lab: what measures the library, kept apart from it.

``study`` trains several methods from one start on several seeds and compares them on held-out sets fixed
before the runs (``preflight`` the regime, power and budget measured before any
arm, ``power`` their statistics, ``study_report`` the comparison); ``mechanism`` holds the mechanism probes
(``agentcredit probe``), ``probe`` the per-step credit probe, ``bench`` the training-step, rollout and FLOP
benchmarks (``agentcredit bench``). The lab imports the library; nothing in the library imports the lab (an
import-linter contract in pyproject.toml), and the CLI imports it only inside the lab's own commands.
"""
