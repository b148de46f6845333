"""What a sandbox costs, per backend and setting: a sample's sandbox, and a command.

Each figure is the CPU of a child process and everything it reaped (os.wait4: exact, even for
the zygote and the sandboxes' processes, reaped when the run closes), with the fixed cost of a
child that only starts and closes a provider subtracted:
- sample, at once: N samples at once (create, write a file, `true`, close): as root, bwrap makes
  and destroys a sandbox for each (namespaces, cgroup, disk, helper: backends/bwrap/sandbox_pool.py),
  local a cgroup and workspace;
- sample, one after another: the same N samples in turn;
- command: N `true` in one sample.
`--split` adds, for the root-mode rows, where a sample's CPU went when N start at once (each
part's fixed cost subtracted likewise; /proc's per-thread and per-process clocks, in ticks):
the runner's event loop (Python bookkeeping), the runner's other threads (the pool's disks,
cgroups and workspaces, and asyncio's to_thread), the zygote itself (forks, network
namespaces), the sandboxes' own processes (mount tree, drop, helper, the sample's commands),
and the rest (template, router, the kernel's work charged to no child).
Needs a root runner for the bwrap settings (egress, cgroups, loop disks). With `--container IMAGE`
(a local image), rootful Podman too, without and with the sample disk (its workspace and the
container's own filesystem on it: backends/container/rootfs.py), over at most 20 samples and
commands (a container takes seconds); the engine's conmon and runtime are not the child's
children, so their CPU is not in these figures, only the CLI calls' and the runner's.

    .venv/bin/python bench/sandbox_costs.py [--samples 200] [--commands 300] [--container IMAGE] [--json]
        [--split] [--only SETTING]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

SETTINGS = {  # name -> RunConfig fields (a CPU and process cgroup always: sandbox_cpus, sandbox_nproc)
    "local": {"sandbox": "local", "sandbox_network": "host"},
    "bwrap, host network, no limits": {"sandbox": "bwrap", "sandbox_network": "host", "sandbox_disk": "0",
                                       "sandbox_memory": "0"},
    "bwrap, egress, no limits": {"sandbox": "bwrap", "sandbox_network": "egress", "sandbox_disk": "0",
                                 "sandbox_memory": "0"},
    "bwrap, egress + memory": {"sandbox": "bwrap", "sandbox_network": "egress", "sandbox_disk": "0"},
    "bwrap, egress + disk": {"sandbox": "bwrap", "sandbox_network": "egress", "sandbox_memory": "0"},
    "bwrap, egress + limits (default)": {"sandbox": "bwrap", "sandbox_network": "egress"},
}
PARTS = ("runner loop", "runner threads", "zygote", "sandboxes", "rest")
REPEAT = 3
CHILD = r'''
import asyncio, json, os, sys, tempfile
from pathlib import Path
from trajforge.config import RunConfig
from trajforge.sandbox.factory import SandboxProvider

IMAGE = None

async def one(p, root, commands=1, hold=True):
    sb = await p.create(cwd=None, image=IMAGE, root=root)
    try:
        if hold:
            await sb.write_file("held", b"")
        for _ in range(commands):
            assert (await sb.exec("true", timeout=30)).exit_code == 0
    finally:
        await sb.close()

def ticks(path, fields):
    with open(path) as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return sum(int(parts[i - 3]) for i in fields) / os.sysconf("SC_CLK_TCK")

def split(p):
    """CPU seconds so far of the runner's main thread, its other threads, the zygote itself and
    the zygote's reaped children (the sandboxes and their commands)."""
    me = os.getpid()
    tasks = os.listdir(f"/proc/{me}/task")
    loop = ticks(f"/proc/{me}/task/{me}/stat", (14, 15))
    threads = sum(ticks(f"/proc/{me}/task/{t}/stat", (14, 15)) for t in tasks if int(t) != me)
    runtime = p._state.get("bwrap.runtime")
    zygote = runtime.zygote.proc.pid if runtime is not None else None
    own = ticks(f"/proc/{zygote}/stat", (14, 15)) if zygote else 0.0
    children = ticks(f"/proc/{zygote}/stat", (16, 17)) if zygote else 0.0
    return [loop, threads, own, children]

