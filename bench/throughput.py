"""Throughput benchmark: the real CLI, end to end, against the benchmark's own model server.

`make bench` runs the main scenario (2,000 prompts, 1 tool turn, 0.5 s latency, 256 workers) with
the default sandbox, the local one and, for the floor, bench/floor.py (`--floor`: a client that
makes the same requests and runs the same command with nothing else, so no runner can do better);
`make bench-sweep` runs num_workers 16, 64, 256 and 1000 (and 1000 again at 2 s latency), then the
resume-planning measurement (bench/resume_plan.py).

One scenario: generate a dataset, start bench.server on this process's event loop, run
`python -m trajforge run ...` as a child process and reap it with os.wait4, which returns the
resource usage of that child and of every descendant it waited for (its `terminal` subprocesses
included): that is the runner's CPU time and peak RSS, unaffected by the server or by other
developers' processes. The server's CPU is this process's own usage over the same interval.
The output is checked too: a run only counts when every prompt produced a completed trajectory.

Each sweep point runs in a fresh benchmark process so the kernel's children-usage counters (and
so the peak RSS) belong to that point alone.

`--tokens` runs each sandbox twice, side by side: as it is, and with `--capture_tokens` against
the same server, which then reports token ids and logprobs in vLLM's shapes (bench.server); a
run with ids only counts when every record carries them in one segment. It prints what capture
costs in CPU per trajectory.

`--cap N` plays a provider that answers 429 above N concurrent requests (bench.server), and the
row then says where the runner settled: the mean number in flight at the server and the share of
requests refused, both after the first `--settle` seconds. `--flags` passes more run flags
(e.g. `--flags=--adaptive_concurrency=false`).
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import math
import os
import random
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server import BenchServer  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# (num_workers, prompts, latency or None for --latency): prompts scale with the workers so each
# point takes a few rounds. The last point repeats 1000 workers at a longer latency: at 0.5 s the
# runner's CPU, not the latency, sets the wall time of 5,000 prompts on 2 cores.
SWEEP = [(16, 320, None), (64, 1280, None), (256, 2000, None), (1000, 5000, None), (1000, 5000, 2.0)]
COLUMNS = [("sandbox", "{}"), ("prompts", "{:d}"), ("turns", "{:d}"), ("latency", "{:.2f}"), ("num_workers", "{:d}"),
           ("wall_s", "{:.2f}"), ("ideal_s", "{:.2f}"), ("efficiency", "{:.2f}"), ("cpu_ms_per_traj", "{:.2f}"),
           ("peak_rss_mb", "{:.0f}"), ("max_in_flight", "{:d}"), ("server_cpu_s", "{:.2f}"), ("errors", "{:d}")]


# The runner under cProfile with a CPU-time clock: wall-clock profiles of an I/O-bound process
# mostly show waiting.
_PROFILED = """
import cProfile, sys, time
from trajforge.cli import main
out, sys.argv = sys.argv[1], ["trajforge", *sys.argv[2:]]
prof = cProfile.Profile(time.process_time)
try:
    prof.runcall(main)
except SystemExit:
    pass
finally:
    prof.dump_stats(out)
"""


def write_dataset(path: Path, prompts: int) -> None:
    with path.open("wb") as f:
        for i in range(prompts):
            f.write(orjson.dumps({"prompt": f"Task {i}: inspect the working directory, run a quick "
                                           f"command and report what it printed (case {i * 7919 % 10007})."}))
            f.write(b"\n")


def pool_ideal(prompts: int, workers: int, calls: int, latency: float, jitter: float, runs: int = 5) -> float:
    """Wall time of a runner with zero overhead: `workers` sessions pulling prompts, each call taking
    the server's latency distribution (mean of `runs` draws). Unlike ideal_s it counts the jitter
    tail: the slowest worker's sum of draws, which no runner can avoid."""
    rng = random.Random(1)
    total = 0.0
    for _ in range(runs):
        free = [0.0] * min(workers, prompts)
        for _ in range(prompts):
            start = heapq.heappop(free)
            heapq.heappush(free, start + sum(rng.uniform(latency * (1 - jitter), latency * (1 + jitter))
                                             for _ in range(calls)))
        total += max(free)
    return total / runs


def cli_args(dataset: Path, url: str, workers: int, sandbox: str, batch_size: int) -> list[str]:
    return ["run", f"--dataset_file={dataset}", f"--batch_size={batch_size}", "--run_name=bench",
            f"--base_url={url}", "--model=bench", "--distribution=terminal_only", f"--sandbox={sandbox}",
            f"--num_workers={workers}", "--output_dir=out"]


