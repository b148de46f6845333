"""SampleWorker: everything needed to turn one sample into an Outcome, built once per process.

It owns the run-level resources (model client, toolsets) and, per sample, samples the toolsets,
starts a fresh sandbox, runs the agent loop under the per-sample limits (`--timeout` on its working
time, model.working; `--sample_wall_timeout` on the wall clock), verifies the
result (the row's check in the still-open sandbox, then its expected answer and rubric), applies
the no-reasoning filter and classifies failures. The local executor and every Ray actor each hold one.
A task sample (`--tasks`) runs the same way with its own parts from trajforge.tasks.run.TaskRun:
its container, the agent's time limit or the oracle (no model at all), and the hidden tests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from trajforge.agent.limits import SpendLimits
from trajforge.agent.loop import SessionResult, run_session
from trajforge.agent.record import build_record
from trajforge.agent.stats import reasoning_stats
from trajforge.catalog import known_tools
from trajforge.catalog.distributions import draw_toolsets
from trajforge.config import RunConfig
from trajforge.dataset import Sample
from trajforge.errors import FatalModelError, SampleFailure, UsageError
from trajforge.fields import limit_bytes
from trajforge.model import working
from trajforge.model.types import ModelClient
from trajforge.run_layout import RunLayout
from trajforge.sample.outcome import Outcome, batch_number
from trajforge.sample.trace import tracer
from trajforge.sandbox.interface import Sandbox, SandboxLimitError
from trajforge.sandbox.factory import SandboxProvider
from trajforge.sandbox.lazy import LazySandbox
from trajforge.sandbox.workspace import RunRoot
from trajforge.tasks.oracle import ORACLE_MODEL
from trajforge.tasks.run import TaskRun
from trajforge.tools.tool import ToolContext, Toolset, Unavailable
from trajforge.tools.toolsets import build_toolsets, tools_for
from trajforge.verify.result import Part
from trajforge.verify.spec import Resolved
from trajforge.verify.verifier import Verifier, final_answer

log = logging.getLogger("trajforge.worker")
TASK_MARGIN = 120.0  # seconds of a task sample's limit beyond its agent timeout (its container's start)


def _hit_a_limit(e: BaseException | None) -> bool:
    """Whether the sample hit one of its sandbox limits (a tool passes it on as the cause of a
    ToolInfraError): another attempt would most likely hit it again."""
    while e is not None:
        if isinstance(e, SandboxLimitError):
            return True
        e = e.__cause__
    return False


class _WallTimeout(Exception):
    """The sample's wall-clock limit (--sample_wall_timeout) ended it, not its working-time limit."""


