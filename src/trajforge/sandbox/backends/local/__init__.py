"""The local backend: a workspace directory and rlimits, no isolation."""
