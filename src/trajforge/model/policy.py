"""The policy version that model calls are stamped with, held in one place per model client.

An RL trainer updates the weights its inference server serves while rollouts go on; each call
records the version it was sent under (Completion.policy_version), so a sample whose turns span
an update says which turn came from which. `--policy_version V` sets the first value; whoever
learns of a new version (a rollout service, a trainer in the same process) calls `set` on the
client's `policy`, and every call sent after that carries the new one. Reading and writing one
attribute is atomic under the GIL, so the local model's worker threads read it safely.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class PolicyVersion:
    value: int | None = None

    def set(self, value: int | None) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"a policy version is a whole number of 0 or more, not {value!r}")
        self.value = value
