"""The report of `trajforge doctor` (the command: trajforge.cli.doctor): which sandbox backends
work on this machine, and why the others do not.

Every backend declared in trajforge.catalog.sandboxes gets a row, from its own real check (its
spec's `status`: bwrap starts a probe sandbox, Podman answers `podman info`, the Docker CLI must
reach a daemon). The output names what `--sandbox auto` will use, the network modes and the
per-sample limits and how each is enforced here. Exit status 0 when the auto choice works (it
always can fall back to local), so scripts may rely on `--json` rather than the code.
`--repair` first runs each backend's `repair` (its spec's capability: the container backend frees
a wedged Podman storage) and prints every step; exit status 1 when something is still broken.
"""

from __future__ import annotations

import asyncio
from typing import Any

from trajforge.catalog.sandboxes import AUTO, SANDBOXES, BackendSpec, NetworkMode, auto_order, image_backend
from trajforge.sandbox.interface import BackendStatus
from trajforge.registry import load
from trajforge.sandbox.factory import backend_status, choose_auto
from trajforge.sandbox.host.cgroups import hierarchies
from trajforge.sandbox.host.disk import disk_usable, human
from trajforge.sandbox.network import doctor_rows
from trajforge.sandbox.sandbox_settings import ContainerSettings, ResourceLimits, SandboxSettings


async def gather_report(engine_choice: str = "auto") -> tuple[dict[str, Any], dict[str, BackendStatus]]:
    """`doctor --json`'s report, and each backend's status for the text."""
    settings = SandboxSettings(container=ContainerSettings(engine=engine_choice))
    specs = SANDBOXES.specs()
    found = await asyncio.gather(*(backend_status(spec, settings) for spec in specs))
    statuses: dict[str, BackendStatus] = {spec.name: status for spec, status in zip(specs, found)}

    async def probed(spec: BackendSpec) -> BackendStatus:
        return statuses[spec.name]

    auto, _ = await choose_auto(probed)
    images = statuses[image_backend().name]
    report = {
        **{name: status.doctor_row() for name, status in statuses.items()},
        AUTO: auto,
        "rows_with_image": images.uses if images.usable else f"fail as `sandbox` ({images.detail})",
        "network": await doctor_rows(settings),
        "limits": _limits(),
    }
    return report, statuses


def _limits() -> dict[str, dict[str, Any]]:
    """The default per-sample limits and how each is enforced here (bwrap, runner as is)."""
    d = ResourceLimits()
    cg = hierarchies()
    disk = disk_usable()

    def group(controller: str, fallback: str) -> str:
        if cg is None or not cg.has(controller):
            return fallback
        return f"{controller} cgroup {cg.version} ({cg.parents[controller]})"

    return {
        "sandbox_memory": {"default": human(d.memory or 0),
                           "enforced_by": group("memory", "RLIMIT_AS per process (no writable memory cgroup)")},
        "sandbox_cpus": {"default": f"{d.cpus:g}",
                         "enforced_by": group("cpu", "not enforced (no writable cpu cgroup): commands run at nice 10")},
        "sandbox_tmp_size": {"default": human(d.tmp_size or 0), "enforced_by": "tmpfs size (bwrap --size)"},
        "sandbox_shm_size": {"default": human(d.shm_size or 0), "enforced_by": "tmpfs size (bwrap --size)"},
        "sandbox_disk": {"default": human(d.disk or 0), "enforced_by": "loop-mounted ext4 image per sample (with rootful Podman "
                         "also holding the container's own filesystem)" if disk
                         is None else f"NOT enforced ({disk}); only RLIMIT_FSIZE 1 GiB per file"},
        "sandbox_nproc": {"default": str(SandboxSettings().nproc),
                          "enforced_by": "RLIMIT_NPROC of the per-sample uid (root mode)"
                          + (f" and {group('pids', '')}" if cg is not None and cg.has("pids") else "")},
        "sandbox_cpu_seconds": {"default": f"{d.cpu_seconds}", "enforced_by": "RLIMIT_CPU per process"},
    }


def enable_hint(spec: BackendSpec, status: BackendStatus) -> str | None:
    """How to make backend `spec` usable here: repair what is installed but broken, else install it."""
    if status.usable:
        return None
    return status.fix() or spec.capabilities.enable or None


def _mark(ok: bool) -> str:
    return "usable    " if ok else "NOT usable"


def format_report(r: dict[str, Any], statuses: dict[str, BackendStatus]) -> str:
    lines = ["trajforge sandbox backends on this machine:", ""]
    for name, status in statuses.items():
        first, *rest = status.doctor_lines()
        lines.append(f"  {name:<10} {_mark(status.usable)}  {first}")
        lines += [f"  {line}" for line in rest]
    lines += ["", f"--sandbox auto uses: {r[AUTO]}; rows with an image use: {r['rows_with_image']}"]
    n = r["network"]
    lines += ["", f"network modes (--sandbox_network, {auto_order()[0].name}):"]
    for mode in NetworkMode:
        lines.append(f"  {mode:<8} {_mark(n[mode]['usable'])}  {n[mode]['detail']}")
    lines.append(f"--sandbox_network auto uses: {n[AUTO]}")
    lines += ["", "per-sample limits (config key: default, how it is enforced here):"]
    for key, row in r["limits"].items():
        lines.append(f"  {key:<20} {row['default']:<8} {row['enforced_by']}")
    if not n[NetworkMode.EGRESS]["usable"]:
        lines.append("to enable egress: run as root with slirp4netns and nftables installed")
    for spec in SANDBOXES.specs():
        if how := enable_hint(spec, statuses[spec.name]):
            lines.append(f"to enable {spec.name}: {how}")
    return "\n".join(lines)


async def repair() -> tuple[bool, list[str]]:
    """Each backend's `repair`: (everything healthy afterwards, the steps taken and what is left)."""
    healthy, lines = True, []
    for spec in SANDBOXES.specs():
        if spec.capabilities.repair is not None:
            ok, said = await load(spec.capabilities.repair)()
            healthy, lines = healthy and ok, [*lines, *(f"{spec.name}: {line}" for line in said)]
    return healthy, lines
