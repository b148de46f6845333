"""The cluster side of the Ray executor: what runs on a node, and how many of it each node gets.

A SampleActor is one async Ray actor holding one SampleWorker (its own model client, toolsets and
model gate, built on its node) for up to MAX_ACTOR_SESSIONS concurrent sessions. plan_actors reads
Ray's node table and decides the actors of every live node: a node started by `trajforge worker
--pool_size N` offers N slots through the SLOT_RESOURCE resource and names itself with the
WORKER_LABEL label; when no node offers slots, `num_workers` is split evenly over every node. The
driver's side (keeping samples in flight, losses, re-planning) is executors.ray's; the names a
node is started with are shared with cli.cluster, which starts the nodes.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ray  # an optional extra: the specs that import this module need it, checked first
from pydantic import SecretStr

from trajforge.allocator import tune_allocator
from trajforge.config import RunConfig
from trajforge.dataset import Sample
from trajforge.model import gate as model_gate
from trajforge.model import spend
from trajforge.model.endpoint import resolve_api_key
from trajforge.redact import REGISTRY, run_secrets
from trajforge.sample.gate_builder import gate_for
from trajforge.sample.outcome import Outcome
from trajforge.sample.worker import SampleWorker
from trajforge.tools.tool import Unavailable

SLOT_RESOURCE = "trajforge_slots"  # custom resource: session slots a node offers
WORKER_LABEL = "trajforge-worker-id"  # node label naming the worker in statistics
WORKER_ENV = "TRAJFORGE_WORKER_ID"
MAX_ACTOR_SESSIONS = 64  # one Python process serves at most this many sessions


@ray.remote(num_cpus=0)
class SampleActor:
    """One SampleWorker on one node. API keys in the node's environment win over the driver's.

    It has its own model gate for its `size` sessions, with size/num_workers of the run's
    per-minute budgets, and reports what each sample spent in Outcome.cost (the driver's budget
    sees no model call of the actor)."""

    def __init__(self, config: RunConfig, prefill: list[dict[str, Any]] | None, worker_id: str,
                 driver_key: str | None, size: int = MAX_ACTOR_SESSIONS) -> None:
        tune_allocator()  # the actor's process is ours and reads the model replies of its sessions
        if config.verbose:
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        if config.api_key is None:
            key = resolve_api_key(None, os.environ) or driver_key
            if key:
                config = config.model_copy(update={"api_key": SecretStr(key)})
        REGISTRY.add(*run_secrets(config))  # this node's keys: the driver cannot scrub what it never knew
        self._worker = SampleWorker(config, prefill=prefill, worker_id=worker_id or os.environ.get(WORKER_ENV)
                                    or f"ray-{ray.get_runtime_context().get_node_id()[:8]}")
        self._gate = gate_for(config, share=size / max(1, config.num_workers))

    async def start(self) -> list[Unavailable]:
        return await self._worker.start()

    async def sandbox(self) -> str:
        """The backend this node's samples run in (`--sandbox auto` is decided here, per node)."""
        assert self._worker.sandboxes is not None
        return await self._worker.sandboxes.backend_name(None)

    async def process(self, sample: Sample, attempt: int) -> Outcome:
        meter = spend.SampleSpend()
        with model_gate.bound(self._gate), spend.bound(meter):
            outcome = await self._worker.process(sample, attempt=attempt)
        outcome.cost = meter.cost
        return outcome.scrubbed(REGISTRY.value)

    async def drain(self) -> None:
        self._worker.drain()

    async def aclose(self) -> None:
        await self._worker.aclose()


def plan_actors(nodes: list[dict[str, Any]], num_workers: int, exclude: set[str]) -> dict[str, tuple[str, list[int]]]:
    """Node id -> (worker label, sessions of each actor to run there), from Ray's node table."""
    alive = [n for n in nodes if n.get("Alive") and n["NodeID"] not in exclude]
    offering = [n for n in alive if n.get("Resources", {}).get(SLOT_RESOURCE, 0) >= 1]
    if offering:
        shares = {n["NodeID"]: int(n["Resources"][SLOT_RESOURCE]) for n in offering}
    else:  # nobody offers slots (a plain local or cluster instance): split the sessions evenly
        base, extra = divmod(num_workers, max(1, len(alive)))
        shares = {n["NodeID"]: base + (i < extra) for i, n in enumerate(alive)}
    plan = {}
    for n in alive:
        share = shares.get(n["NodeID"], 0)
        if share > 0:
            sizes = [MAX_ACTOR_SESSIONS] * (share // MAX_ACTOR_SESSIONS) + [share % MAX_ACTOR_SESSIONS]
            plan[n["NodeID"]] = ((n.get("Labels") or {}).get(WORKER_LABEL, ""), [s for s in sizes if s])
    return plan