async def main(fields, what, n):
    global IMAGE
    IMAGE = fields.pop("_image", None)
    settings = RunConfig(**fields).sandbox_settings()
    with tempfile.TemporaryDirectory() as tmp:
        async with SandboxProvider(settings) as p:
            await one(p, Path(tmp))  # the runtime and one sandbox: the fixed cost
            if what == "burst":
                await asyncio.gather(*(one(p, Path(tmp)) for _ in range(n)))
            elif what == "warm":
                for _ in range(n):
                    await one(p, Path(tmp))
            elif what == "commands":
                await one(p, Path(tmp), n)
            pool = next(iter(p._state["bwrap.runtime"]._pools.values()), None) if "bwrap.runtime" in p._state else None
            if pool is not None:
                await pool.settle()  # every sandbox destroyed, its processes reaped by the zygote
            print(json.dumps(split(p)))

asyncio.run(main(json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
'''


def cpu_of(fields: dict[str, object], what: str, n: int) -> tuple[float, list[float]]:
    """CPU seconds of a measuring child and everything it reaped; and its split (CHILD's `split`,
    then the rest)."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(fields), what, str(n)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the measuring child failed ({fields}, {what})")
    total = usage.ru_utime + usage.ru_stime
    parts = json.loads(out.splitlines()[-1])
    return total, [*parts, total - sum(parts)]


def measure(fields: dict[str, object], samples: int, commands: int) -> dict[str, object]:
    # The minimum of a few runs: CPU time is robust to other load, not to it entirely.
    base = min((cpu_of(fields, "none", 0) for _ in range(REPEAT + 1)), key=lambda r: r[0])
    burst = min((cpu_of(fields, "burst", samples) for _ in range(REPEAT)), key=lambda r: r[0])
    warm = min(cpu_of(fields, "warm", samples)[0] for _ in range(REPEAT)) - base[0]
    cmds = min(cpu_of(fields, "commands", commands)[0] for _ in range(REPEAT)) - base[0]
    return {"burst_sample_ms": 1000 * (burst[0] - base[0]) / samples, "serial_sample_ms": 1000 * warm / samples,
            "command_ms": 1000 * cmds / commands, "fixed_ms": 1000 * base[0],
            "burst_split_ms": {name: 1000 * (b - f) / samples for name, b, f in zip(PARTS, burst[1], base[1])}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--commands", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--container", metavar="IMAGE", help="also rootful Podman with this local image")
    parser.add_argument("--only", action="append", metavar="SETTING", help="measure this row only (repeatable)")
    parser.add_argument("--split", action="store_true", help="where a sample's CPU went (module doc)")
    ns = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (egress, cgroups and loop-mounted disks are root-mode features)")
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parent.parent / "src"))
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    rows = {name: measure(fields, ns.samples, ns.commands) for name, fields in SETTINGS.items()
            if not ns.only or name in ns.only}
    if ns.container:
        for name, disk in (("podman, no disk", "0"), ("podman, disk + own layer (default)", "10g")):
            fields: dict[str, object] = {"sandbox": "container", "container_engine": "podman",
                                         "sandbox_network": "none", "sandbox_disk": disk, "_image": ns.container}
            rows[name] = measure(fields, min(ns.samples, 20), min(ns.commands, 20))
    if ns.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'setting':<34}{'sample, at once':>17}{'sample, in turn':>17}{'command':>9}  (ms of CPU)")
    for name, r in rows.items():
        print(f"{name:<34}{r['burst_sample_ms']:>17.2f}{r['serial_sample_ms']:>17.2f}{r['command_ms']:>9.2f}")
    if ns.split:
        print(f"\nsample, at once, split: {'':<11}" + "".join(f"{part:>16}" for part in PARTS))
        for name, r in rows.items():
            if name.startswith("bwrap"):
                print(f"{name:<34}" + "".join(f"{r['burst_split_ms'][part]:>16.2f}" for part in PARTS))
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
