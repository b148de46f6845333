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
from trajforge.sandbox.interface import Provider
from trajforge.sandbox.backends.container.container_sandbox import ContainerSandbox
from trajforge.sandbox.backends.container.container_ops import make_container, pids
from trajforge.tasks.environment import task_images
from trajforge.tasks.oracle import ORACLE_MODEL, run_oracle
from trajforge.tasks.task_settings import TaskSettings
from trajforge.task_spec import TaskSpec
from trajforge.tasks.verify import run_tests


class TaskRun:
    def __init__(self, spec: TaskSpec, settings: TaskSettings) -> None:
        self.spec, self.settings = spec, settings
        self.keep: set[int] = set()  # the container's own processes, there before the agent's first

    @property
    def oracle(self) -> bool:
        return self.settings.agent == "oracle"

    @property
    def time_limit(self) -> float | None:
        """Seconds of the agent's part ([agent].timeout_sec times --timeout_multiplier)."""
        return self.settings.scaled(self.spec.agent_timeout)

    async def create(self, provider: Provider, root: Path) -> ContainerSandbox:
        """The task's started container. BuildError (its image did not build) or SandboxError."""
        spec, s = self.spec, self.settings
        image = await (await task_images(provider, s)).image_for(spec)
        sb = await make_container(provider, image=image.image, cwd=image.workdir, root=root,
                                  memory=s.capped(spec.memory, s.max_memory),  # type: ignore[arg-type]
                                  cpus=s.capped(spec.cpus, s.max_cpus), disk=s.capped(spec.storage, s.max_storage),  # type: ignore[arg-type]
                                  network_none=spec.allow_internet is False)
        try:
            await sb.start()
            self.keep = await pids(sb)
        except BaseException:
            await sb.close()
            raise
        return sb

    async def run_oracle(self, sandbox: ContainerSandbox) -> SessionResult:
        return await run_oracle(sandbox, self.spec, self.settings)

    def trajectory(self, session: SessionResult, sample_id: str, model: str) -> dict[str, Any]:
        """The session in ATIF, as /logs/agent/trajectory.json holds it."""
        messages, usage = messages_of(session)
        return document(messages, session.tools, session_id=sample_id, model=ORACLE_MODEL if self.oracle else model,
                        step_usage=usage, total_usage=session.usage.as_dict(), llm_calls=not self.oracle,
                        extra={"task": self.spec.name, "end_reason": session.end_reason})

    async def verify(self, sandbox: ContainerSandbox, session: SessionResult, sample_id: str,
                     model: str) -> dict[str, Any]:
        """The record's `verification` from the task's tests (tasks/verify.py)."""
        return await run_tests(sandbox, self.spec, self.settings, self.keep, self.trajectory(session, sample_id, model))
