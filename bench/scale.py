"""A run's bookkeeping at scale (issue 39): resume, view and export of a run of N finished samples.

It synthesises a finished run of N samples the way trajforge writes one (bench/resume_plan.py's
records, 5.3 KB each, 1% discarded and 1% failed), then lets the code under test take it over
with one `--resume` on the same N rows (a run made by earlier code is converted once: timed apart).
Then, against bench/server.py on 127.0.0.1 (one tool turn, 0.05 s latency):

- resume: the dataset gains `--extra` rows; `trajforge run --resume` with 256 workers. Timed:
  the first model request after the command started (the first new sample), the whole command,
  the runner's peak RSS (os.wait4, in a small process that starts it).
- fresh: a new run of the same `--extra` rows, for the resume's overhead (resume - fresh), in wall
  and in CPU seconds (the runner's own, which a loaded machine changes less than the wall clock).
- view: `trajforge view RUN --port 0`, the time until its first list page is served.
- export: `trajforge export RUN --format sharegpt`, trajectories per second and peak RSS.

The run is synthesised once and copied for each code. `--baseline SRC` runs the same on another
checkout's `src` (for example `git worktree add /tmp/base main`, then `--baseline /tmp/base/src`),
side by side. Run:
`python bench/scale.py [--samples 100000] [--extra 1000] [--baseline DIR/src]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resume_plan import synthesise  # noqa: E402
from server import BenchServer  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def env_for(src: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENROUTER_API_KEY", "OPENAI_API_KEY")}
    env["PYTHONPATH"] = str(src)
    return env


# The measured command is started by this small process, not by the benchmark's own: a child's
# ru_maxrss starts from its parent's RSS at the fork, and the benchmark holds hundreds of MB after
# the synthesis of a million records (every figure of the runner would be at least that).
_REAPER = ("import json, os, subprocess, sys; p = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, "
           "stdout=subprocess.DEVNULL); _, status, ru = os.wait4(p.pid, 0); print(json.dumps({'exit': "
           "os.waitstatus_to_exitcode(status), 'rss': ru.ru_maxrss / 1024, 'cpu': ru.ru_utime + ru.ru_stime}))")


def reaped(argv: list[str], cwd: Path | None, env: dict[str, str], stderr: Any) -> dict[str, Any]:
    """Run `argv` to its end: (exit code, wall seconds, peak RSS MB, CPU seconds) of that process alone."""
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-I", "-c", _REAPER, *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=stderr, check=True).stdout
    r = json.loads(out)
    return {"exit": r["exit"], "wall_s": time.monotonic() - t0, "peak_rss_mb": r["rss"], "cpu_s": r["cpu"]}


async def run_cli(src: Path, args: list[str], cwd: Path, server: BenchServer) -> dict[str, Any]:
    server.stats.requests, server.stats.first_request = 0, 0.0  # the server notes its first request again
    t0 = time.monotonic()
    with (cwd / "stderr.txt").open("ab") as err:
        r = await asyncio.get_running_loop().run_in_executor(
            None, reaped, [sys.executable, "-m", "trajforge", *args], cwd, env_for(src), err)
    r["first_sample_s"] = server.stats.first_request - t0 if server.stats.requests else None
    return r


def run_args(dataset: Path, out: Path, name: str, url: str, *extra: str) -> list[str]:
    return ["run", f"--dataset_file={dataset}", "--batch_size=1000", f"--run_name={name}", f"--output_dir={out}",
            f"--base_url={url}", "--model=bench", "--distribution=terminal_only", "--sandbox=local",
            "--num_workers=256", "--keep_no_reasoning", "--fail_on_error=1000000", *extra]


def view_first_page(src: Path, run_dir: Path) -> float:
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "trajforge", "view", str(run_dir), "--port", "0"],
                            env=env_for(src), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the one line with the URL, printed once it listens
            m = re.search(r"http://[^ ]+/", line)
            if m:
                urllib.request.urlopen(m.group(0) + "api/samples?page=0&size=50").read()
                return time.monotonic() - t0
        raise SystemExit("trajforge view printed no URL")
    finally:
        proc.terminate()
        proc.wait()


def export(src: Path, run_dir: Path, out: Path) -> dict[str, Any]:
    r = reaped([sys.executable, "-m", "trajforge", "export", str(run_dir), "--format", "sharegpt", "--output",
                str(out)], None, env_for(src), subprocess.DEVNULL)
    lines = sum(1 for _ in out.open("rb")) if out.exists() else 0
    return {"export_exit": r["exit"], "export_per_s": lines / r["wall_s"], "export_rss_mb": r["peak_rss_mb"]}


def prepare(root: Path, samples: int, extra: int) -> Path:
    """The finished run (batch files, a version 1 checkpoint), written once for every code measured,
    and its datasets: base.jsonl (its rows), new.jsonl (the rows added), dataset.jsonl (both)."""
    run_dir, dataset, _ = synthesise(root, samples, extra)
    rows = dataset.read_bytes().splitlines(keepends=True)
    (root / "base.jsonl").write_bytes(b"".join(rows[:samples]))
    (root / "new.jsonl").write_bytes(b"".join(rows[samples:]))
    return run_dir


async def scenario(src: Path, pristine_run: Path, root: Path) -> dict[str, Any]:
    """Take over a copy of the pristine run with `src`'s code, then time what the module says."""
    run_root = root / "data"
    run_dir = run_root / pristine_run.name
    shutil.copytree(pristine_run, run_dir)
    data = pristine_run.parent.parent  # where prepare wrote the datasets
    server = BenchServer(turns=1, latency=0.05)
    await server.start()
    try:
        take_over = await run_cli(src, run_args(data / "base.jsonl", run_root, run_dir.name, server.url, "--resume"),
                                  root, server)
        resume = await run_cli(src, run_args(data / "dataset.jsonl", run_root, run_dir.name, server.url, "--resume"),
                               root, server)
        fresh = await run_cli(src, run_args(data / "new.jsonl", run_root, "fresh", server.url), root, server)
    finally:
        await server.aclose()
    written = sum(1 for _ in (run_dir / "trajectories.jsonl").open("rb"))
    return {"take_over": take_over, "resume": resume, "fresh": fresh, "written": written,
            "view_first_page_s": view_first_page(src, run_dir), **export(src, run_dir, root / "export.jsonl")}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--extra", type=int, default=1_000)
    ap.add_argument("--baseline", type=Path, help="the src directory of another checkout, measured the same way")
    ap.add_argument("--tmp", type=Path, default=None, help="where to build the runs (~17 GB a code at a million)")
    args = ap.parse_args(argv)
    codes = [("this tree", REPO / "src")] + ([("baseline", args.baseline)] if args.baseline else [])
    print(f"scale: {args.samples:,} finished samples + {args.extra:,} new rows, 256 workers, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="trajforge-scale-", dir=args.tmp) as tmp:
        pristine = prepare(Path(tmp) / "pristine", args.samples, args.extra)
        for name, src in codes:
            root = Path(tmp) / name.replace(" ", "-")
            root.mkdir()
            load = os.getloadavg()[0]
            r = asyncio.run(scenario(src, pristine, root))
            shutil.rmtree(root)
            res, fresh, take = r["resume"], r["fresh"], r["take_over"]
            first = "-" if res["first_sample_s"] is None else f"{res['first_sample_s']:.2f}s"
            print(f"  {name} (load {load:.1f} at its start): resume first sample {first}, wall {res['wall_s']:.2f}s "
                  f"(fresh run of the new rows {fresh['wall_s']:.2f}s: +{res['wall_s'] - fresh['wall_s']:.2f}s), "
                  f"CPU {res['cpu_s']:.2f}s (fresh {fresh['cpu_s']:.2f}s: +{res['cpu_s'] - fresh['cpu_s']:.2f}s), "
                  f"peak RSS {res['peak_rss_mb']:.0f} MB, exit {res['exit']}; trajectories {r['written']:,}; "
                  f"view first page {r['view_first_page_s']:.2f}s; export sharegpt {r['export_per_s']:,.0f}/s, "
                  f"peak RSS {r['export_rss_mb']:.0f} MB; take-over resume {take['wall_s']:.1f}s (CPU {take['cpu_s']:.1f}s), peak RSS "
                  f"{take['peak_rss_mb']:.0f} MB, exit {take['exit']}", flush=True)


if __name__ == "__main__":
    main()
