"""What sealed verification costs per task, beside default verification, in one invocation.

The example tasks (examples/tasks/, their base image made offline as the README says) run with
their oracle, `--samples_per_prompt K`, once with `--verifier default` and once with `--verifier
sealed`, alternating, REPEAT times each, their images built beforehand (a warm-up run), so only
verification differs: sealed mode starts a second container per sample and copies the agent's
working directory into it. Per mode: the wall time of the run, and the CPU (user + sys) of the
trajforge process and every child it reaped (the Podman CLIs, cp; conmon and the containers are
not its children), each divided by the samples; the minimum over the repeats. The load average
is printed beside the figures: the machine may be shared.

    .venv/bin/python bench/task_verify.py [--samples 4] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "tasks"
MODES = ("default", "sealed")


def run(workdir: Path, name: str, mode: str, samples: int) -> tuple[float, float]:
    """(wall s, CPU s of the run and its reaped children) of one oracle run of the example tasks."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "trajforge", "run", "--tasks", str(EXAMPLES), "--agent", "oracle",
                           "--run_name", name, "--verifier", mode, "--samples_per_prompt", str(samples),
                           "--num_workers", "4", "--container_engine", "podman"],
                          cwd=workdir, capture_output=True, text=True, timeout=3600,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"run {name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=4, help="samples of each of the 3 tasks per run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if subprocess.run(["podman", "image", "exists", "localhost/trajforge-example-base:latest"]).returncode != 0:
        subprocess.run([sys.executable, str(EXAMPLES / "base_image.py")], check=True, capture_output=True)
    per_sample = 3 * args.samples
    best: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="trajforge-bench-verify-") as tmp:
        work = Path(tmp)
        run(work, "warm", "default", 1)  # the images built once, outside the figures
        for i in range(args.repeat):
            for mode in MODES if i % 2 == 0 else MODES[::-1]:
                wall, cpu = run(work, f"{mode}-{i}", mode, args.samples)
                old = best.get(mode)
                best[mode] = (min(wall, old[0]), min(cpu, old[1])) if old else (wall, cpu)
    load = os.getloadavg()
    figures = {mode: {"wall_per_sample_s": round(w / per_sample, 3), "cpu_per_sample_s": round(c / per_sample, 3)}
               for mode, (w, c) in best.items()}
    if args.json:
        print(json.dumps({"samples": per_sample, "load": load, "figures": figures}, indent=2))
        return 0
    print(f"{per_sample} oracle samples a run (3 tasks x {args.samples}), best of {args.repeat}; "
          f"load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores")
    print("| mode | wall per sample | CPU per sample (trajforge + its children) |")
    print("|---|---|---|")
    for mode in MODES:
        f = figures[mode]
        print(f"| {mode} | {f['wall_per_sample_s']:.3f} s | {f['cpu_per_sample_s']:.3f} s |")
    d, s = figures["default"], figures["sealed"]
    print(f"| sealed - default | {s['wall_per_sample_s'] - d['wall_per_sample_s']:+.3f} s | "
          f"{s['cpu_per_sample_s'] - d['cpu_per_sample_s']:+.3f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
