"""stayer: a harness and runtime for long-horizon LLM agents that finish the job within budget."""

__version__ = "0.1.0"
