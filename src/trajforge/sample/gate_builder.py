"""The model gate of a process that runs samples, built from the run's configuration.

Shared by the local executor and every Ray actor (which takes its share of the run's rate
budgets), so both throttle the same way.
"""

from __future__ import annotations

from trajforge.config import RunConfig
from trajforge.model.gate import ModelGate


def gate_for(config: RunConfig, share: float = 1.0) -> ModelGate:
    """The model gate of a process that runs `share` of the run's sessions (1 locally; a Ray actor
    running 64 of 512 sessions gets 1/8 of each per-minute budget and a ceiling of 64)."""
    rpm, tpm = config.max_requests_per_minute, config.max_tokens_per_minute
    return ModelGate(max(1, round(config.num_workers * share)), adaptive=config.adaptive_concurrency,
                     requests_per_minute=rpm * share if rpm else None,
                     tokens_per_minute=tpm * share if tpm else None)
