"""The sandboxes made ahead of time go to samples about to need one (issue 51, item 5): a sample
counts as demand for the pool (sandbox_pool.py) from its start until its sandbox is made or it
ends unused, but not while it is parked (lazy.py): sessions held back at the model gate by a
provider's cap, or in a retry's backoff, hold no sandbox. Waits are real: the run's ModelGate
with a ceiling, the samples' WorkingClocks, the provider, and as root the bwrap pool itself."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from trajforge.config import RunConfig
from trajforge.model import working
from trajforge.model.gate import ModelGate
from trajforge.sandbox.backends.bwrap.bwrap_backend import probe
from trajforge.sandbox.factory import SandboxProvider
from trajforge.sandbox.interface import Sandbox

STATUS = asyncio.run(probe())
CAP, SESSIONS = 2, 6


async def _sessions(p: SandboxProvider, root: Path, body) -> None:  # type: ignore[no-untyped-def]
    """SESSIONS samples, each with a lazy sandbox watched by its clock, asking the gate (ceiling
    CAP) for a model call; `body(admitted, go)` runs once CAP are admitted and the rest parked,
    and `go` lets each admitted one finish its call and end without calling a tool."""
    gate = ModelGate(CAP, adaptive=False)
    admitted: list[int] = []
    changed = asyncio.Condition()
    done = asyncio.Event()

    async def create() -> Sandbox:
        return await p.create(cwd=None, image=None, root=root)

    async def session(i: int) -> None:
        lazy = p.lazy(create, root=root)
        clock = working.WorkingClock()
        clock.observe(lazy.park)
        try:
            with working.bound(clock):
                ticket = await gate.acquire("http://model.test")
                async with changed:
                    admitted.append(i)
                    changed.notify_all()
                await done.wait()  # the model call, under way
                gate.release(ticket, "ok")
        finally:
            await lazy.close()  # no tool was called

    tasks = [asyncio.ensure_future(session(i)) for i in range(SESSIONS)]
    async with changed:
        await changed.wait_for(lambda: len(admitted) == CAP)
    await body(admitted)
    done.set()
    await asyncio.gather(*tasks)


def test_samples_parked_at_the_gate_are_no_demand(tmp_path: Path) -> None:
    async def main() -> None:
        async with SandboxProvider(RunConfig(sandbox="local").sandbox_settings()) as p:
            async def body(admitted: list[int]) -> None:
                assert p.waiting == CAP  # the four behind the cap want none

            await _sessions(p, tmp_path, body)
            assert p.waiting == 0  # every sample ended unused: none is demand any more

    asyncio.run(main())


@pytest.mark.skipif(not STATUS.usable or STATUS.mode != "root", reason=f"needs root-mode bwrap ({STATUS.detail})")
def test_the_pool_makes_sandboxes_for_the_samples_past_the_gate_only(tmp_path: Path) -> None:
    async def main() -> None:
        settings = RunConfig(sandbox="bwrap", sandbox_network="none").sandbox_settings()
        async with SandboxProvider(settings) as p:
            async def body(admitted: list[int]) -> None:
                await p._prepared[("", tmp_path)]  # the runtime is up and its pool sized to the demand
                runtime = p._state["bwrap.runtime"]
                pool = runtime.pool(tmp_path)
                while pool._making:
                    await asyncio.wait(pool._tasks, return_when=asyncio.FIRST_COMPLETED)
                assert len(pool._ready) == CAP, len(pool._ready)  # not SESSIONS

            await _sessions(p, tmp_path, body)
            runtime = p._state["bwrap.runtime"]
            pool = runtime.pool(tmp_path)
            await pool.settle()
            assert len(pool._ready) <= SESSIONS and p.waiting == 0

    asyncio.run(main())


def test_without_parking_the_samples_behind_the_cap_are_demand(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation check: a lazy sandbox that ignores its sample's waits is caught."""
    from trajforge.sandbox.lazy import LazySandbox

    monkeypatch.setattr(LazySandbox, "park", lambda self, parked: None)
    with pytest.raises(AssertionError):
        test_samples_parked_at_the_gate_are_no_demand(tmp_path)
