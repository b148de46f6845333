"""The `check` command: run in the sample's own sandbox after the agent's last turn.

It runs before the sandbox is torn down, in the sample's working directory, so it sees every
file the agent left (and its background processes, still alive). Exit 0 passes. It has its own
timeout (`check_timeout`); when it expires the command's process tree is killed and the
verification is an error (`check_timeout`), neither a pass nor a fail. The command itself is
never recorded: the detail holds the exit code, the duration and the tail of the output.
"""

from __future__ import annotations

import time

from trajforge.sandbox.interface import ExecResult, Sandbox, SandboxError
from trajforge.verify.result import Part

TAIL_CHARS = 2000


def tail(text: str, limit: int = TAIL_CHARS) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


def check_part(res: ExecResult, seconds: float, timeout: float) -> Part:
    """The verdict of one finished (or timed-out) check run (pure)."""
    output = res.stdout + (("\n" if res.stdout and res.stderr else "") + res.stderr if res.stderr else "")
    detail = {"exit_code": res.exit_code, "seconds": round(seconds, 3), "output_tail": tail(output)}
    if res.timed_out:
        detail["timeout"] = timeout
        return Part.failure("check", "check_timeout", detail)
    return Part.verdict("check", res.exit_code == 0, detail)


async def run_check(sandbox: Sandbox, command: str, timeout: float) -> Part:
    started = time.monotonic()
    try:
        res = await sandbox.exec(command, timeout=timeout)
    except SandboxError as e:
        return Part.failure("check", "check_error", {"seconds": round(time.monotonic() - started, 3),
                                                     "message": str(e)[:500]})
    return check_part(res, time.monotonic() - started, timeout)
