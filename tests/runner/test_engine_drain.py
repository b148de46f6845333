"""The scheduler tells its executor when no new sample will start (Executor.drain), while the
last samples still run, so a backend can let go of idle sandboxes early (sandbox/slots.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from trajforge.dataset import Sample
from trajforge.runner.scheduling.engine import run_engine
from trajforge.sample.outcome import Outcome
from trajforge.tools.tool import Unavailable


class Recording:
    """Samples take as many ticks as their index says; every event is logged in order."""

    def __init__(self, capacity: int, fail_first: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        self.capacity, self.log, self.fail_first = capacity, [], set(fail_first)

    async def start(self, images: Collection[str] = ()) -> list[Unavailable]:
        return []

    async def process(self, sample: Sample, attempt: int) -> Outcome:
        self.log.append(f"start {sample.index}.{attempt}")
        for _ in range(sample.index * 3):
            await asyncio.sleep(0)
        self.log.append(f"end {sample.index}.{attempt}")
        failed = sample.index in self.fail_first and attempt == 1
        return Outcome(sample.index, sample.identity, 1, "failed" if failed else "done")

    def drain(self) -> None:
        self.log.append("drain")

    async def aclose(self) -> None:
        pass


def samples(n: int) -> list[Sample]:
    return [Sample(i, i + 1, f"p{i}", f"h{i}:0") for i in range(1, n + 1)]


def test_drain_comes_after_the_last_start_and_before_the_last_end() -> None:
    ex = Recording(capacity=2)
    done: list[Outcome] = []
    asyncio.run(run_engine(samples(5), ex, done.append, lambda s: 0, asyncio.Event()))
    assert len(done) == 5
    first = ex.log.index("drain")
    assert first > max(i for i, e in enumerate(ex.log) if e.startswith("start"))
    assert first < ex.log.index("end 5.1")  # the longest sample was still running
    assert ex.log.count("drain") == 1


def test_a_retry_after_the_drain_still_runs() -> None:
    ex = Recording(capacity=2, fail_first={5})
    done: list[Outcome] = []
    asyncio.run(run_engine(samples(5), ex, done.append, lambda s: 1, asyncio.Event()))
    assert ex.log.index("drain") < ex.log.index("start 5.2")
    assert [o.status for o in done if o.index == 5] == ["done"]


def test_a_stop_drains_too() -> None:
    stop = asyncio.Event()
    ex = Recording(capacity=2)

    async def main() -> None:
        stop.set()
        await run_engine(samples(5), ex, lambda o: None, lambda s: 0, stop)

    asyncio.run(main())
    assert ex.log == ["drain"]  # nothing started, and the executor knows no sample will
