"""Cost of the bwrap network modes and per-sample limits: sample start+close and one command.

For each setting, N sandboxes are started and closed one after another, then M commands (`true`)
run in one started sandbox. Wall time is the median; CPU is this process plus every child it
reaped (getrusage), divided by the count. Needs a root runner (egress, cgroup, loop disk).

    .venv/bin/python bench/sandbox_network.py [--samples 20 --commands 50] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from trajforge.sandbox.bwrap import BwrapSandbox
from trajforge.sandbox.bwrap_start import helper_source
from trajforge.sandbox.forkserver import Zygote
from trajforge.sandbox.resources import SampleLimits

NO_LIMITS = SampleLimits(memory=None, disk=None)
SETTINGS = {
    "host": {"network": True, "egress": False, "sample_limits": NO_LIMITS},
    "none": {"network": False, "egress": False, "sample_limits": NO_LIMITS},
    "egress": {"network": False, "egress": True, "sample_limits": NO_LIMITS},
    "host+limits": {"network": True, "egress": False, "sample_limits": SampleLimits()},
    "egress+limits (default)": {"network": False, "egress": True, "sample_limits": SampleLimits()},
}


def cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


async def measure(name: str, kw: dict[str, object], root: Path, samples: int, commands: int) -> dict[str, object]:
    starts: list[float] = []
    c0 = cpu()
    for _ in range(samples):
        t = time.perf_counter()
        sb = BwrapSandbox(root, **kw)  # type: ignore[arg-type]
        await sb.start()
        await sb.close()
        starts.append(time.perf_counter() - t)
    start_cpu = (cpu() - c0) / samples
    sb = BwrapSandbox(root, **kw)  # type: ignore[arg-type]
    await sb.start()
    runs: list[float] = []
    c0 = cpu()
    try:
        for _ in range(commands):
            t = time.perf_counter()
            res = await sb.exec("true", timeout=30)
            assert res.exit_code == 0, res
            runs.append(time.perf_counter() - t)
    finally:
        cmd_cpu = (cpu() - c0) / commands
        await sb.close()
    return {"setting": name, "start_close_ms": round(statistics.median(starts) * 1000, 1),
            "start_close_cpu_ms": round(start_cpu * 1000, 1), "command_ms": round(statistics.median(runs) * 1000, 2),
            "command_cpu_ms": round(cmd_cpu * 1000, 2)}


async def main(samples: int, commands: int) -> list[dict[str, object]]:
    # One zygote for all samples, as a run's provider holds it: no interpreter starts per sample.
    zygote = await Zygote().start(helper_source())
    try:
        with tempfile.TemporaryDirectory(prefix="trajforge-bench-net-") as tmp:
            return [await measure(name, {**kw, "zygote": zygote}, Path(tmp), samples, commands)
                    for name, kw in SETTINGS.items()]
    finally:
        await zygote.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--commands", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (egress, memory cgroup and loop-mounted disks are root-mode features)")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    rows = asyncio.run(main(ns.samples, ns.commands))
    if ns.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'setting':<26}{'start+close ms':>16}{'(cpu ms)':>10}{'command ms':>12}{'(cpu ms)':>10}")
        for r in rows:
            print(f"{r['setting']:<26}{r['start_close_ms']:>16}{r['start_close_cpu_ms']:>10}"
                  f"{r['command_ms']:>12}{r['command_cpu_ms']:>10}")
