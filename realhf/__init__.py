"""realhf: a fully asynchronous RL system for LLM post-training."""

__version__ = "0.1.0"