def check_output(run_dir: Path, prompts: int, turns: int, tokens: bool = False) -> tuple[int, list[str]]:
    """(errors, notes): every prompt must have a completed trajectory with `turns` terminal calls
    (and with `tokens`, its calls' ids in one segment)."""
    notes: list[str] = []
    path = run_dir / "trajectories.jsonl"
    if not path.exists():
        return prompts, ["no trajectories.jsonl"]
    good = 0
    with path.open("rb") as f:
        for line in f:
            rec = orjson.loads(line)
            t = rec["tool_stats"]["terminal"]
            ids = rec.get("tokens")
            if tokens and (ids is None or ids["prefix_breaks"] or len(ids["turns"]) != turns + 1):
                if len(notes) < 3:
                    notes.append(f"record {rec['prompt_index']} lacks its ids: {rec.get('tokens_missing')}")
            elif rec["completed"] and t["count"] == turns and t["success"] == turns:
                good += 1
            elif len(notes) < 3:
                notes.append(f"bad record {rec['prompt_index']}: completed={rec['completed']} terminal={t}")
    stats = orjson.loads((run_dir / "statistics.json").read_bytes())
    samples = stats["run"]["samples"]
    if samples["failed"] or samples["discarded"]:
        failed = {k: v for k, v in samples["failed_by_class"].items() if v}
        notes.append(f"failed {failed}, discarded {samples['discarded_by_reason']}")
    return prompts - good, notes


async def run_scenario(*, prompts: int, turns: int, latency: float, jitter: float, workers: int,
                       sandbox: str, batch_size: int, workdir: Path, profile: Path | None = None,
                       pyspy: Path | None = None, runner: str | None = None, cap: int | None = None,
                       flags: list[str] | None = None, settle: float = 10.0) -> dict[str, Any]:
    dataset = workdir / "dataset.jsonl"
    write_dataset(dataset, prompts)
    server = BenchServer(turns=turns, latency=latency, jitter=jitter, cap=cap)
    await server.start()
    env = {k: v for k, v in os.environ.items() if k not in ("OPENROUTER_API_KEY", "OPENAI_API_KEY")}
    env["PYTHONPATH"] = str(REPO / "src")
    prefix = [sys.executable, "-c", _PROFILED, str(profile)] if profile else [sys.executable, "-m", "trajforge"]
    if runner:
        prefix = shlex.split(runner)
    if pyspy:  # a sampling profile (collapsed stacks) at real proportions; py-spy's own CPU is counted too
        prefix = [shutil.which("py-spy") or "py-spy", "record", "-r", "200", "-f", "raw", "-o", str(pyspy), "--",
                  *prefix]
    argv = prefix + cli_args(dataset, server.url, workers, sandbox, batch_size) + (flags or [])
    load_before = os.getloadavg()[0]
    self0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    with (workdir / "stdout.txt").open("wb") as out, (workdir / "stderr.txt").open("wb") as err:
        proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
    # wait4 in a thread: the event loop keeps serving while the runner works.
    _, status, usage = await asyncio.get_running_loop().run_in_executor(None, os.wait4, proc.pid, 0)
    wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    self1 = resource.getrusage(resource.RUSAGE_SELF)
    await server.aclose()
    errors, notes = check_output(workdir / "out" / "bench", prompts, turns, "--capture_tokens" in (flags or []))
    if proc.returncode != 0:
        notes.append(f"runner exit code {proc.returncode}: " + (workdir / "stderr.txt").read_text()[-1500:])
    ideal = math.ceil(prompts / workers) * (turns + 1) * latency
    pool = pool_ideal(prompts, workers, turns + 1, latency, jitter)
    cpu = usage.ru_utime + usage.ru_stime
    first, last = (server.stats.first_request, server.stats.last_reply) if server.stats.requests else (t0, t0)
    return {
        "prompts": prompts, "turns": turns, "latency": latency, "num_workers": workers, "sandbox": sandbox,
        "wall_s": wall, "ideal_s": ideal, "efficiency": ideal / wall, "runner_cpu_s": cpu,
        "pool_ideal_s": pool, "pool_efficiency": pool / wall,
        "cpu_ms_per_traj": 1000 * cpu / prompts, "peak_rss_mb": usage.ru_maxrss / 1024,
        "max_in_flight": server.stats.max_in_flight, "requests": server.stats.requests,
        "server_cpu_s": (self1.ru_utime + self1.ru_stime) - (self0.ru_utime + self0.ru_stime),
        "errors": errors + server.stats.errors, "notes": notes, "load_before": load_before,
        # where the wall time went: runner start-up until its first request, the first request to
        # the last reply, and the last reply until the runner exited (merge, statistics)
        "startup_s": first - t0, "serving_s": last - first, "finish_s": t0 + wall - last,
        **(cap_figures(server, settle) if cap is not None else {}),
    }


