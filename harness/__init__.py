"""Agent tool-pause replay harness: what should an LLM server do with a paused agent's KV cache?"""

__version__ = "0.1.0"
