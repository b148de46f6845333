"""The scheduler: `capacity` worker tasks pull samples one at a time and hand outcomes to a sink.

A sample is the unit of work, so a slow prompt never holds others back. Failed attempts are
retried in-run up to the task type's retry limit, unless the outcome says another attempt would
fail the same way (a sandbox limit the sample hit). On a stop request workers take no new samples,
in-flight ones get `grace` seconds, then are cancelled (their sandboxes are closed on the way out).
A FatalModelError (bad key) stops everything at once.

With a Budget, a sample (or a retry of one) starts only while the budget allows it; once it does
not, workers take no new samples and the ones in flight finish. Each sample's model calls are
charged to its own meter (model.spend), bound to the worker's task while the sample runs.

When the first worker leaves, no new sample will start (only retries of ones in flight): the
executor is told once (Executor.drain), so it can let go of idle sandboxes while the last
samples run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from trajforge.config import RunConfig
from trajforge.dataset import Sample
from trajforge.model import spend
from trajforge.runner.scheduling.budget import Budget
from trajforge.sample.outcome import Outcome
from trajforge.tools.tool import Unavailable


@runtime_checkable
class SampleSource(Protocol):
    """Where workers take samples from when starting one depends on earlier outcomes (rollouts.py)."""

    async def next(self) -> Sample | None: ...

    def done(self, sample: Sample, outcome: Outcome) -> None: ...


class Executor(Protocol):
    """Where samples run (trajforge.executors): the runner receives one from the command layer.

    `start` gets the container images the run's samples name, to prefetch where that helps."""

    capacity: int

    async def start(self, images: Collection[str] = ()) -> list[Unavailable]: ...

    async def process(self, sample: Sample, attempt: int) -> Outcome: ...

    def drain(self) -> None:
        """No new sample will start (those in flight may still retry): let go of what only new ones would use."""

    async def aclose(self) -> None: ...


# Builds the run's executor: (config, prefill messages, run directory) -> Executor.
ExecutorFactory = Callable[[RunConfig, "list[dict[str, Any]] | None", Path], Executor]


async def run_engine(
    todo: Iterable[Sample] | SampleSource,
    executor: Executor,
    sink: Callable[[Outcome], None],
    retry_limit: Callable[[Sample], int],
    stop: asyncio.Event,
    *,
    grace: float = 5.0,
    budget: Budget | None = None,
) -> bool:
    """Process every sample of `todo`; return True when interrupted by `stop`."""
    source = todo if isinstance(todo, SampleSource) else None
    samples = iter(todo) if not isinstance(todo, SampleSource) else None
    budget = budget if budget is not None else Budget()

    drained = False

    async def worker() -> None:
        nonlocal drained
        try:
            await work()
        finally:
            # A worker leaves when nothing is left to start, on a stop or at the budget: each holds
            # for every worker, so from the first one leaving no new sample starts anywhere.
            if not drained:
                drained = True
                executor.drain()

    async def work() -> None:
        while not stop.is_set() and budget.may_start():
            sample = next(samples, None) if samples is not None else await source.next()  # type: ignore[union-attr]
            if sample is None:
                return
            limit = retry_limit(sample)
            attempt = 1
            meter = budget.start(sample.identity)
            elsewhere = 0.0  # spent by attempts that ran in another process (Ray actors)
            with spend.bound(meter):
                while True:
                    outcome = await executor.process(sample, attempt)
                    elsewhere += outcome.cost
                    if (outcome.status != "failed" or not outcome.retryable or attempt > limit or stop.is_set()
                            or not budget.may_start()):
                        break
                    attempt += 1
                    budget.retry(meter)
            outcome.cost = budget.end(meter, elsewhere)
            sink(outcome)
            if source is not None:
                source.done(sample, outcome)

    async def watch(tasks: list[asyncio.Task[None]]) -> None:
        stopped = asyncio.ensure_future(stop.wait())
        finished = asyncio.ensure_future(asyncio.wait(tasks))
        await asyncio.wait({stopped, finished}, return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            await asyncio.wait(tasks, timeout=grace)
            for t in tasks:
                t.cancel()
        stopped.cancel()
        finished.cancel()

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(worker(), name=f"worker-{i}") for i in range(max(1, executor.capacity))]
        tg.create_task(watch(tasks), name="stop-watch")
    return stop.is_set()
