"""The Ray executor: the same run spread over a Ray cluster, with the driver alone writing output.

The engine keeps `num_workers` samples in flight; each goes to the least-loaded SampleActor
with a free slot, so work is pulled and fast nodes take more. What an actor is and how many each
node gets (plan_actors) is executors.ray_actor's; this module is the driver's side: connecting,
starting the planned actors, handing samples out, and losses. Outcomes come back to the driver,
which writes the run directory, so the cluster needs no shared filesystem.

A lost actor or node is infrastructure failure, not the sample's: its in-flight samples are sent
to another actor without counting an attempt, and the lost capacity is re-planned on the nodes
still alive. Ray is imported only here, in executors.ray_actor and in cli.cluster, so a local
run never loads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trajforge.config import RunConfig
from trajforge.dataset import Sample
from trajforge.errors import TrajforgeError
from trajforge.executors.ray_actor import SampleActor, plan_actors
from trajforge.model.endpoint import resolve_api_key
from trajforge.sample.outcome import Outcome, batch_number
from trajforge.tools.tool import Unavailable

# Ray is installed by now: without it, importing ray_actor above raised a UsageError saying how to install it.
import ray
from ray.exceptions import ActorDiedError, RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

log = logging.getLogger("trajforge.ray")

MAX_LOSSES = 3  # a sample that took down this many actors is failed: it may be what kills them
SUSPECT_SECONDS = 60.0  # a node whose actor stopped answering is not planned on for this long
REPLAN_SECONDS = 10.0  # finished samples look for newly joined nodes at most this often
START_TIMEOUT = 300.0  # seconds for a new actor to import trajforge and build its toolsets
LOCAL_OBJECT_STORE = 256 * 1024 * 1024  # outcomes are small; the default takes 30% of RAM


@dataclass(eq=False)
class _Actor:
    handle: Any
    node_id: str
    size: int
    busy: int = 0
    lost: bool = False


class RayExecutor:
    def __init__(self, config: RunConfig, *, prefill: list[dict[str, Any]] | None = None) -> None:
        self.capacity = config.num_workers
        self.lost = 0  # actors lost during the run
        self._config = config
        self._prefill = prefill
        self._actors: list[_Actor] = []
        self._suspect: dict[str, float] = {}  # node id -> when one of its actors stopped answering
        self._unavailable: dict[str, Unavailable] = {}
        self.sandboxes: set[str] = set()  # the backends the nodes' samples run in (what auto became on each)
        self._changed = asyncio.Condition()
        self._plan_lock = asyncio.Lock()
        self._planning = 0  # re-plans pending or running
        self._last_plan = 0.0
        self._owns_ray = False
        self._background: set[asyncio.Task[None]] = set()
        if config.keep_workspaces:
            log.warning("--keep_workspaces has no effect with --executor ray: workspaces live on the worker nodes")

    @property
    def actor_handles(self) -> list[Any]:
        """Handles of the live SampleActors (to inspect the cluster, or to kill one in a test)."""
        return [a.handle for a in self._actors]

    async def start(self, images: Collection[str] = ()) -> list[Unavailable]:
        """Connect and start actors. `images` are not prefetched: each node pulls what its samples need."""
        self._connect()  # blocking for a few seconds, but Ray wants its init on the main thread
        await self._replan()
        if not self._actors:
            raise TrajforgeError("no Ray worker could be started on the cluster (see the warnings above)")
        return list(self._unavailable.values())

    def _connect(self) -> None:
        if ray.is_initialized():  # `trajforge scheduler` (or a test) connected already
            return
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # never phone home from a run
        quiet: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": self._config.verbose}
        # ray.init replaces the SIGTERM handler with sys.exit; the runner's graceful stop needs its own back
        saved = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
        auth = None
        if self._config.ray_address:  # use a token the way the cluster's `ray start --head` did
            from trajforge.executors import ray_auth

            auth = ray_auth.decide()
            ray_auth.apply(auth)
        try:
            if self._config.ray_address:
                ray.init(address=self._config.ray_address, **quiet)
            else:
                ray.init(num_cpus=os.cpu_count() or 1, object_store_memory=LOCAL_OBJECT_STORE,
                         include_dashboard=False, **quiet)
        except (ConnectionError, RuntimeError, ValueError) as e:
            where = self._config.ray_address or "a local instance"
            if auth is not None and ray_auth.is_auth_failure(f"{e} {e.__cause__ or ''}"):
                raise TrajforgeError(ray_auth.failure_message(f"--ray_address {where}", auth)) from None
            raise TrajforgeError(f"--executor ray: cannot start Ray at {where}: {e}") from None
        finally:
            if saved is not None:
                signal.signal(signal.SIGTERM, saved)
        self._owns_ray = True

    async def process(self, sample: Sample, attempt: int) -> Outcome:
        losses = 0
        while True:
            actor = await self._acquire()
            ref = actor.handle.process.remote(sample, attempt)
            try:
                outcome: Outcome = await ref
            except asyncio.CancelledError:
                with contextlib.suppress(RayError):
                    ray.cancel(ref)  # the actor's session is cancelled too, closing its sandbox
                raise
            except RayTaskError as e:  # SampleWorker raises only run-fatal errors and cancellation
                if isinstance(e.cause, TrajforgeError):
                    raise e.cause from None
                outcome = self._failed(sample, attempt, f"Ray task error: {type(e.cause).__name__}: {e.cause}")
            except RayError as e:  # the actor, its node or its result is gone: not the sample's fault
                losses += 1
                await self._lose(actor, e)
                if losses < MAX_LOSSES:
                    continue
                outcome = self._failed(sample, attempt, f"{losses} Ray workers were lost while running this sample")
            finally:
                await self._release(actor)
            if time.monotonic() - self._last_plan > REPLAN_SECONDS:
                self._spawn(self._replan())  # adopt nodes that joined since
            return outcome

    def _failed(self, sample: Sample, attempt: int, message: str) -> Outcome:
        return Outcome(sample.index, sample.identity, batch_number(sample.index, self._config.batch_size), "failed",
                       reason="internal", message=message, attempts=attempt, worker="ray")

    async def _acquire(self) -> _Actor:
        async with self._changed:
            while True:
                free = [a for a in self._actors if a.busy < a.size]
                if free:
                    actor = min(free, key=lambda a: a.busy / a.size)
                    actor.busy += 1
                    return actor
                if not self._actors and not self._planning:
                    raise TrajforgeError("every Ray worker was lost and no live node is left to run sessions on")
                await self._changed.wait()

    async def _release(self, actor: _Actor) -> None:
        actor.busy -= 1
        async with self._changed:
            self._changed.notify_all()

    async def _lose(self, actor: _Actor, error: RayError) -> None:
        # No await before _replan counts itself in: waiters must never see "no actors, no planning".
        if not actor.lost:
            actor.lost = True
            self.lost += 1
            self._actors.remove(actor)
            if not isinstance(error, ActorDiedError):  # unreachable rather than dead: its node may be gone
                self._suspect[actor.node_id] = time.monotonic()
            try:
                ray.kill(actor.handle, no_restart=True)  # if it only stopped answering, it must not run on
            except RayError:
                pass
            log.warning("Ray worker on node %s lost (%s); its samples are retried elsewhere",
                        actor.node_id[:8], type(error).__name__)
        await self._replan()

    async def _replan(self) -> None:
        """Start actors on live nodes that have none, per plan_actors; notify waiters either way."""
        self._planning += 1
        try:
            async with self._plan_lock:
                self._last_plan = time.monotonic()
                nodes = await asyncio.to_thread(ray.nodes)
                now = time.monotonic()
                exclude = {n for n, t in self._suspect.items() if now - t < SUSPECT_SECONDS}
                used = {a.node_id for a in self._actors}
                plan = plan_actors(nodes, self._config.num_workers, exclude)
                todo = [(node, label, size) for node, (label, sizes) in plan.items() if node not in used
                        for size in sizes]
                await asyncio.gather(*(self._add_actor(*t) for t in todo))
        finally:
            self._planning -= 1
            async with self._changed:
                self._changed.notify_all()

    async def _add_actor(self, node_id: str, label: str, size: int) -> None:
        driver_key = None if self._config.api_key else resolve_api_key(None, os.environ)
        handle = SampleActor.options(  # type: ignore[attr-defined]
            max_concurrency=size, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(self._config, self._prefill, label, driver_key, size)
        try:
            async with asyncio.timeout(START_TIMEOUT):
                unavailable = await handle.start.remote()
                self.sandboxes.add(await handle.sandbox.remote())
        except RayTaskError as e:  # building its toolsets failed: a config problem, fatal for the run
            ray.kill(handle)
            raise (e.cause if isinstance(e.cause, TrajforgeError) else e) from None
        except (RayError, TimeoutError) as e:
            ray.kill(handle)
            self._suspect[node_id] = time.monotonic()
            log.warning("could not start a Ray worker on node %s: %s: %s", node_id[:8], type(e).__name__,
                        str(e)[:800])
            return
        for u in unavailable:
            self._unavailable.setdefault(u.toolset, u)
        self._actors.append(_Actor(handle, node_id, size))

    def _spawn(self, coro: Any, what: str = "adding Ray workers") -> None:
        async def guarded() -> None:
            try:
                await coro
            except Exception as e:  # a node that joined late and cannot start must not stop the run
                log.warning("%s failed: %s", what, e)

        task = asyncio.ensure_future(guarded())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def drain(self) -> None:
        """Tell every actor, in the background (an actor lost meanwhile needs telling no more)."""
        async def tell(actor: _Actor) -> None:
            with contextlib.suppress(RayError):
                await actor.handle.drain.remote()

        for actor in self._actors:
            self._spawn(tell(actor), "telling a Ray worker that no sample will start")

    async def aclose(self) -> None:
        for task in list(self._background):
            task.cancel()
        if ray.is_initialized():
            actors, self._actors = self._actors, []
            closing = asyncio.gather(*(a.handle.aclose.remote() for a in actors), return_exceptions=True)
            try:  # close sandboxes and clients cleanly before the processes go
                await asyncio.wait_for(closing, timeout=10)
            except TimeoutError:
                pass
            for a in actors:
                ray.kill(a.handle)
            if self._owns_ray:
                await asyncio.to_thread(ray.shutdown)


def make(config: RunConfig, prefill: list[dict[str, Any]] | None, run_dir: Path) -> RayExecutor:
    """The spec's target (trajforge.catalog.executors.EXECUTORS)."""
    return RayExecutor(config, prefill=prefill)
