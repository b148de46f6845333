"""The `terminal` toolset: `terminal` runs a shell command, `process` manages background jobs.

Commands go through the sample's sandbox, so the backend decides isolation; this module owns
the model-facing contract: result shapes, output caps, timeouts and the per-sample job table
(`ctx.state["terminal"]`). A job's output stays with the sandbox (Sandbox.spawn returns a Job
read by offset), never in the model's files; the jobs are killed through `ctx.cleanup` (and the
sandbox's close() kills them as well).
"""

from __future__ import annotations

import asyncio
import codecs
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trajforge.jsonio import dumps_str
from trajforge.sandbox.interface import Job as SandboxJob
from trajforge.sandbox.interface import SandboxError
from trajforge.sandbox.process import cap_text, truncation_marker
from trajforge.tools.tool import Tool, ToolContext, ToolInfraError, Toolset, error, ok

if TYPE_CHECKING:
    from trajforge.tools.tool_settings import ToolSettings

OUTPUT_CAP = 50_000  # bytes of output returned per call
MAX_RUNNING_JOBS = 16
# Jobs a sample may start in all: under local and container each keeps a log descriptor (and a
# file in the host's /tmp) in the runner until the sample ends, so the model may still read it.
MAX_JOBS = 64
LIST_LAST, LIST_COMMAND_CHARS = 50, 200  # what action=list shows: a bounded result
# Fold stderr into stdout so the model sees both interleaved as in a terminal. Same line as the
# command, so bash's error line numbers still match the model's own lines.
_MERGE_STDERR = "exec 2>&1; "


def _result(output: str, exit_code: int | None, err: str | None, **extra: Any) -> str:
    return dumps_str({"output": output, "exit_code": exit_code, "error": err, **extra})


def _str_arg(args: dict[str, Any], name: str) -> str | None:
    value = args.get(name)
    return value if isinstance(value, str) and value.strip() else None


# The kernel refuses a single exec argument past 128 KiB (MAX_ARG_STRLEN), and every backend hands
# the command to a shell as one; the wrappers around it take a few hundred bytes.
MAX_COMMAND_BYTES = 120_000


def command_problem(command: str) -> str | None:
    """Why no shell can run `command` as given (the model can change it), or None."""
    if "\0" in command:
        return "the command contains a NUL byte, which no shell command can hold"
    if len(command) > MAX_COMMAND_BYTES // 4 and len(command.encode("utf-8", "replace")) > MAX_COMMAND_BYTES:
        return (f"the command is longer than {MAX_COMMAND_BYTES} bytes, the most one shell command may be; "
                "write long scripts or data to a file with write_file and run that")
    return None


@dataclass
class Job:
    id: str
    command: str
    proc: SandboxJob
    offset: int = 0
    decoder: codecs.IncrementalDecoder = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))

    def status(self) -> dict[str, Any]:
        code = self.proc.returncode
        info: dict[str, Any] = {"id": self.id, "command": self.command, "pid": self.proc.pid,
                                "status": "running" if code is None else "exited", "exit_code": code}
        if code is not None and code < 0:
            info["signal"] = -code
        return info

    async def read_new(self, cap: int) -> str:
        """Output written since the last read; the middle is dropped when there is too much."""
        final = self.proc.returncode is not None
        chunk = await self.proc.read(self.offset, cap)
        if chunk.dropped:
            text = (chunk.head.decode("utf-8", "replace") + truncation_marker(chunk.dropped)
                    + chunk.tail.decode("utf-8", "replace"))
            self.decoder.reset()
        else:
            text = self.decoder.decode(chunk.head + chunk.tail, final=final)
        self.offset = chunk.end
        return text


class Jobs:
    """One sample's background jobs (ids proc_1, proc_2, ...)."""

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        self._ids = itertools.count(1)

    @classmethod
    def of(cls, ctx: ToolContext) -> Jobs:
        jobs = ctx.state.get("terminal")
        if jobs is None:
            jobs = ctx.state["terminal"] = cls()
            ctx.cleanup.push_async_callback(jobs.aclose)
        return jobs

    async def start(self, ctx: ToolContext, command: str) -> Job | str:
        if (problem := command_problem(command)) is not None:
            return problem
        if sum(j.proc.returncode is None for j in self.jobs.values()) >= MAX_RUNNING_JOBS:
            return f"too many background processes running (limit {MAX_RUNNING_JOBS}); kill some first"
        if len(self.jobs) >= MAX_JOBS:
            return (f"this task has started {MAX_JOBS} background processes, the most it may; run further "
                    "commands in the foreground (terminal), or combine them into one background script")
        job_id = f"proc_{next(self._ids)}"
        try:
            proc = await ctx.sandbox.spawn(command)
        except SandboxError as e:
            raise ToolInfraError(str(e)) from e
        job = self.jobs[job_id] = Job(job_id, command, proc)
        return job

    async def kill(self, job: Job) -> None:
        await job.proc.kill()

    async def aclose(self) -> None:
        running = [j for j in self.jobs.values() if j.proc.returncode is None]
        if running:
            await asyncio.gather(*(j.proc.kill() for j in running), return_exceptions=True)


