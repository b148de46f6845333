"""SampleWorker: everything needed to turn one sample into an Outcome, built once per process.

It owns the run-level resources (model client, toolsets) and, per sample, samples the toolsets,
starts a fresh sandbox, runs the agent loop under the per-sample wall-clock limit, verifies the
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

from trajforge.agent.limits import SampleLimits
from trajforge.agent.loop import SessionResult, run_session
from trajforge.agent.record import build_record
from trajforge.agent.stats import reasoning_stats
from trajforge.catalog import known_tools
from trajforge.catalog.distributions import sample_toolsets
from trajforge.config import RunConfig
from trajforge.dataset import Sample
from trajforge.errors import FatalModelError, SampleFailure, UsageError
from trajforge.model.types import ModelClient
from trajforge.sample.outcome import Outcome, batch_number
from trajforge.sample.settings import sandbox_settings, task_settings, tool_settings
from trajforge.sample.trace import tracer
from trajforge.sandbox.base import Sandbox
from trajforge.sandbox.factory import SandboxProvider
from trajforge.sandbox.workspace import RunRoot
from trajforge.tasks.oracle import ORACLE_MODEL
from trajforge.tasks.run import TaskRun
from trajforge.tools.base import ToolContext, Toolset, Unavailable
from trajforge.tools.registry import build_toolsets, tools_for
from trajforge.verify.result import Part
from trajforge.verify.verifier import Verifier, final_answer

log = logging.getLogger("trajforge.worker")
TASK_MARGIN = 120.0  # seconds of a task sample's limit beyond its agent timeout (its container's start)


class SampleWorker:
    def __init__(self, config: RunConfig, *, prefill: list[dict[str, Any]] | None = None,
                 worker_id: str = "local", workspace_root: Path | None = None,
                 build_log_dir: Path | None = None) -> None:
        self.config = config
        self.tool_settings = tool_settings(config)
        self.task_settings = task_settings(config, build_log_dir)
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

    async def start(self, model: ModelClient | None = None) -> list[Unavailable]:
        from trajforge.model.factory import make_client

        if not self.oracle:  # the oracle runs each task's solution: no model, no tools
            self.model = model or make_client(self.config.model_settings())
            self.verifier = Verifier(self.config, self.model)
            wanted = [ts for ts, p in self.distribution.probabilities.items() if p > 0]
            self.toolsets, self.unavailable = await build_toolsets(wanted, self.tool_settings)
        if not self.toolsets and not self.oracle:  # every sample would get no tool at all: refuse rather than run blind
            why = "; ".join(f"{u.toolset}: {u.reason}" for u in self.unavailable)
            raise UsageError(f"--distribution {self.distribution.name}: none of its toolsets can be offered "
                             f"here ({why}); pick another distribution (see `trajforge distributions`)")
        self.sandboxes = await SandboxProvider(sandbox_settings(self.config)).start()
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
            toolsets, session, verification = await self._run(sample, trace)
        except FatalModelError:
            raise
        except TimeoutError:
            return outcome("failed", reason="timeout", message=f"exceeded the {self.config.timeout:g}s sample limit")
        except SampleFailure as e:  # model call, sandbox or tool backend: its class says which
            return outcome("failed", reason=e.failure_class, message=str(e))
        except Exception as e:  # a bug in one sample must not stop the run; it is recorded and retried
            log.exception("sample %s failed", sample.identity)
            return outcome("failed", reason="internal", message=f"{type(e).__name__}: {e}")
        record = build_record(session, prompt_index=sample.index, sample_id=sample.identity, batch_num=batch_num,
                              model=self._model_name, toolsets_used=toolsets, known_tools=known_tools(),
                              dataset_line=sample.line, row=sample.extra)
        record["rollout"] = sample.rollout
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
        """The sample's wall-clock limit: --timeout, at least a task's own agent time (plus its setup)."""
        limit = self.config.timeout
        if task is not None and task.time_limit is not None and limit is not None:
            limit = max(limit, task.time_limit + TASK_MARGIN)
        return limit

    async def _run(self, sample: Sample, trace: Any) -> tuple[list[str], SessionResult, dict[str, Any] | None]:
        assert self.sandboxes is not None
        task = TaskRun(sample.task, self.task_settings) if sample.task is not None else None
        spec = self.verifier.spec(sample) if self.verifier is not None else None
        check: Part | None = None
        verification: dict[str, Any] | None = None
        # Only available toolsets are drawn from, so a sample always gets at least one (start() checked).
        offered = [] if self.oracle else sample_toolsets(self.distribution, self.config.seed, sample.identity,
                                                         self.toolsets)
        tools = tools_for(offered, self.toolsets)
        provider = self.sandboxes

        async def create() -> Sandbox:
            if task is not None:  # the task's own image (built if need be) and limits
                return await task.create(provider, self.workspace_root)
            return await provider.create(cwd=sample.cwd, image=sample.image, root=self.workspace_root)

        # Made before the wall-clock limit begins (a container's image pull or build, or a wait for
        # a container slot, is the run's cost, not this sample's), or, where the backend makes
        # sandboxes ahead of time (bwrap as root), at the first tool call (sandbox/lazy.py).
        lazy = task is None and await provider.made_on_first_use(sample.image)
        sandbox = provider.lazy(create, image=sample.image, root=self.workspace_root) if lazy else await create()
        try:
            ctx = ToolContext(sandbox, self.tool_settings, sample.identity)
            async with asyncio.timeout(self._limit(task)) as limit, ctx.cleanup:
                if task is not None and task.oracle:
                    session = await task.run_oracle(sandbox)  # type: ignore[arg-type]
                else:
                    assert self.model is not None
                    session = await run_session(
                        sample.prompt, self.model, tools, ctx, max_turns=self.config.max_turns,
                        ephemeral_system_prompt=self.config.ephemeral_system_prompt, prefill=self.prefill,
                        trace=trace, limits=SampleLimits(self.config.max_tokens_per_sample,
                                                         self.config.max_cost_per_sample),
                        time_limit=task.time_limit if task is not None else None,
                    )
                if self._verifies(session):
                    # The check and the tests have their own timeouts; the sample's limit resumes for
                    # the cleanup after them.
                    deadline, loop = limit.when(), asyncio.get_running_loop()
                    left = None if deadline is None else deadline - loop.time()
                    limit.reschedule(None)
                    if task is not None:
                        verification = await task.verify(sandbox, session, sample.identity,  # type: ignore[arg-type]
                                                         self._model_name)
                    else:
                        assert self.verifier is not None and spec is not None
                        check = await self.verifier.in_sandbox(spec, sandbox)
                    limit.reschedule(None if left is None else loop.time() + max(left, 0.0))
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
        if task is None and self._verifies(session):  # the answer and the judge need no sandbox: it is closed
            assert self.verifier is not None and spec is not None
            verification, judge_usage = await self.verifier.finish(
                spec, check, task=sample.prompt, answer=final_answer(session.turns, session.end_reason))
            session.usage.add(judge_usage)  # the judge's tokens are part of what this sample cost
        return offered, session, verification

    def _verifies(self, session: SessionResult) -> bool:
        """Verification is skipped for a session the no-reasoning filter will discard anyway."""
        return self._keeps_without_reasoning or reasoning_stats(session)["has_any_reasoning"]
