"""`--agent oracle`: a task's reference solution in place of a model, verified like any agent.

The standard check of a task set before spending money: a task whose oracle does not reach full
reward is broken (its tests, its environment or its solution), and the run's summary lists it.
solution/ is copied to /solution, `bash /solution/solve.sh` runs as the image's USER with
[solution].env in the agent's working directory, under the task's agent timeout (times
--timeout_multiplier), and /solution is removed before the tests run. Its record is a trajectory
of one step that no model made (`terminal` running the script, its output the observation),
`model` "oracle", no API call and no cost.
"""

from __future__ import annotations

from trajforge.agent.loop import SessionResult, ToolResult, Turn
from trajforge.jsonio import dumps_str
from trajforge.model.types import ToolCall, Usage
from trajforge.redact import REGISTRY
from trajforge.sandbox.interface import ImageSandbox
from trajforge.tasks.reward import clip_output
from trajforge.tasks.task_settings import TaskSettings
from trajforge.task_spec import TaskSpec
from trajforge.tools.terminal import TerminalTool

ORACLE_MODEL = "oracle"
SOLUTION = "/solution"
COMMAND = f"bash {SOLUTION}/solve.sh"
NO_LIMIT = 365 * 86400.0  # no agent timeout: the sample's own --timeout still bounds it


async def run_oracle(sb: ImageSandbox, spec: TaskSpec, settings: TaskSettings) -> SessionResult:
    await sb.fresh_dirs({SOLUTION: 0o755})
    await sb.upload(spec.solution_dir, SOLUTION)
    limit = settings.scaled(spec.agent_timeout)
    res = await sb.run(COMMAND.split(), timeout=limit or NO_LIMIT, env=dict(spec.solution_env))
    await sb.stop_processes()  # what the solution left running is the agent's part: it ends with it
    await sb.remove(SOLUTION)
    output = REGISTRY.text(clip_output(res.stdout + res.stderr))
    call = ToolCall("oracle_solve", "terminal", dumps_str({"command": COMMAND}))
    note = f"stopped after the task's {limit:g} s agent timeout" if res.timed_out else None
    result = ToolResult(call, dumps_str({"output": output, "exit_code": res.exit_code, "error": note}), note is not None)
    turn = Turn("", None, [call], [result], finish_reason="tool_calls")
    end = "agent_timeout" if res.timed_out else "answer"
    return SessionResult(spec.instruction, [TerminalTool().schema()], [turn], end == "answer", end != "answer", 0,
                         Usage(), end)