class TerminalTool(Tool):
    name = "terminal"
    toolset = "terminal"
    description = (
        "Run a shell command (bash) in the task's working directory and return its combined "
        "stdout/stderr and exit code. Each call starts a fresh shell in the working directory, so "
        "`cd` does not carry over: chain with `cd dir && cmd`. Non-interactive: stdin is empty. "
        "Long output keeps its beginning and end. Use background=true (or the process tool) for "
        "servers and other long-running commands."
    )
    parameters = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The shell command to run."},
            "timeout": {"type": "integer", "minimum": 1,
                        "description": "Seconds before the command and its children are killed "
                                       "(capped by the run's tool timeout)."},
            "background": {"type": "boolean", "default": False,
                           "description": "Start the command in the background and return a process id "
                                          "to use with the process tool."},
        },
        "required": ["command"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        command = _str_arg(args, "command")
        if command is None:
            return error("'command' must be a non-empty string")
        limit = ctx.settings.tool_timeout
        timeout = args.get("timeout")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
                return error("'timeout' must be a positive number of seconds")
            limit = min(float(timeout), limit)
        if args.get("background") is True:  # Jobs.start checks the command as for the process tool
            job = await Jobs.of(ctx).start(ctx, command)
            if isinstance(job, str):
                return _result("", None, job)
            return _result(f"started background process {job.id} (pid {job.proc.pid}); use the process "
                           f"tool with id={job.id} to poll its output or kill it", None, None, id=job.id)
        if (problem := command_problem(command)) is not None:
            return _result("", None, problem)
        try:
            res = await ctx.sandbox.exec(_MERGE_STDERR + command, timeout=limit)
        except SandboxError as e:
            raise ToolInfraError(str(e)) from e
        output, _ = cap_text(res.stdout + res.stderr, OUTPUT_CAP)
        if res.start_error is not None:
            return _result(output, res.exit_code, res.start_error)
        if res.timed_out:
            return _result(output, None, f"command timed out after {limit:g}s (the command and its "
                                         "child processes were killed)")
        return _result(output, res.exit_code, None)


class ProcessTool(Tool):
    name = "process"
    toolset = "terminal"
    description = (
        "Manage background shell commands of this task. action=start runs `command` in the "
        "background and returns its id; poll returns its status (running/exited, exit code) and "
        "the output produced since the last poll; kill stops it and its children; list shows all."
    )
    parameters = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["start", "poll", "kill", "list"],
                       "description": "What to do."},
            "command": {"type": "string", "description": "Shell command to start (action=start)."},
            "id": {"type": "string", "description": "Process id such as proc_1 (action=poll or kill)."},
        },
        "required": ["action"],
    }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        action = args.get("action")
        jobs = Jobs.of(ctx)
        if action == "list":
            shown = [{**s, "command": s["command"][:LIST_COMMAND_CHARS]}
                     for s in (j.status() for j in list(jobs.jobs.values())[-LIST_LAST:])]
            return ok(processes=shown, **({"not_shown": len(jobs.jobs) - LIST_LAST} if len(jobs.jobs) > LIST_LAST else {}))
        if action == "start":
            command = _str_arg(args, "command")
            if command is None:
                return error("action=start needs 'command', a non-empty string")
            job = await jobs.start(ctx, command)
            return error(job) if isinstance(job, str) else ok(**job.status())
        if action not in ("poll", "kill"):
            return error("'action' must be one of start, poll, kill, list")
        job_id = args.get("id")
        job = jobs.jobs.get(job_id) if isinstance(job_id, str) else None
        if job is None:
            known = ", ".join(jobs.jobs) or "none"
            return error(f"no background process with id {job_id!r} (known: {known})")
        if action == "kill":
            await jobs.kill(job)
        output = await job.read_new(OUTPUT_CAP)
        return ok(**job.status(), output=output)


async def build(run: ToolSettings) -> Toolset:
    return Toolset("terminal", [TerminalTool(), ProcessTool()])
