"""The steps of one task sample that differ from a dataset row's, for the sample worker.

SampleWorker._run runs every sample the same way (sandbox, agent loop under the sample's limit,
verification in the still-open sandbox, close); a TaskRun supplies the task's parts: its container
(the task's image, built if need be, its WORKDIR as the agent's working directory, its cpus,
memory, storage and network), the agent's time limit, the oracle in place of the model, and the
hidden tests after the agent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trajforge.agent.atif import document, messages_of
from trajforge.agent.loop import SessionResult
from trajforge.sandbox.interface import (
    ImageSandbox, Provider, SampleResources, SandboxError, SandboxLimitError, SandboxSpoiled,
)
from trajforge.tasks.environment import TaskImage, task_images
from trajforge.tasks.oracle import ORACLE_MODEL, run_oracle
from trajforge.tasks.task_settings import TaskSettings
from trajforge.task_spec import TaskSpec
from trajforge.tasks.verify import run_tests


class TaskRun:
    def __init__(self, spec: TaskSpec, settings: TaskSettings) -> None:
        self.spec, self.settings = spec, settings
        self._made: tuple[Provider, Path, TaskImage] | None = None  # what a sealed verifier's sandbox is made with

    @property
    def oracle(self) -> bool:
        return self.settings.agent == "oracle"

    @property
    def time_limit(self) -> float | None:
        """Seconds of the agent's part ([agent].timeout_sec times --timeout_multiplier)."""
        return self.settings.scaled(self.spec.agent_timeout)

    def resources(self, *, seed: bool = True) -> SampleResources:
        """The task's [environment] limits, each at most the run's cap."""
        spec, s = self.spec, self.settings
        return SampleResources(memory=s.capped(spec.memory, s.max_memory),  # type: ignore[arg-type]
                               cpus=s.capped(spec.cpus, s.max_cpus), disk=s.capped(spec.storage, s.max_storage),  # type: ignore[arg-type]
                               network_none=spec.allow_internet is False, seed=seed)

    async def create(self, provider: Provider, root: Path) -> ImageSandbox:
        """The task's started sandbox. BuildError (its image did not build) or SandboxError."""
        image = await (await task_images(provider, self.settings)).image_for(self.spec)
        self._made = (provider, root, image)
        return await self._sandbox(seed=True)

    async def _sandbox(self, *, seed: bool) -> ImageSandbox:
        assert self._made is not None
        provider, root, image = self._made
        sb = await provider.create(cwd=image.workdir, image=image.image, root=root, resources=self.resources(seed=seed))
        assert isinstance(sb, ImageSandbox), f"{type(sb).__name__} runs images but is no ImageSandbox"
        return sb

    async def agent_broke(self, sandbox: ImageSandbox, e: BaseException) -> bool:
        """Whether the agent broke its own sandbox (its limits reached, its container stopped): its
        session then ends and is verified, and what it broke is scored (tasks/verify.py), rather
        than the sample failing as though the sandbox had."""
        cause: BaseException | None = e
        while cause is not None:
            if isinstance(cause, (SandboxLimitError, SandboxSpoiled)):
                return True
            cause = cause.__cause__
        try:
            await sandbox.stop_processes()
        except SandboxSpoiled:
            return True  # its container stopped: only its own processes could do that
        except SandboxError:
            return False
        return False

    async def run_oracle(self, sandbox: ImageSandbox) -> SessionResult:
        return await run_oracle(sandbox, self.spec, self.settings)

    def trajectory(self, session: SessionResult, sample_id: str, model: str) -> dict[str, Any]:
        """The session in ATIF, as /logs/agent/trajectory.json holds it."""
        messages, usage = messages_of(session)
        return document(messages, session.tools, session_id=sample_id, model=ORACLE_MODEL if self.oracle else model,
                        step_usage=usage, total_usage=session.usage.as_dict(), llm_calls=not self.oracle,
                        extra={"task": self.spec.name, "end_reason": session.end_reason})

    async def verify(self, sandbox: ImageSandbox, session: SessionResult, sample_id: str,
                     model: str) -> dict[str, Any]:
        """The record's `verification` from the task's tests (tasks/verify.py); a sealed verifier's
        sandbox is the task's image again, its working directory empty."""
        return await run_tests(sandbox, self.spec, self.settings, self.trajectory(session, sample_id, model),
                               sample_id=sample_id, fresh=lambda: self._sandbox(seed=False))
