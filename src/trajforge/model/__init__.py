"""The model boundary: the only package that speaks to an LLM (HTTP or in-process llama.cpp)."""
