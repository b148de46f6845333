"""Isolated per-sample environments: the Sandbox protocol and its backends."""
