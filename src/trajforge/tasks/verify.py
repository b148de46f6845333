"""Verifying a task after its agent: the hidden tests, with nothing the agent left able to count.

While the agent runs, the tests are nowhere in its container (not in the image: the build context
is environment/ alone; not copied in; the task directory is on the host, outside every mount).
Once its last turn ends, in this order, in the same container, each of the runner's own steps
done from outside (ImageSandbox: nothing of the agent's filesystem runs in them, so a replaced
`/bin/sh` changes none of them):
1. every process but the container's own is stopped (SIGSTOP, then SIGKILL, pass after pass):
   nothing of the agent runs on to rewrite what the tests read;
2. /tests and /logs are removed and made anew, empty (root's, /logs/verifier writable by all), and
   checked: a planted reward file, a fake /tests/test.sh or a link where /logs was are gone;
3. the task's tests/ is copied to /tests, and the agent's trajectory, in ATIF, to
   /logs/agent/trajectory.json;
4. `bash /tests/test.sh` runs as [verifier].user (default: the image's USER) with
   [verifier].env, in the agent's working directory, under [verifier].timeout_sec (times
   --timeout_multiplier), its output kept; past the timeout its processes are killed;
5. /logs/verifier/reward.json or reward.txt is read out through the engine (a link is not
   followed) and becomes the record's `verification` (tasks/reward.py).
What remains possible, as in Harbor's shared-environment mode: the agent may have changed the
programs and files the tests use (replaced a binary, edited a library); tests that need an
untouched toolchain should bring their own or check it. Values of [verifier].env are passed as
written: `${VAR}` is not filled in from the runner's environment, whose keys stay its own.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from trajforge.jsonio import dumps
from trajforge.redact import REGISTRY
from trajforge.sandbox.interface import ImageSandbox
from trajforge.tasks.reward import Reward, parse_json, parse_txt, verification
from trajforge.tasks.task_settings import TaskSettings
from trajforge.task_spec import TaskSpec

REWARD_LIMIT = 1 << 20
FRESH = {"/tests": 0o755, "/logs": 0o755, "/logs/agent": 0o755, "/logs/verifier": 0o777}


async def prepare(sb: ImageSandbox, spec: TaskSpec, trajectory: dict[str, Any]) -> None:
    """Steps 1-3: stop the agent's processes, reset /tests and /logs, copy the tests and trajectory in."""
    await sb.stop_processes()
    await sb.fresh_dirs(FRESH)
    await sb.upload(spec.tests_dir, "/tests")
    with tempfile.TemporaryDirectory(prefix="trajforge-atif-") as tmp:
        (Path(tmp) / "trajectory.json").write_bytes(dumps(trajectory))
        await sb.upload(Path(tmp), "/logs/agent")


async def read_reward(sb: ImageSandbox) -> Reward | None:
    for name, parse in (("reward.json", parse_json), ("reward.txt", parse_txt)):
        try:
            data = await sb.download(f"/logs/verifier/{name}", REWARD_LIMIT)
        except ValueError as e:
            return Reward(None, source=name, problem=f"{name}: {e}")
        if data is not None:
            return parse(data)
    return None


async def run_tests(sb: ImageSandbox, spec: TaskSpec, settings: TaskSettings,
                    trajectory: dict[str, Any]) -> dict[str, Any]:
    """The whole procedure; the record's `verification`. SandboxError when the container fails us."""
    await prepare(sb, spec, trajectory)
    timeout = settings.scaled(spec.verifier_timeout)
    assert timeout is not None
    started = time.monotonic()
    res = await sb.exec("bash /tests/test.sh 2>&1", timeout=timeout, user=spec.verifier_user,
                        env=dict(spec.verifier_env))
    seconds = time.monotonic() - started
    if res.timed_out:
        await sb.stop_processes()  # what the script left running must not write a reward late
    reward = None if res.timed_out else await read_reward(sb)
    output = REGISTRY.text(res.stdout + res.stderr)
    message = f"the test script passed its {timeout:g} s timeout" if res.timed_out else None
    return verification(reward, threshold=settings.pass_threshold, exit_code=res.exit_code, timed_out=res.timed_out,
                        seconds=seconds, output=output, message=message)
