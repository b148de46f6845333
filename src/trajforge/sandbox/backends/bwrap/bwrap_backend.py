"""The bwrap backend's registration: the probe, and the per-run settings every sample shares.

`make` (factory.BACKENDS) builds a sample's BwrapSandbox (bwrap_sandbox.py) from what the run's provider
holds, worked out once (`_Run`): in root mode the run's runtime (bwrap_runtime.py), whose start is
itself the proof that bwrap works here; in user mode the result of `probe`, a real sandbox.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trajforge.sandbox.base import Provider, SandboxError
from trajforge.sandbox.backends.bwrap.bwrap_sandbox import BwrapSandbox
from trajforge.sandbox.backends.bwrap.bwrap_layout import NOT_FOUND, SYSTEM_DIRS, find_bwrap
from trajforge.sandbox.backends.bwrap.bwrap_runtime import RootRuntime, root_runtime
from trajforge.sandbox.backends.bwrap.bwrap_start import helper_python
from trajforge.sandbox.network import bwrap_proven
from trajforge.sandbox.process import SAFE_PATH, Limits, run_argv
from trajforge.sandbox.host.cgroups import hierarchies
from trajforge.sandbox.host.resources import SampleLimits

# As root, a sample takes a sandbox made ahead of time (sandbox_pool.py) at its first tool call: a
# two-call sample holds one about half as long, and one that calls no tool takes none
# (sandbox/lazy.py, factory.made_on_first_use).
MAKE_ON_FIRST_USE = True


@dataclass(frozen=True, slots=True)
class BwrapStatus:
    usable: bool
    path: str | None
    mode: str  # "root" or "user"
    detail: str  # version, or why it is not usable


async def probe() -> BwrapStatus:
    """Whether bwrap works here, by starting a real sandbox (~50 ms). Not cached: the run's
    provider keeps the answer (probe_status)."""
    mode = "root" if os.geteuid() == 0 else "user"
    path = find_bwrap()
    if path is None:
        return BwrapStatus(False, None, mode, NOT_FOUND)
    python, _ = helper_python(SYSTEM_DIRS)
    if not os.access(python, os.X_OK):
        return BwrapStatus(False, path, mode, f"no Python interpreter for the sandbox helper ({python})")
    version = (await run_argv([path, "--version"], timeout=10, cwd=None, env={"PATH": SAFE_PATH})).stdout.strip()
    if mode == "root" and bwrap_proven():  # the run's preflight egress probe was such a sandbox (~60 ms saved)
        return BwrapStatus(True, path, mode, version)
    with tempfile.TemporaryDirectory(prefix="trajforge-bwrap-probe-") as tmp:
        sb = BwrapSandbox(Path(tmp), network=False, bwrap=path)
        try:
            await sb.start()
            res = await sb.exec("echo ok > probe && cat probe", timeout=10)
            ok = res.exit_code == 0 and res.stdout.strip() == "ok"
            detail = version if ok else f"{version}: a test sandbox failed: {(res.stderr or res.stdout).strip()[-300:]}"
        except SandboxError as e:
            ok, detail = False, f"{version}: a test sandbox failed: {e}"
        finally:
            await sb.close()
    return BwrapStatus(ok, path, mode, detail)


async def probe_status(provider: Provider) -> BwrapStatus:
    """The run's bwrap probe, made once per provider."""
    return await provider.state("bwrap.status", probe)


@dataclass(frozen=True, slots=True)
class _Run:
    """What every bwrap sample of a run shares, worked out once per provider."""

    status: BwrapStatus
    network: str
    limits: Limits
    sample_limits: SampleLimits
    keep: bool
    allow: tuple[str, ...]
    nproc: int
    runtime: RootRuntime | None


async def _run_of(provider: Provider) -> _Run | SandboxError:
    """Root mode: starting the runtime is the probe (a failure is kept, not retried per sample)."""
    if os.geteuid() == 0:
        path = find_bwrap()
        status = BwrapStatus(path is not None, path, "root", "" if path else NOT_FOUND)
    else:
        status = await probe_status(provider)
    if not status.usable:
        return SandboxError(f"--sandbox bwrap is not usable here: {status.detail} (see `trajforge doctor`)")
    settings = provider.settings
    network = await provider.network_mode()
    privileged = status.mode == "root"
    sample_limits = provider.sample_limits()
    runtime = None
    if privileged:
        async def start() -> RootRuntime:
            # Sized to demand: the samples whose sandbox is yet to be made (provider.waiting).
            started = await root_runtime(status.path, network, settings.allow, sample_limits, settings.nproc,
                                         demand=lambda: provider.waiting)
            provider.on_demand(started.refill)
            provider.on_drain(started.drain)
            return started

        try:
            runtime = await provider.state("bwrap.runtime", start, RootRuntime.aclose)
        except SandboxError as e:
            return SandboxError(f"--sandbox bwrap is not usable here: {e} (see `trajforge doctor`)")
    # A memory cgroup holds the whole sample in root mode; otherwise RLIMIT_AS per process stands in.
    limits = provider.command_limits(memory_cgroup=privileged and hierarchies() is not None)
    return _Run(status, network, limits, sample_limits, settings.keep_workspaces, settings.allow, settings.nproc,
                runtime)


async def prepare(provider: Provider, root: Path) -> None:
    """A run's first sample is on its way: as root, start the runtime and the pool of `root` now,
    so sandboxes are being made while the sample waits for its model (sandbox_pool.py)."""
    run = await provider.state("bwrap.run", lambda: _run_of(provider))
    if not isinstance(run, SandboxError) and run.runtime is not None:
        run.runtime.pool(root)
        run.runtime.refill()


async def make(provider: Provider, *, cwd: str | None, image: str | None, root: Path) -> BwrapSandbox:
    async def work_out() -> _Run | SandboxError:
        return await _run_of(provider)

    run = await provider.state("bwrap.run", work_out)
    if isinstance(run, SandboxError):
        raise run
    return BwrapSandbox(root, keep=run.keep, cwd=cwd, limits=run.limits, network=run.network == "host",
                        egress=run.network == "egress", allow=run.allow, sample_limits=run.sample_limits,
                        nproc=run.nproc, bwrap=run.status.path, runtime=run.runtime)
