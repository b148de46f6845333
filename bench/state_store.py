"""The run's bookkeeping store alone, at N finished samples: what the checkpoint costs without a run.

For each code given (`--code NAME=SRC`, a checkout's `src`), in a fresh process of its own: a new
run's checkpoint hears N finished samples (`Checkpoint.finished`, saved every 10,000 as a run's
periodic saves do, then closed as a run ends); then, in another fresh process, the checkpoint is
loaded with its finished index as a resume loads it (CPU seconds and the process's peak RSS, the
interpreter's and imports' included), 1,000 more samples finish and are saved, and it is closed.
Also the size of the state files on disk. Only the store is timed: no dataset, no batch files,
no merge (bench/scale.py measures the whole resume). Run:
`python bench/state_store.py --code main=src [--code trial=/path/src] [--samples 1000000]`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Runs inside the measured process (PYTHONPATH = the code's src): argv = phase, run dir, N.
_CHILD = r"""
import json, os, resource, sys, time
from pathlib import Path
try:
    from trajforge.runner.state.checkpoint import Checkpoint
except ImportError:
    from trajforge.runner.checkpoint import Checkpoint
from trajforge.run_layout import RunLayout

phase, root, n = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
layout = RunLayout(root)

def ident(i):  # spread like content hashes: a sample's key is its identity's first 16 hex digits
    return f"{(i + 1) * 0x9E3779B97F4A7C15F39CC060 % (1 << 96):024x}:0"

def cpu():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime

out = {}
if phase == "write":
    t = cpu()
    ckpt = Checkpoint.load(layout, "store-bench")
    for i in range(n):
        ckpt.finished(ident(i), i // 1000, (i % 1000) * 5300, 5300)
        if i % 10000 == 9999:
            ckpt.save(force=True)
    ckpt.save(force=True)
    ckpt.compact()
    ckpt.close()
    out["write_cpu_s"] = cpu() - t
else:
    t = cpu()
    kwargs = {"write": True} if "write" in Checkpoint.load.__kwdefaults__ else {}
    ckpt = Checkpoint.load(layout, "store-bench", **kwargs)
    out["load_cpu_s"] = cpu() - t
    assert len(ckpt.done) == n, len(ckpt.done)
    t = cpu()
    for i in range(n, n + 1000):
        ckpt.finished(ident(i), i // 1000, (i % 1000) * 5300, 5300)
    ckpt.save(force=True)
    ckpt.compact()
    ckpt.close()
    out["append_1000_cpu_s"] = cpu() - t
    out["load_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def measure(src: Path, samples: int, tmp: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    root = tmp / "run"
    root.mkdir()
    r: dict[str, float] = {}
    for phase in ("write", "resume"):
        proc = subprocess.run([sys.executable, "-c", _CHILD, phase, str(root), str(samples)], env=env,
                              capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"{src} ({phase}): {proc.stderr[-2000:]}")
        r.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    r["disk_mb"] = sum(p.stat().st_size for p in root.iterdir() if p.is_file()) / 1e6
    r["files"] = " ".join(sorted(p.name for p in root.iterdir() if p.is_file()))  # type: ignore[assignment]
    return r


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", action="append", required=True, metavar="NAME=SRC")
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=1, help="measure the codes in turn this many times")
    args = ap.parse_args(argv)
    print(f"state store: {args.samples:,} finished samples, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    for _ in range(args.repeat):
        for name, _, src in (c.partition("=") for c in args.code):
            load = os.getloadavg()[0]
            with tempfile.TemporaryDirectory(prefix="trajforge-store-") as tmp:
                r = measure(Path(src), args.samples, Path(tmp))
            print(f"  {name} (load {load:.1f}): {args.samples:,} finished written {r['write_cpu_s']:.2f}s CPU; "
                  f"load {r['load_cpu_s']:.2f}s CPU, peak RSS {r['load_rss_mb']:.0f} MB; 1,000 more saved "
                  f"{r['append_1000_cpu_s']:.2f}s CPU; on disk {r['disk_mb']:.1f} MB ({r['files']})", flush=True)


if __name__ == "__main__":
    main()