class SampleWorker:
    def __init__(self, config: RunConfig, *, prefill: list[dict[str, Any]] | None = None,
                 worker_id: str = "local", workspace_root: Path | None = None,
                 run_dir: Path | None = None) -> None:
        """run_dir: the run directory when this process can write it (build and verifier logs go there)."""
        self.config = config
        self.tool_settings = config.tool_settings()
        layout = RunLayout(run_dir) if run_dir is not None else None
        self.task_settings = config.task_settings(layout and layout.builds, layout and layout.verifier_logs,
                                                  outputs_cap=limit_bytes(config.sandbox_disk))
        self.oracle = config.agent == "oracle"
        self.prefill = prefill
        self.worker_id = worker_id
        self.distribution = config.all_distributions()[config.distribution]
        self.model: ModelClient | None = None
        self.verifier: Verifier | None = None
        self.toolsets: dict[str, Toolset] = {}
        self.unavailable: list[Unavailable] = []
        self._root_override = workspace_root
        self._tmp: RunRoot | None = None
        self.workspace_root: Path = Path()
        self.sandboxes: SandboxProvider | None = None
        self.sandboxes_alive = 0  # samples' sandboxes made and not yet closed (the rollout service shows it)

    async def start(self, model: ModelClient | None = None) -> list[Unavailable]:
        from trajforge.model.factory import make_client

        if not self.oracle:  # the oracle runs each task's solution: no model, no tools
            self.model = model or make_client(self.config.agent_model_settings())
            self.verifier = Verifier(self.config, self.model)
            wanted = [ts for ts, p in self.distribution.probabilities.items() if p > 0]
            self.toolsets, self.unavailable = await build_toolsets(wanted, self.tool_settings)
        if not self.toolsets and not self.oracle:  # every sample would get no tool at all: refuse rather than run blind
            why = "; ".join(f"{u.toolset}: {u.reason}" for u in self.unavailable)
            raise UsageError(f"--distribution {self.distribution.name}: none of its toolsets can be offered "
                             f"here ({why}); pick another distribution (see `trajforge distributions`)")
        self.sandboxes = await SandboxProvider(self.config.sandbox_settings()).start()
        if self._root_override is not None:
            self.workspace_root = self._root_override
            self.workspace_root.mkdir(parents=True, exist_ok=True)
        else:
            self._tmp = RunRoot()  # sandbox/workspace.py: a killed run's is swept by the next
            self.workspace_root = Path(self._tmp.name)
        return self.unavailable

    async def prefetch(self, images: Collection[str]) -> None:
        """Start pulling the container images that samples of this process will need (local runs)."""
        from trajforge.sandbox.factory import prefetch_images

        await prefetch_images(set(images))

    def drain(self) -> None:
        """No new sample will start here (retries of ones in flight aside): the sandboxes let go of what only new samples would use."""
        if self.sandboxes is not None:
            self.sandboxes.drain()

    async def aclose(self) -> None:
        for ts in self.toolsets.values():
            try:
                await ts.aclose()
            except Exception:  # closing one backend must not leak the others
                log.exception("closing toolset %s", ts.name)
        if self.verifier is not None:
            await self.verifier.aclose()
        if self.model is not None:
            await self.model.aclose()
        if self.sandboxes is not None:
            await self.sandboxes.aclose()
        if self._tmp is not None:
            self._tmp.cleanup()

    async def process(self, sample: Sample, *, attempt: int = 1, trace: Any = None) -> Outcome:
        """One attempt at one sample. Never raises except FatalModelError and cancellation."""
        batch_num = batch_number(sample.index, self.config.batch_size)
        if trace is None and self.config.verbose:
            trace = tracer(sample, self.config.batch_size, self.config.log_prefix_chars)
        started = time.monotonic()

        def outcome(status: str, **kw: Any) -> Outcome:
            return Outcome(sample.index, sample.identity, batch_num, status, attempts=attempt,  # type: ignore[arg-type]
                           seconds=time.monotonic() - started, worker=self.worker_id, **kw)

        try:
            toolsets, session, verification, timing = await self._run(sample, trace)
        except FatalModelError:
            raise
        except _WallTimeout:
            return outcome("failed", reason="timeout", message=f"exceeded the {self.config.sample_wall_timeout:g}s "
                           "wall-clock sample limit (--sample_wall_timeout)")
        except TimeoutError:
            return outcome("failed", reason="timeout", message=f"exceeded the {self.config.timeout:g}s sample limit "
                           "(--timeout, working time)")
        except SampleFailure as e:  # model call, sandbox or tool backend: its class says which
            again = self.config.retry_sandbox_limits or not _hit_a_limit(e)
            return outcome("failed", reason=e.failure_class, message=str(e), retryable=again)
        except Exception as e:  # a bug in one sample must not stop the run; it is recorded and retried
            log.exception("sample %s failed", sample.identity)
            return outcome("failed", reason="internal", message=f"{type(e).__name__}: {e}")
        record = build_record(session, prompt_index=sample.index, sample_id=sample.identity, batch_num=batch_num,
                              model=self._model_name, toolsets_used=toolsets, known_tools=known_tools(),
                              dataset_line=sample.line, row=sample.extra)
        record["rollout"] = sample.rollout
        record["timing"] = timing
        if sample.task is not None:
            record["task"] = sample.task.summary()
        if verification is not None:
            record["verification"] = verification
        if not self._keeps_without_reasoning and not record["reasoning"]["has_any_reasoning"]:
            return outcome("discarded", reason="no_reasoning", usage=record["usage"], api_calls=session.api_calls)
        return outcome("done", record=record)

    @property
    def _model_name(self) -> str:
        return ORACLE_MODEL if self.oracle else self.model.model_name  # type: ignore[union-attr]

    @property
    def _keeps_without_reasoning(self) -> bool:
        """The oracle has no reasoning to filter on: its records are always kept."""
        return self.config.keep_no_reasoning or self.oracle

    def _limit(self, task: TaskRun | None) -> float | None:
        """The sample's working-time limit: --timeout, at least a task's own agent time (plus its setup)."""
        limit = self.config.timeout
        if task is not None and task.time_limit is not None and limit is not None:
            limit = max(limit, task.time_limit + TASK_MARGIN)
        return limit

    async def _run(self, sample: Sample, trace: Any) -> tuple[list[str], SessionResult, dict[str, Any] | None,
                                                              dict[str, float]]:
        assert self.sandboxes is not None
        task = TaskRun(sample.task, self.task_settings) if sample.task is not None else None
        spec = self.verifier.spec(sample) if self.verifier is not None else None
        # Only available toolsets are drawn from, so a sample always gets at least one (start() checked).
        offered = [] if self.oracle else draw_toolsets(self.distribution, self.config.seed, sample.identity,
                                                         self.toolsets)
        tools = tools_for(offered, self.toolsets)
        provider = self.sandboxes
        made = False

        async def create() -> Sandbox:
            nonlocal made
            if task is not None:  # the task's own image (built if need be) and limits
                box = await task.create(provider, self.workspace_root)
            else:
                box = await provider.create(cwd=sample.cwd, image=sample.image, root=self.workspace_root)
            made = True
            self.sandboxes_alive += 1
            return box

        async def create_waiting() -> Sandbox:
            with working.waiting():  # a slot being free (or made) is the run's wait, not the sample's work
                return await create()

        # Made before the limits begin (a container's image pull or build, or a wait for a
        # container slot, is the run's cost, not this sample's), or, where the backend makes
        # sandboxes ahead of time (bwrap as root), at the first tool call (sandbox/lazy.py) with
        # the working clock stopped.
        lazy = task is None and await provider.made_on_first_use(sample.image)
        sandbox = (provider.lazy(create_waiting, image=sample.image, root=self.workspace_root) if lazy
                   else await create())
        try:
            ctx = ToolContext(sandbox, self.tool_settings, sample.identity)
            clock = working.WorkingClock()
            if isinstance(sandbox, LazySandbox):  # parked at the gate or in a backoff: no sandbox made for it
                clock.observe(sandbox.park)
            try:
                async with asyncio.timeout(self.config.sample_wall_timeout) as wall:
                    async with asyncio.timeout(self._limit(task)) as limit, ctx.cleanup:
                        with working.bound(clock), clock.limiting(limit):
                            session, check, verification = await self._session(sample, task, spec, sandbox, ctx,
                                                                               tools, trace)
            except TimeoutError:
                if wall.expired():
                    raise _WallTimeout() from None
                raise
            timing = {"working_s": round(clock.working, 3), "wall_s": round(clock.wall, 3)}
            tool_usage = ctx.state.get("tool_model_usage")
            if tool_usage is not None:  # tokens spent by vision/moa calls belong to the sample's cost
                session.usage.add(tool_usage)
        finally:
            closing = asyncio.ensure_future(sandbox.close())
            try:
                await asyncio.shield(closing)  # a cancellation must not leave its processes running
            except asyncio.CancelledError:
                await closing
                raise
            finally:
                if made:
                    self.sandboxes_alive -= 1
        if task is None and self._verifies(session):  # the answer and the judge need no sandbox: it is closed
            assert self.verifier is not None and spec is not None
            verification, judge_usage = await self.verifier.finish(
                spec, check, task=sample.prompt, answer=final_answer(session.turns, session.end_reason))
            session.usage.add(judge_usage)  # the judge's tokens are part of what this sample cost
        return offered, session, verification, timing

    async def _session(self, sample: Sample, task: TaskRun | None, spec: Resolved | None, sandbox: Sandbox,
                       ctx: ToolContext, tools: Any, trace: Any) -> tuple[SessionResult, Part | None,
                                                                          dict[str, Any] | None]:
        """The agent's session (or the oracle's), then the check or the task's tests, which have
        their own timeouts and so do not count as the sample's working time."""
        check: Part | None = None
        verification: dict[str, Any] | None = None
        if task is not None and task.oracle:
            session = await task.run_oracle(sandbox)  # type: ignore[arg-type]
        else:
            assert self.model is not None
            session = await run_session(
                sample.prompt, self.model, tools, ctx, max_turns=self.config.max_turns,
                ephemeral_system_prompt=self.config.ephemeral_system_prompt, prefill=self.prefill,
                trace=trace, limits=SpendLimits(self.config.max_tokens_per_sample, self.config.max_cost_per_sample),
                time_limit=task.time_limit if task is not None else None,
                spoiled=(lambda e: task.agent_broke(sandbox, e)) if task is not None else None,  # type: ignore[arg-type]
            )
        if self._verifies(session):
            with working.waiting():
                if task is not None:
                    verification = await task.verify(sandbox, session, sample.identity,  # type: ignore[arg-type]
                                                     self._model_name)
                else:
                    assert self.verifier is not None and spec is not None
                    check = await self.verifier.in_sandbox(spec, sandbox)
        return session, check, verification

    def _verifies(self, session: SessionResult) -> bool:
        """Verification is skipped for a session the no-reasoning filter will discard anyway."""
        return self._keeps_without_reasoning or reasoning_stats(session)["has_any_reasoning"]
