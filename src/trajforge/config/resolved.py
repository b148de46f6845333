"""Resolved: what a run decides at its start where its settings leave a choice open.

Made once by the runner's preflight (runner/preflight.py) and attached to the run's configuration
(RunConfig.resolve): the settings stay as the user gave them, and everything after the start
(the executors, each sample's model client and sandbox, config.json, statistics) reads the
decision from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Resolved:
    # The model samples call: --model; `local` when the bundled model stands in for a missing key
    # (no model named, no URL); `oracle` under --agent oracle (no model at all).
    model: str
    # The sandbox of rows without an image: --sandbox, or the backend `auto` chose here; `auto`
    # still when each node of a remote executor chooses its own.
    backend: str
    # The network of every sample's sandbox: --sandbox_network, or the NetworkMode `auto` resolved to.
    network: str
