"""The bwrap backend: a sample in namespaces of its own (root: made ahead of time, used once)."""