def cap_figures(server: BenchServer, settle: float) -> dict[str, Any]:
    """Where a run against a capped server settled, counted from `settle` s after its first request."""
    st = server.stats
    since = st.first_request + settle
    late = [refused for t, refused in st.log if t >= since]
    flight = [n for t, n in st.in_flight_samples if t >= since and t <= st.last_reply]
    return {"cap": server.cap, "rejected": st.rejected, "rejected_share": st.rejected / max(1, st.requests),
            "late_requests": len(late), "late_rejected_share": sum(late) / len(late) if late else None,
            "late_mean_in_flight": sum(flight) / len(flight) if flight else None}


def print_table(rows: list[dict[str, Any]]) -> None:
    widths = [max(len(name), 8) for name, _ in COLUMNS]
    print("  ".join(name.rjust(w) for (name, _), w in zip(COLUMNS, widths)))
    for r in rows:
        print("  ".join(fmt.format(r[name]).rjust(w) for (name, fmt), w in zip(COLUMNS, widths)))
    for r in rows:
        for note in r["notes"]:
            print(f"  [{r['num_workers']} workers] {note}")


def machine() -> str:
    return (f"{os.cpu_count()} CPUs, python {sys.version.split()[0]}, "
            f"load avg {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def one(args: argparse.Namespace, sandbox: str, tokens: bool = False) -> dict[str, Any]:
    """One run of the scenario: trajforge with `sandbox` (and --capture_tokens), or a floor client
    (`floor:loop`, `floor:helper`)."""
    runner = args.runner
    if sandbox.startswith("floor:"):
        runner = f"{shlex.quote(sys.executable)} {shlex.quote(str(REPO / 'bench' / 'floor.py'))} {sandbox[6:]}"
    flags = (args.flags.split() if args.flags else []) + (["--capture_tokens"] if tokens else [])
    with tempfile.TemporaryDirectory(prefix="trajforge-bench-") as tmp:
        workdir = Path(args.keep) if args.keep else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        row = asyncio.run(run_scenario(
            prompts=args.prompts, turns=args.turns, latency=args.latency, jitter=args.jitter,
            workers=args.num_workers, sandbox=sandbox, batch_size=args.batch_size, workdir=workdir,
            profile=Path(args.profile).resolve() if args.profile else None,
            pyspy=Path(args.pyspy).resolve() if args.pyspy else None, runner=runner, cap=args.cap,
            flags=flags, settle=args.settle))
    if tokens:
        row["sandbox"] += "+tokens"
    return row


def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for workers, prompts, latency in SWEEP:
        cmd = [sys.executable, __file__, "--json", f"--prompts={prompts}", f"--num_workers={workers}",
               f"--turns={args.turns}", f"--latency={latency or args.latency}", f"--jitter={args.jitter}",
               f"--sandbox={args.sandbox or 'local'}", f"--batch_size={args.batch_size}"]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append(orjson.loads(out.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"  done: {workers} workers, {prompts} prompts, latency {r['latency']}s: wall {r['wall_s']:.1f}s = "
              f"start-up {r['startup_s']:.2f} + serving {r['serving_s']:.2f} + finish {r['finish_s']:.2f}; "
              f"zero-overhead pool {r['pool_ideal_s']:.2f}s; load before {r['load_before']:.2f}", file=sys.stderr)
    return rows


def cache_bytecode() -> None:
    """Compile trajforge's modules once, so no run pays for it: an environment with
    PYTHONDONTWRITEBYTECODE (or a read-only checkout) would otherwise compile every module from
    source in every runner and zygote, ~0.1-0.2 s of CPU each, which installed packages never do."""
    import compileall

    compileall.compile_dir(str(REPO / "src" / "trajforge"), quiet=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=2000)
    ap.add_argument("--turns", type=int, default=1, help="tool turns per prompt (LLM calls = turns + 1)")
    ap.add_argument("--latency", type=float, default=0.5, help="mean seconds per LLM call")
    ap.add_argument("--jitter", type=float, default=0.1, help="latency varies uniformly by +- this fraction")
    ap.add_argument("--num_workers", type=int, default=256)
    ap.add_argument("--sandbox", help="comma-separated backends, each run in turn (default: auto,local, i.e. the "
                                       "default sandbox next to the local one; --sweep: local)")
    ap.add_argument("--batch_size", type=int, default=100)
    ap.add_argument("--sweep", action="store_true", help="num_workers 16/64/256/1000, then resume planning")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON line")
    ap.add_argument("--profile", help="write a cProfile of the runner to this file (inflates CPU figures)")
    ap.add_argument("--pyspy", help="write a py-spy sampling profile (raw collapsed stacks) to this file")
    ap.add_argument("--runner", help="command that runs the CLI, e.g. '.venv/bin/trajforge' (default: python -m trajforge)")
    ap.add_argument("--keep", help="use (and keep) this directory for the run's files")
    ap.add_argument("--cap", type=int, help="the server answers 429 above this many concurrent requests")
    ap.add_argument("--settle", type=float, default=10.0, help="with --cap: seconds left out of the settled figures")
    ap.add_argument("--flags", help="more run flags for the CLI, space-separated")
    ap.add_argument("--floor", action="store_true", help="also run bench/floor.py (the least any runner must do: "
                                                         "the requests and `bash -c`, nothing else) in both its modes")
    ap.add_argument("--repeat", type=int, default=1, help="run the sandboxes in turn this many times and compare "
                                                          "the medians (CPU varies +-10%% between identical runs here)")
    ap.add_argument("--tokens", action="store_true", help="run each sandbox without and with --capture_tokens "
                                                          "(the server then returns ids) and compare their CPU")
    args = ap.parse_args()
    cache_bytecode()
    if args.sweep:
        print(f"machine: {machine()}")
        print_table(sweep(args))
        from resume_plan import main as resume_main

        resume_main([])
        return
    sandboxes = (args.sandbox or "auto,local").split(",")
    if args.json:
        print(orjson.dumps(one(args, sandboxes[0])).decode())
        return
    print(f"machine: {machine()}")
    floors = ["floor:loop", "floor:helper"] if args.floor else []
    variants = [(s, t) for s in sandboxes for t in ((False, True) if args.tokens else (False,))]
    variants += [(floor, False) for floor in floors]
    rows = [one(args, sandbox, tokens) for _ in range(max(1, args.repeat)) for sandbox, tokens in variants]
    print_table(rows)
    for row in rows:
        print(f"[{row['sandbox']}] runner CPU {row['runner_cpu_s']:.2f}s total, {row['requests']} requests served; "
              f"wall = start-up {row['startup_s']:.2f}s + serving {row['serving_s']:.2f}s + finish "
              f"{row['finish_s']:.2f}s; 1-min load average before the run {row['load_before']:.2f}; a zero-overhead "
              f"pool would take {row['pool_ideal_s']:.2f}s (efficiency against it: {row['pool_efficiency']:.2f})")
        if args.cap is not None:
            share = row["late_rejected_share"]
            flight = row["late_mean_in_flight"]
            print(f"[{row['sandbox']}] cap {args.cap}: {row['rejected']} of {row['requests']} requests refused (429) "
                  f"({100 * row['rejected_share']:.1f}%); after the first {args.settle:g}s: "
                  f"{'-' if share is None else f'{100 * share:.2f}%'} of {row['late_requests']} refused, "
                  f"mean in flight {'-' if flight is None else f'{flight:.1f}'}")
    if len(sandboxes) > 1:
        base = sandboxes[-1]
        for sandbox in sandboxes[:-1]:
            mine = [r for r in rows if r["sandbox"] == sandbox]
            theirs = [r for r in rows if r["sandbox"] == base]
            for r, b in zip(mine, theirs):
                print(f"{sandbox} vs {base}: CPU per trajectory x{r['cpu_ms_per_traj'] / b['cpu_ms_per_traj']:.2f}, "
                      f"efficiency {r['efficiency']:.2f} vs {b['efficiency']:.2f}")
            if len(mine) > 1:
                cpu, base_cpu = (statistics.median(x["cpu_ms_per_traj"] for x in rs) for rs in (mine, theirs))
                eff, base_eff = (statistics.median(x["efficiency"] for x in rs) for rs in (mine, theirs))
                print(f"{sandbox} vs {base}, medians of {len(mine)}: CPU per trajectory {cpu:.2f} vs {base_cpu:.2f} ms "
                      f"(x{cpu / base_cpu:.2f}), efficiency {eff:.2f} vs {base_eff:.2f}")
    for sandbox in sandboxes if args.tokens else []:
        plain = [r for r in rows if r["sandbox"] == sandbox]
        ids = [r for r in rows if r["sandbox"] == sandbox + "+tokens"]
        cpu, base_cpu = (statistics.median(x["cpu_ms_per_traj"] for x in rs) for rs in (ids, plain))
        print(f"{sandbox}: --capture_tokens vs without, medians of {len(ids)}: CPU per trajectory {cpu:.2f} vs "
              f"{base_cpu:.2f} ms (x{cpu / base_cpu:.3f}); each pair ran one after the other")
    for floor in floors:
        mine = [r for r in rows if r["sandbox"] == floor]
        cpu, eff = (statistics.median(x[k] for x in mine) for k in ("cpu_ms_per_traj", "efficiency"))
        print(f"{floor} (no trajforge: the requests and the command only), median of {len(mine)}: "
              f"CPU per trajectory {cpu:.2f} ms, efficiency {eff:.2f}")


if __name__ == "__main__":
    main()
