"""agentcredit: RL for tool-using LLM agents with fine-grained credit assignment."""

__version__ = "0.1.0"
