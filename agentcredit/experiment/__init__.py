"""Experiments: the commands that train and evaluate together.

``run`` holds the bodies of ``agentcredit train / sft / warmup / demo`` (a trainer plus held-out evaluation,
checkpoints and reports); ``study`` trains several methods from one start on several seeds and compares them on
held-out sets fixed before the runs; ``study_report`` writes that comparison. This layer sits above ``eval`` and
``train`` (see docs/architecture.md).
"""
