"""The rollout service: groups in, each group out as soon as all of its rollouts ended.

It is `run`'s engine run again and again on one run directory: an accepted group's row is
appended to the service's dataset (RunLayout.service_rows) once per rollout, and while any group
is open the service runs an invocation of the run over that dataset (runner.main.invoke, with
--resume after the first), which runs what is not finished yet: new rollouts, and failed ones
again. A gate in front of the run's executor (OpenGate) ends at once, with no sandbox and no
model call, every rollout whose slot the service closed (its group delivered or cancelled). The
service hears each rollout's end through its outcome listener (service.listener), so what it
streams passed the same scrubbing and filters as trajectories.jsonl. Groups submitted while an
invocation runs wait for the next one.

Groups submitted with a policy of their own (service.policy) cannot share a pass with the others
(a pass is one RunConfig): each distinct policy is a `Lane`, its own run directory under
RunLayout.service_lanes with its own dataset and passes; the default lane is the service's own
run directory. The store stays the one record of every group, whatever its lane.

A rollout becomes, for a trainer (trajforge.failures.rollout_class):
- `scored`: a result of the policy, with its reward (a wrong answer, max_turns, a cut reply);
- `masked`: its end cannot be blamed on the policy (the sandbox did not start, provider errors
  after retries, a check that could not run, a budget): never a reward, the failure class named.
  A failed rollout runs again up to `retry_masked` times before it is delivered masked;
- `dropped`: the run's filters leave it out of trajectories.jsonl (a tool that was not offered,
  --keep): no record.

The state (service.store) is in the run directory, so `--resume` after any kill goes on with the
open groups and streams the finished, unacked ones again; acked ones never come back.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import orjson

from trajforge.catalog.sandboxes import runs_on_host
from trajforge.config import RunConfig
from trajforge.dataset import checked_row
from trajforge.errors import UsageError
from trajforge.failures import CLOSED, DEFERRED, STALE, masks, rollout_class
from trajforge.jsonio import dumps
from trajforge.redact import REGISTRY
from trajforge.run_layout import RunLayout
from trajforge.runner.listeners import Ended
from trajforge.runner.main import invoke
from trajforge.runner.scheduling.engine import Executor, ExecutorFactory
from trajforge.dataset import Sample
from trajforge.sample.outcome import Outcome, batch_number
from trajforge.service import listener
from trajforge.service.atropos import AtroposPush
from trajforge.service.policy import ENDPOINT_FIELDS, refuse_redirect, with_endpoint, with_policy
from trajforge.service.store import ServiceStore
from trajforge.service.task_input import accepted_task, copy_task, link_rollouts

log = logging.getLogger("trajforge")
SCORED, MASKED, DROPPED = "scored", "masked", "dropped"
MAX_GROUP_SIZE = 1024  # rollouts of one group


class BadGroups(ValueError):
    """A submission that `run` would refuse: the message names the row and the field."""


@dataclass(frozen=True, slots=True)
class Finished:
    """A finished group as a consumer gets it: `line`, its JSON (id, cursor, n, usable, row, rollouts)."""

    id: str
    cursor: int
    line: bytes


class Lane:
    """The groups that share one policy, so one run of the engine: the default lane ('') is the
    service's own run directory, each other one a run directory under RunLayout.service_lanes.
    A lane runs its passes one after another; lanes run side by side."""

    def __init__(self, key: str, config: RunConfig, fresh: bool) -> None:
        assert config.run_name is not None
        self.key, self.config, self.fresh = key, config, fresh
        self.layout = RunLayout(config.output_dir / config.run_name)
        self.wake = asyncio.Event()
        self.cycle_stop: asyncio.Event | None = None  # the running pass's stop
        self.restart = False  # run another pass at once when this one ends
        self.running = False
        self.executor: Executor | None = None  # the running pass's (the run's own, under OpenGate)
        self.task: asyncio.Task[None] | None = None
        self.endpoint_changes = 0  # POST /v1/policy's endpoint changes (the default lane's) by the service's life
        self.pass_endpoint = 0  # endpoint_changes when the running pass began


class RolloutService:
    """The engine as a long-lived service on one run directory. Use `async with`."""

    def __init__(self, config: RunConfig, make_executor: ExecutorFactory, *, retry_masked: int = 0,
                 resume: bool = False, push: str | None = None, max_staleness: int | None = None,
                 tasks_root: Path | None = None, redirects: bool = False) -> None:
        """`push`: `atropos=URL` sends each finished group to that Atropos API server (service.atropos).
        `max_staleness K`: a rollout whose start would make its group's rollouts start under more
        than K policy versions is not started (it is masked as `stale`). `tasks_root`: the directory
        whose Harbor tasks a group may name (service.task_input); None: no task groups. `redirects`:
        whether requests may name an endpoint or key variable (service.policy.refuse_redirect): only
        when the clients are authenticated."""
        assert config.run_name is not None
        push_url = None
        if push is not None:
            kind, _, push_url = push.partition("=")
            if kind != "atropos" or not push_url.startswith(("http://", "https://")):
                raise UsageError(f"--push {push}: expected atropos=URL (http:// or https://)")
        self.layout = RunLayout(config.output_dir / config.run_name)
        if self.layout.root.exists() and any(self.layout.root.iterdir()) and not resume:
            if not config.overwrite:
                raise UsageError(f"{self.layout.root} already holds a run: pass --resume to go on with its "
                                 "groups, or --overwrite to start over")
        self.layout.root.mkdir(parents=True, exist_ok=True)
        if not resume:
            for path in (self.layout.service_state, self.layout.service_rows):
                path.unlink(missing_ok=True)
            shutil.rmtree(self.layout.service_lanes, ignore_errors=True)  # an old service's lanes (--overwrite)
        if tasks_root is not None and not tasks_root.is_dir():
            raise UsageError(f"--tasks_root {tasks_root}: not a directory")
        self.tasks_root = tasks_root
        self.redirects = redirects
        self.base = config.model_copy(update={"dataset_file": self.layout.service_rows, "samples_per_prompt": 1})
        self.make_executor = make_executor
        self.retry_masked = retry_masked
        self.store = ServiceStore(self.layout.service_state)
        self.keep_passed = config.keep == "passed"
        self.policy_version: int | None = self.store.get("policy_version", config.policy_version)
        # the endpoint a POST /v1/policy named (kept, so --resume keeps it): the passes' config
        self.endpoint: dict[str, Any] = self.store.get("endpoint", {})
        default = with_endpoint(self.base, self.endpoint) if self.endpoint else self.base
        self.lanes = {"": Lane("", default, fresh=not resume)}
        for key, spec in self.store.lanes().items():  # a resumed service's
            self.lanes[key] = Lane(key, self._lane_config(key, spec), fresh=False)
        self.finished = asyncio.Condition()
        self.stop = asyncio.Event()
        self.invocations = 0
        self.unpushed: dict[str, int] = {}  # groups not pushed, by why
        self.max_staleness = max_staleness
        self.started_under: dict[str, set[int | None]] = {}  # group -> the versions its rollouts started under
        self.held_stale = 0  # rollouts not started: they would have mixed too many versions
        self.spent = 0.0  # USD, by this service's life
        self.pusher: AtroposPush | None = None
        self._push_task: asyncio.Task[None] | None = None
        if push_url is not None:
            self.pusher = AtroposPush(push_url, self.store.note_pushed, self.unpushed)
        self.error: str | None = None  # why the last invocation failed (a run-fatal problem), until one ends well

    @property
    def config(self) -> RunConfig:
        """The default lane's: the service's flags, and POST /v1/policy's endpoint."""
        return self.lanes[""].config

    # ---- life ----
    async def __aenter__(self) -> RolloutService:
        for lane in self.lanes.values():
            self._start_lane(lane)
        if self.pusher is not None:
            self._push_task = asyncio.create_task(self.pusher.run(self.stop), name="atropos-push")
            for gid, cursor in self.store.unpushed():
                self._push(gid, cursor)
        for key in self.store.open_lanes():
            self._recover(self.lanes[key])
            self.lanes[key].wake.set()  # a resumed service goes on with its open groups
        return self

    def _start_lane(self, lane: Lane) -> None:
        listener.ATTACHED[lane.layout.root.resolve()] = partial(self.on_ended, lane)
        lane.task = asyncio.create_task(self._generate(lane), name=f"rollout-service-lane{lane.key}")

    def _lane_config(self, key: str, spec: dict[str, Any]) -> RunConfig:
        """The run config of the lane `key`, whose groups run under spec["policy"] (service.policy,
        None: the service's flags), of rows or (spec["tasks"]) of tasks; UsageError."""
        layout = RunLayout(self.layout.service_lanes / key)
        config = self.base if spec["policy"] is None else with_policy(self.base, spec["policy"])
        source = {"dataset_file": None, "tasks": layout.service_tasks} if spec["tasks"] else \
            {"dataset_file": layout.service_rows}
        return config.model_copy(update={"output_dir": self.layout.service_lanes, "run_name": key, **source})

    def _recover(self, lane: Lane) -> None:
        """Rollouts that a killed service's run saved but the service never heard of (the kill
        came between the checkpoint's commit and the listener's) are settled from the run's files,
        through the same `Ended` as a live one; the rest run again."""
        if not lane.layout.has_results():
            return
        from trajforge.runner.reader import RunReader

        self._write_dataset(lane)
        reader = RunReader(lane.layout.root)
        rows = reader.rows(lane.config.model_copy(update={"resume": True}))
        outcomes = reader.outcomes()
        wanted = {rows.sample(i).identity: i for i in self.store.open_indices(lane.key)}
        heard = {identity: outcomes[identity] for identity in wanted if identity in outcomes}
        records = {r["sample_id"]: r for r in reader.batch_records() if r.get("sample_id") in heard}
        for identity, entry in heard.items():
            if entry.status == "failed":
                continue  # it runs again
            record = records.get(identity) if entry.status == "done" else None
            if entry.status == "done" and record is None:
                continue
            o = Outcome(wanted[identity], identity, entry.batch, entry.status, record=record, reason=entry.reason,
                        message=entry.message, attempts=entry.attempts)
            self.on_ended(lane, Ended.of(o, REGISTRY, keep_passed=self.keep_passed))

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Start no new rollout, let the running invocation end (its rollouts in flight get its
        grace period), end every stream. Idempotent."""
        self.stop.set()
        for lane in self.lanes.values():
            lane.wake.set()
        await self._notify()
        for lane in list(self.lanes.values()):
            if lane.task is not None:
                await lane.task
                lane.task = None
        if self._push_task is not None:
            self._push_task.cancel()
            self._push_task = None
        attached = [listener.ATTACHED.pop(lane.layout.root.resolve(), None) for lane in self.lanes.values()]
        if attached[0] is not None:
            self.store.close()

    async def _generate(self, lane: Lane) -> None:
        """A pass of the lane's run while any of its groups is open; each one ends when its dataset is done."""
        while True:
            await lane.wake.wait()
            lane.wake.clear()
            if self.stop.is_set():
                return
            before = len(self.store.open_indices(lane.key))
            if not before:
                continue
            self._write_dataset(lane)
            # the first invocation of a new service starts the run afresh (--overwrite: over an old one's)
            resume, overwrite = (False, lane.config.overwrite) if lane.fresh else (lane.layout.has_results(), False)
            lane.fresh = False
            config = lane.config.model_copy(update={"resume": resume, "overwrite": overwrite,
                                                    "policy_version": self.policy_version})
            lane.pass_endpoint = lane.endpoint_changes
            lane.running = True
            # this invocation's stop: the service's, or a policy change with in_flight "restart"
            cycle = lane.cycle_stop = asyncio.Event()
            relay = asyncio.create_task(self._relay(cycle))
            try:
                code = await invoke(config, partial(self._executor_of, lane), cycle)
            except Exception as e:  # a run-fatal problem (bad key, disk full): said, and the open groups wait
                log.exception("the rollout service's invocation failed")
                self.error, code = REGISTRY.text(f"{type(e).__name__}: {e}"), 1
            else:
                self.error = None
            finally:
                relay.cancel()
                lane.running, lane.executor, lane.cycle_stop = False, None, None
                self.invocations += 1
            after = len(self.store.open_indices(lane.key))
            restarted, lane.restart = lane.restart, False
            if self.stop.is_set():
                return
            if restarted or (after and after < before):
                lane.wake.set()  # failed rollouts to run again (--retry_masked)
            elif after:
                log.warning("the rollout service's invocation ended %d rollout(s) short (exit code %d); "
                            "they wait for the next group", after, code)

    async def _relay(self, cycle: asyncio.Event) -> None:
        await self.stop.wait()
        cycle.set()

    def _executor_of(self, lane: Lane, config: RunConfig, prefill: list[dict[str, Any]] | None,
                     run_dir: Path) -> Executor:
        lane.executor = self.make_executor(config, prefill, run_dir)
        return OpenGate(lane.executor, self, lane)

    def refusal(self, lane: Lane, idx: int) -> tuple[str, str] | None:
        """Why the rollout at `idx` must not start now, as (failure class, message), or None: it
        starts, under the current version. A resumed pass runs every failed sample of the dataset
        again, and the dataset holds every group's rows: a rollout whose slot is closed (its group
        delivered, acked or cancelled) must cost no sandbox and no model call."""
        slot = self.store.slot(lane.key, idx)
        if slot is None:
            return CLOSED, "its group was delivered or cancelled"
        if lane.pass_endpoint != lane.endpoint_changes:
            return DEFERRED, "the policy's endpoint changed: it runs in the next pass, on the new one"
        if self.max_staleness is None:
            return None
        versions = self.started_under.get(slot.gid)
        if versions is None:  # a resumed service: what its settled rollouts ran under
            group = self.store.group(slot.gid) or {"rollouts": []}
            versions = self.started_under[slot.gid] = {
                (r["policy_versions"] or [None])[0] for r in group["rollouts"] if r and r["record"]}
        if too_stale(versions, self.policy_version, self.max_staleness):
            self.held_stale += 1
            return STALE, (f"max_staleness {self.max_staleness}: its group started under policy versions "
                    f"{sorted(v for v in versions if v is not None)}, the policy is at {self.policy_version}")
        versions.add(self.policy_version)
        return None

    def _write_dataset(self, lane: Lane) -> None:
        """The lane's dataset from the store: each of its groups' row once per rollout, in sample
        order (the file only grows, so the run's rows.idx stays valid)."""
        if lane.config.tasks is not None:
            link_rollouts(lane.config.tasks, lane.layout.service_task_copies, self.store.lane_rollouts(lane.key))
            return
        path = lane.layout.service_rows
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [row for row, n in self.store.lane_rows(lane.key) for _ in range(n)]
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        os.replace(tmp, path)

    # ---- requests ----
    def submit(self, rows: Sequence[Any] | None, n: int, policy: Any = None,
               tasks: Sequence[Any] | None = None) -> list[str]:
        """Validate every row as `run` does (or every task path: service.task_input), and the
        `policy` (service.policy.with_policy) their groups run under (None: the service's), then
        accept them all (one group each) or none."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_GROUP_SIZE:
            raise BadGroups(f"field 'n' must be a whole number from 1 to {MAX_GROUP_SIZE}, not {n!r}")
        if (rows is None) == (tasks is None):
            raise BadGroups("give field 'rows' (dataset rows) or field 'tasks' (task paths), not both")
        found = []
        if tasks is not None:
            if not isinstance(tasks, list) or not tasks:
                raise BadGroups("field 'tasks' must be a non-empty list of task paths")
            try:
                found = [accepted_task(self.tasks_root, given, i) for i, given in enumerate(tasks)]
            except UsageError as e:
                raise BadGroups(str(e)) from None
            root = self.tasks_root.resolve()  # type: ignore[union-attr]
            lines = [dumps({"task": str(task.relative_to(root))}) for task in found]
        else:
            lines = self._row_lines(rows)
        spec = {"policy": policy, "tasks": tasks is not None}
        key = "tasks" if tasks is not None else ""
        if policy is not None:  # one lane per distinct policy, whatever the order of its keys
            digest = hashlib.sha256(orjson.dumps(policy, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
            key = f"{key}-{digest}" if key else digest
        lane = None
        if key not in self.lanes:
            try:
                if isinstance(policy, dict) and not self.redirects:
                    refuse_redirect(policy, "policy.")
                lane = Lane(key, self._lane_config(key, spec), fresh=False)
            except UsageError as e:
                raise BadGroups(str(e)) from None
        if self.stop.is_set():
            raise BadGroups("the service is stopping")
        groups = [(uuid.uuid4().hex, line, n) for line in lines]
        target = (lane or self.lanes[key]).layout.service_task_copies
        for (gid, _, _), task in zip(groups, found):  # what was checked is what runs
            copy_task(task, target / gid)
        self.store.add_groups(groups, key, spec if key else None)
        if lane is not None:
            self.lanes[key] = lane
            self._start_lane(lane)
        self.lanes[key].wake.set()
        return [g[0] for g in groups]

    def _row_lines(self, rows: Any) -> list[bytes]:
        if not isinstance(rows, list) or not rows:
            raise BadGroups("field 'rows' must be a non-empty list of dataset rows")
        host_cwd = runs_on_host(self.config.sandbox)  # as the run's rows are judged
        lines = []
        for i, row in enumerate(rows):
            problem, _, _ = checked_row(row, host_cwd)
            if problem is not None:
                raise BadGroups(f"rows[{i}]: {problem}")
            lines.append(dumps(row))
        return lines

    def set_policy(self, version: int | None, in_flight: str = "continue",
                   endpoint: dict[str, Any] | None = None) -> None:
        """A new policy version (None: the same) and, with `endpoint` (ENDPOINT_FIELDS), a new
        endpoint or model for the rollouts that start from now on. Everything is checked before
        anything changes."""
        if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
            raise BadGroups(f"field 'version' must be a whole number of 0 or more, not {version!r}")
        if in_flight not in ("continue", "restart"):
            raise BadGroups(f"field 'in_flight' must be 'continue' or 'restart', not {in_flight!r}")
        named = {k: v for k, v in (endpoint or {}).items() if k in ENDPOINT_FIELDS and v is not None}
        if version is None and not named:
            raise BadGroups(f"give field 'version' or one of {', '.join(map(repr, ENDPOINT_FIELDS))}")
        if named:
            try:
                if not self.redirects:
                    refuse_redirect(named, "")
                config = with_endpoint(self.config, named)
            except UsageError as e:
                raise BadGroups(str(e)) from None
            default = self.lanes[""]  # groups with a policy of their own keep it
            default.config = config
            self.endpoint = {**self.endpoint, **named}
            self.store.put("endpoint", self.endpoint)
            # the running pass starts no new rollout (OpenGate defers them); the next runs on this endpoint
            default.endpoint_changes += 1
            if default.running:
                default.restart = True
        for lane in self.lanes.values():
            if version is not None:
                policy = getattr(lane.executor, "policy", None)  # the run's own executor, under any gate
                if policy is not None:
                    policy.set(version)  # calls sent from now on carry it (model.policy)
            if in_flight == "restart" and lane.cycle_stop is not None:
                # the running invocation stops: rollouts in flight get its stop's grace, the rest are
                # cancelled, unsaved, and run again from the start in the next one, under `version`
                lane.restart = True
                lane.cycle_stop.set()
        if version is not None:
            self.policy_version = version
            self.store.put("policy_version", version)

    def ack(self, ids: Sequence[str]) -> int:
        return self.store.ack(ids)

    def cancel(self, gid: str) -> bool:
        return self.store.cancel(gid)

    def status(self) -> dict[str, Any]:
        counts = self.store.counts()
        return {"queued": counts["queued"], "finished_unacked": counts["finished"], "acked": counts["acked"],
                "cancelled": counts["cancelled"], "open_rollouts": sum(self.store.open_lanes().values()),
                "lanes": len(self.lanes), "running": any(lane.running for lane in self.lanes.values()),
                "invocations": self.invocations, "policy_version": self.policy_version,
                "not_pushed": dict(self.unpushed), "max_staleness": self.max_staleness,
                "held_stale": self.held_stale, "spent": round(self.spent, 6), "model": self._model(),
                "sandboxes_warm": self._sandboxes_warm(), "error": self.error}

    def _sandboxes_warm(self) -> int | None:
        """The running passes' sandboxes alive now (made, not yet removed): 0 between passes; None
        for an executor that does not count them (Ray's are on its nodes)."""
        counts = [getattr(lane.executor, "sandboxes_warm", None) for lane in self.lanes.values()
                  if lane.executor is not None]
        return None if None in counts else sum(counts)  # type: ignore[arg-type]

    def _model(self) -> dict[str, int] | None:
        """The running passes' model calls (their gates: in flight, 429/503 replies), if one runs."""
        snaps = [gate.snapshot() for lane in self.lanes.values()
                 if (gate := getattr(lane.executor, "gate", None)) is not None]
        if not snaps:
            return None
        return {field: sum(getattr(snap, field) for snap in snaps)
                for field in ("in_flight", "limit", "requests", "overloaded")}

    async def stream(self, cursor: int = 0, *, follow: bool = True) -> AsyncIterator[Finished]:
        """Finished, unacked groups past `cursor`, in the order they finished; with `follow`, then
        each one as it finishes, until the service stops."""
        while True:
            async with self.finished:
                found = list(self.store.finished_after(cursor))
                if not found:
                    if not follow or self.stop.is_set():
                        return
                    await self.finished.wait()
                    continue
            for gid, at in found:
                yield Finished(gid, at, self.store.group_line(gid, at, REGISTRY.bytes))
                cursor = at

    # ---- the listener's side ----
    def on_ended(self, lane: Lane, ended: Ended) -> None:
        """A rollout of the lane's running pass ended (scrubbed and judged: runner.listeners.Ended)."""
        o = ended.outcome
        self.spent += o.cost  # the sample's every model call, failed attempts too (runner.scheduling.engine)
        if o.status == "failed" and o.reason == DEFERRED:
            return  # not run: the next pass runs it (no attempt of the service's)
        slot = self.store.slot(lane.key, o.index)
        if slot is None:
            return  # a cancelled group's, or one settled already
        if o.status == "failed" and slot.attempts < self.retry_masked:
            self.store.note_attempt(slot.idx)
            return  # failed rollouts run again in the next invocation
        gid = self.store.settle(slot.idx, *rollout_result(ended, slot.k, slot.attempts + 1))
        if gid is not None:
            asyncio.get_running_loop().create_task(self._notify())
            if self.pusher is not None:
                self._push(gid, self.store.group(gid)["cursor"])  # type: ignore[index]

    def _push(self, gid: str, cursor: int) -> None:
        assert self.pusher is not None
        self.pusher.queue.put_nowait(orjson.loads(self.store.group_line(gid, cursor, REGISTRY.bytes)))

    async def _notify(self) -> None:
        async with self.finished:
            self.finished.notify_all()


def too_stale(started: set[int | None], current: int | None, k: int) -> bool:
    """Whether a rollout starting under `current` makes its group's start versions more than `k`."""
    return len(started | {current}) > k


class OpenGate:
    """The run's executor, but a rollout the service does not want run (RolloutService.refusal:
    its slot is closed, or its group would mix too many policy versions) is not started: it ends
    at once as failed, with no sandbox and no model call; a stale one is masked like any failure
    the policy did not cause, a closed one is heard by nobody (its slot is closed), a deferred
    one runs in the lane's next pass."""

    def __init__(self, inner: Executor, service: RolloutService, lane: Lane) -> None:
        self.inner, self.service, self.lane = inner, service, lane
        self.capacity = inner.capacity
        self.gate = getattr(inner, "gate", None)  # the run's monitor reads the model gate from its executor

    @property
    def policy(self) -> Any:
        return getattr(self.inner, "policy", None)

    async def start(self, images: Any = ()) -> Any:
        return await self.inner.start(images)

    async def process(self, sample: Sample, attempt: int) -> Outcome:
        refused = self.service.refusal(self.lane, sample.index)
        if refused is None:
            return await self.inner.process(sample, attempt)
        reason, why = refused
        return Outcome(sample.index, sample.identity, batch_number(sample.index, self.lane.config.batch_size),
                       "failed", reason=reason, message=why, retryable=False)

    def drain(self) -> None:
        self.inner.drain()

    async def aclose(self) -> None:
        await self.inner.aclose()


def rollout_result(ended: Ended, k: int, runs: int) -> tuple[bytes, bool]:
    """What a consumer gets of one rollout, as JSON: its status for a trainer, and the record when
    trajectories.jsonl holds it (the line the batch file got, not encoded again); whether it is scored."""
    o = ended.outcome
    reason = ended.dropped if o.status == "done" else o.reason
    row = rollout_class(o.status, reason, o.record)
    record = o.record if ended.kept else None
    if o.status != "done" or ended.dropped is not None:
        status = MASKED if o.status == "failed" else DROPPED
    else:
        status = MASKED if row is not None and masks(row) else SCORED
    verification = (record or {}).get("verification") or {}
    reward = verification.get("score") if status == SCORED else None
    versions = (record or {}).get("policy_versions")
    head = orjson.dumps({"k": k, "status": status, "failure": row.name if row is not None else None,
                         "reward": reward, "passed": verification.get("passed") if status == SCORED else None,
                         "runs": runs, "message": o.message, "policy_versions": versions})
    line = ended.line.rstrip(b"\n") if record is not None and ended.line is not None else b"null"
    return b"".join((head[:-1], b',"record":', line, b"}")), status == SCORED
