"""Verifying a task after its agent: the hidden tests, with nothing the agent left able to count.

While the agent runs, the tests are nowhere in its container (not in the image: the build context
is environment/ alone; not copied in; the task directory is on the host, outside every mount).
Once its last turn ends, each of the runner's own steps is done from outside the container
(ImageSandbox: nothing of the agent's filesystem runs in them, so a replaced `/bin/sh` changes
none of them), in this order:
1. every process but the container's own is stopped (SIGSTOP, then SIGKILL, pass after pass):
   nothing of the agent runs on to rewrite what the tests read;
2. the tamper report (tasks/tamper.py): what the agent changed, outside its outputs, of what
   tests depend on, from the container's filesystem diff; it goes into `verification.tampered`;
3. the container the tests run in: the agent's own (default mode), or (sealed mode: --verifier
   sealed, or the task's [verifier] isolation = "sealed") a fresh container of the task's image
   whose working directory starts empty and gets the agent's outputs (its working directory, or
   [verifier].outputs), so nothing else the agent changed reaches the tests;
4. /tests and /logs are removed and made anew there, empty (root's, /logs/verifier writable by
   all), and checked: a planted reward file, a fake /tests/test.sh or a link where /logs was are gone;
5. the task's tests/ is copied to /tests, and the agent's trajectory, in ATIF, to
   /logs/agent/trajectory.json;
6. `bash /tests/test.sh` runs as [verifier].user (default: the image's USER) with
   [verifier].env, in the agent's working directory, under [verifier].timeout_sec (times
   --timeout_multiplier), through the engine with no shell of trajforge's in between (a replaced
   `sh` is not run), its output kept; past the timeout every process is stopped;
7. /logs/verifier/reward.json or reward.txt is read out (no link followed) and becomes the
   record's `verification` (tasks/reward.py), and /logs/verifier/ itself is kept, up to LOG_CAP
   bytes, in the run directory's verifier_logs/<sample>/ (`detail.tests.logs` says where).
What the sample broke of these steps (it stopped its container, filled its disk) is a fail with
reward 0 naming the cause, as are, in default mode, a verifier that timed out, crashed or wrote
no usable reward: trajforge.failures' table. In default mode the agent may have changed the
programs and files the tests use (replaced a binary, edited a library), as in Harbor's shared
environment; the README's attack table says what each mode prevents. Values of [verifier].env are
passed as written: `${VAR}` is not filled in from the runner's environment, whose keys stay its own.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from trajforge.failures import DEFAULT, SEALED
from trajforge.jsonio import dumps
from trajforge.redact import REGISTRY
from trajforge.sandbox.cache_dir import cache_dir
from trajforge.sandbox.interface import ImageSandbox, SandboxLimitError, SandboxSpoiled
from trajforge.tasks import tamper
from trajforge.tasks.reward import Reward, no_reward, parse_json, parse_txt, verification
from trajforge.tasks.task_settings import TaskSettings
from trajforge.task_spec import TaskSpec

REWARD_LIMIT = 1 << 20
LOG_CAP = 1 << 20  # bytes of /logs/verifier kept per sample
LOGS = "/logs/verifier"
FRESH = {"/tests": 0o755, "/logs": 0o755, "/logs/agent": 0o755, LOGS: 0o777}

Fresh = Callable[[], Awaitable[ImageSandbox]]  # a started sandbox of the task's image, its workspace empty


def mode_of(spec: TaskSpec, settings: TaskSettings) -> str:
    """Sealed when the run or the task asks for it."""
    return SEALED if SEALED in (settings.verifier, spec.verifier_isolation) else DEFAULT


async def prepare(sb: ImageSandbox, spec: TaskSpec, trajectory: dict[str, Any]) -> None:
    """Steps 4-5: /tests and /logs made anew, the tests and the trajectory copied in."""
    await sb.fresh_dirs(FRESH)
    await sb.upload(spec.tests_dir, "/tests")
    with tempfile.TemporaryDirectory(prefix="trajforge-atif-") as tmp:
        (Path(tmp) / "trajectory.json").write_bytes(dumps(trajectory))
        await sb.upload(Path(tmp), "/logs/agent")


async def read_reward(sb: ImageSandbox) -> Reward | None:
    for name, parse in (("reward.json", parse_json), ("reward.txt", parse_txt)):
        try:
            data = await sb.download(f"{LOGS}/{name}", REWARD_LIMIT)
        except ValueError as e:
            return Reward(None, source=name, problem=f"{name}: {e}")
        if data is not None:
            return parse(data)
    return None


def outputs_of(spec: TaskSpec, agent: ImageSandbox) -> tuple[str, ...]:
    """The agent's outputs: [verifier].outputs, else its working directory."""
    return spec.verifier_outputs or (agent.workdir,)


async def tamper_report(sb: ImageSandbox, spec: TaskSpec) -> tuple[list[dict[str, Any]] | None, int]:
    """Step 2: (the changes that count, at most tamper.MAX_LISTED; how many) or (None, 0) when the
    backend cannot tell."""
    outputs = outputs_of(spec, sb)
    extra = tuple(v for k, v in spec.verifier_env if k == "BASH_ENV" and v.startswith("/"))
    changes = await sb.changes(tamper.wanted(outputs, extra))
    if changes is None:
        return None, 0
    found = tamper.report(changes, outputs, extra)
    return found[:tamper.MAX_LISTED], len(found)


