"""The rollout service's outcome listener: how the service hears each rollout's end.

It is registered like any listener (runner.listeners.OUTCOME_LISTENERS) and has something to do
only in an invocation a service started on its run directory (`ATTACHED`); there it hands each
`Ended` (scrubbed, judged by the merge's filters) to the service, so a streamed group holds
exactly what trajectories.jsonl would. Kept free of the service's imports: every run makes it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trajforge.runner.listeners import Ended, ListenerContext

# run directory -> the service's handler of its invocations' outcomes
ATTACHED: dict[Path, Callable[[Ended], None]] = {}


class ServiceListener:
    def __init__(self, handler: Callable[[Ended], None]) -> None:
        self.handler = handler

    def on_outcome(self, ended: Ended) -> None:
        self.handler(ended)

    def close(self) -> None:
        pass


def make(context: ListenerContext) -> ServiceListener | None:
    handler = ATTACHED.get(context.run_dir.resolve())
    return ServiceListener(handler) if handler is not None else None
