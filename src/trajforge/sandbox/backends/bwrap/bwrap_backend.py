"""The bwrap backend's entry points: the probe, and the per-run settings every sample shares.

Its spec (trajforge.catalog.sandboxes) names `make`, `status` (the probe), `egress_probe` and
`prepare`, and says a sample's sandbox is made at its first tool call: as root a sample takes a
sandbox made ahead of time (sandbox_pool.py) then, so a two-call sample holds one about half as
long, and one that calls no tool takes none (sandbox/lazy.py). `make` builds a sample's
BwrapSandbox (bwrap_sandbox.py) from what the run's provider holds, worked out once (`_Run`): in root mode the run's runtime (bwrap_runtime.py), whose start is
itself the proof that bwrap works here; in user mode the result of `probe`, a real sandbox.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trajforge.sandbox.interface import Provider, SandboxError
from trajforge.sandbox.backends.bwrap.bwrap_sandbox import BwrapSandbox
from trajforge.sandbox.backends.bwrap.bwrap_layout import NOT_FOUND, SYSTEM_DIRS, find_bwrap
from trajforge.sandbox.backends.bwrap.bwrap_runtime import RootRuntime, root_runtime
from trajforge.sandbox.backends.bwrap.bwrap_start import helper_python
from trajforge.catalog.sandboxes import NetworkMode
from trajforge.sandbox.network import EgressSupport
from trajforge.sandbox.process import SAFE_PATH, Limits, run_argv
from trajforge.sandbox.host.cgroups import hierarchies
from trajforge.sandbox.host.resources import ResourceLimits
from trajforge.sandbox.sandbox_settings import SandboxSettings

_proven: list[bool] = []  # a root egress probe sandbox worked in this process (egress_probe)


@dataclass(frozen=True, slots=True)
class BwrapStatus:
    usable: bool
    path: str | None
    mode: str  # "root" or "user"
    detail: str  # version, or why it is not usable

    @property
    def uses(self) -> str:
        return self.path or ""

    def note(self) -> str:
        if not self.usable:
            return ""
        if self.mode == "root":
            return ("; runner is root: fresh namespaces and cgroup per sample, made ahead of time and used once, "
                    "commands and helper as a per-sample uid without privileges (process limit enforced)")
        return "; unprivileged: a user namespace per sample (process limit not enforced per sample)"

    def doctor_row(self) -> dict[str, Any]:
        return {"usable": self.usable, "path": self.path, "mode": self.mode, "detail": self.detail + self.note()}

    def doctor_lines(self) -> list[str]:
        return [f"{self.path or '-'}: {self.detail}{self.note()}"]

    def fix(self) -> str | None:
        if self.usable or self.path is None:
            return None  # usable, or not installed: the spec's `enable` says how to install it
        how = ("the kernel or a security policy (AppArmor, SELinux, a container this runs in) refuses its "
               "namespaces" if self.mode == "root" else
               "unprivileged user namespaces are off (sysctl kernel.unprivileged_userns_clone / "
               "user.max_user_namespaces) or refused by a security policy; or run trajforge as root")
        return f"{self.path} is installed but its test sandbox failed ({self.detail}): {how}"


async def probe() -> BwrapStatus:
    """Whether bwrap works here, by starting a real sandbox. Not cached: the run's provider keeps
    the answer (probe_status)."""
    mode = "root" if os.geteuid() == 0 else "user"
    path = find_bwrap()
    if path is None:
        return BwrapStatus(False, None, mode, NOT_FOUND)
    python, _ = helper_python(SYSTEM_DIRS)
    if not os.access(python, os.X_OK):
        return BwrapStatus(False, path, mode, f"no Python interpreter for the sandbox helper ({python})")
    version = (await run_argv([path, "--version"], timeout=10, cwd=None, env={"PATH": SAFE_PATH})).stdout.strip()
    if mode == "root" and _proven:  # the run's preflight egress probe was such a sandbox: one start saved
        return BwrapStatus(True, path, mode, version)
    with tempfile.TemporaryDirectory(prefix="trajforge-bwrap-probe-") as tmp:
        sb = BwrapSandbox(Path(tmp), network=NetworkMode.NONE, bwrap=path)
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


async def status(settings: SandboxSettings) -> BwrapStatus:
    """The spec's `status`: `probe`, which needs none of the run's settings."""
    return await probe()


async def probe_status(provider: Provider) -> BwrapStatus:
    """The run's bwrap probe, made once per provider (the provider's `status("bwrap")` too)."""
    return await provider.state("bwrap.status", probe)


async def egress_probe() -> EgressSupport:
    """Whether a root bwrap sample gets egress here, by a real probe sandbox (its tap0 up and the
    firewall loaded); network.egress_support checked root and the tools already."""
    path = find_bwrap()
    if path is None:
        return EgressSupport(False, "bwrap is not installed")
    # Root only: a real egress sandbox is also the proof that bwrap works (probe skips its own).
    with tempfile.TemporaryDirectory(prefix="trajforge-egress-probe-") as tmp:
        sb = BwrapSandbox(Path(tmp), network=NetworkMode.EGRESS, bwrap=path)
        try:
            await sb.start()
            res = await sb.exec("grep -c eth0 /proc/net/dev", timeout=10)
            if res.exit_code == 0:
                _proven.append(True)
                return EgressSupport(True, "a router namespace per run: slirp4netns (--disable-host-loopback) "
                                           "+ nftables blocks")
            return EgressSupport(False, f"a probe sandbox has no eth0: {(res.stderr or res.stdout).strip()[-200:]}")
        except SandboxError as e:
            return EgressSupport(False, str(e))
        finally:
            await sb.close()


@dataclass(frozen=True, slots=True)
class _Run:
    """What every bwrap sample of a run shares, worked out once per provider."""

    status: BwrapStatus
    network: NetworkMode
    limits: Limits
    sample_limits: ResourceLimits
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
    return BwrapSandbox(root, keep=run.keep, cwd=cwd, limits=run.limits, network=run.network, allow=run.allow,
                        sample_limits=run.sample_limits, nproc=run.nproc, bwrap=run.status.path, runtime=run.runtime)
