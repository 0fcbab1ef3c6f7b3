"""Trajectory data model, the multi-turn rollout engine and tree rollout strategies."""

from agentcredit.rollout.tree import FlatSequence, Node, RolloutTree, Segment

__all__ = ["FlatSequence", "Node", "RolloutTree", "Segment"]