@contextlib.asynccontextmanager
async def sealed(agent: ImageSandbox, spec: TaskSpec, settings: TaskSettings, fresh: Fresh
                 ) -> AsyncIterator[ImageSandbox]:
    """Step 3, sealed: a fresh sandbox of the task's image with the agent's outputs copied in, closed after."""
    target = await fresh()
    try:
        for path in outputs_of(spec, agent):
            if path == agent.workdir and agent.workspace is not None:  # a host directory already: no copy out
                await target.upload(agent.workspace, path)
                continue
            with tempfile.TemporaryDirectory(prefix="trajforge-outputs-") as tmp:
                copied = await agent.download_tree(path, Path(tmp), settings.outputs_cap)
                if copied is not None and copied.left_out:
                    raise SandboxSpoiled(f"the agent's outputs under {path} are larger than {settings.outputs_cap} "
                                         f"bytes ({copied.left_out} file(s) left out)", kind="outputs_too_large")
                if copied is not None:
                    await target.upload(Path(tmp), path)
        yield target
    finally:
        await target.close()


def _log_dir(settings: TaskSettings, sample_id: str) -> Path:
    base = settings.verifier_log_dir or cache_dir() / "verifier-logs"
    return base / re.sub(r"[^A-Za-z0-9._-]", "_", sample_id)


async def keep_logs(sb: ImageSandbox, settings: TaskSettings, sample_id: str) -> dict[str, Any] | None:
    """Step 7's copy of /logs/verifier/ (what the tests wrote beside the reward), capped; where it went."""
    dest = _log_dir(settings, sample_id)
    if dest.exists():  # an earlier attempt's
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    try:
        copied = await sb.download_tree(LOGS, dest, LOG_CAP)
    except SandboxSpoiled:
        raise
    except Exception as e:  # noqa: BLE001 (the logs are a help, never the verdict)
        return {"dir": str(dest), "error": str(e)[:300]}
    if copied is None or not any(dest.iterdir()):
        dest.rmdir()
        return None
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file() and not p.is_symlink())
    where = str(dest.relative_to(settings.verifier_log_dir.parent)) if settings.verifier_log_dir else str(dest)
    info: dict[str, Any] = {"dir": where, "files": files, "bytes": copied.kept}
    if copied.left_out:
        info["left_out"] = {"files": copied.left_out, "bytes": copied.left_out_bytes}
    return info


async def _test(sb: ImageSandbox, spec: TaskSpec, settings: TaskSettings, trajectory: dict[str, Any],
                sample_id: str, mode: str) -> dict[str, Any]:
    """Steps 4-7 in `sb`."""
    await prepare(sb, spec, trajectory)
    timeout = settings.scaled(spec.verifier_timeout)
    assert timeout is not None
    started = time.monotonic()
    res = await sb.run(["bash", "/tests/test.sh"], timeout=timeout, user=spec.verifier_user,
                       env=dict(spec.verifier_env))  # past its timeout, everything it left is stopped
    seconds = time.monotonic() - started
    reward = None if res.timed_out else await read_reward(sb)
    logs = await keep_logs(sb, settings, sample_id)
    output = REGISTRY.text(res.stdout + res.stderr)
    message = f"the test script passed its {timeout:g} s timeout" if res.timed_out else None
    v = verification(reward, threshold=settings.pass_threshold, exit_code=res.exit_code, timed_out=res.timed_out,
                     seconds=seconds, output=output, message=message, mode=mode)
    if logs is not None:
        v["detail"]["tests"]["logs"] = logs
    return v


async def run_tests(sb: ImageSandbox, spec: TaskSpec, settings: TaskSettings, trajectory: dict[str, Any], *,
                    sample_id: str, fresh: Fresh) -> dict[str, Any]:
    """The whole procedure; the record's `verification`. SandboxError when the engine or host fails us."""
    mode = mode_of(spec, settings)
    stopped_note = None
    tampered: list[dict[str, Any]] | None = None
    count = 0
    try:
        try:
            stopped = await sb.stop_processes()
            stopped_note = stopped.note
            tampered, count = await tamper_report(sb, spec)
        except SandboxSpoiled as e:
            if mode != SEALED or e.kind != "container_stopped":
                raise
            stopped_note = str(e)  # its outputs are still there to be verified
        if mode == SEALED:
            async with sealed(sb, spec, settings, fresh) as target:
                v = await _test(target, spec, settings, trajectory, sample_id, mode)
        else:
            v = await _test(sb, spec, settings, trajectory, sample_id, mode)
    except SandboxSpoiled as e:
        v = no_reward(e.kind, str(e), mode=mode)
    except SandboxLimitError as e:  # the sample's disk limit, reached by what the agent left
        v = no_reward("disk_full", str(e), mode=mode)
    v["tampered"] = tampered
    if count > len(tampered or []):
        v["tampered_count"] = count
    if stopped_note is not None:
        v["detail"]["tests"]["stopped"] = stopped_note
    return v
