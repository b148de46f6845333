"""trajforge: run a tool-using LLM agent over a JSONL dataset and save ShareGPT trajectories."""

__version__ = "0.1.0"
