"""The rollout service: the engine run as a long-lived service on one run directory (core), its
state (store), its outcome listener (listener), its HTTP API (http) and the Python API
(rollouts: trajforge.Rollouts)."""
