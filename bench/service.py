"""The rollout service against `trajforge run` on the same rows, side by side in one invocation.

    python bench/service.py [--groups 64] [--n 8] [--latency 0.5] [--num_workers 256]

Both run the bench's scripted tool user (bench/server.py: 1 tool turn, 2 LLM calls, 0.5 s latency
by default, `--sandbox=local`) over the same `--groups` rows with `--n` rollouts each: `run` with
--samples_per_prompt N, the service with one POST /v1/groups of the rows and a client streaming
and acking the groups until all came. Figures: wall (for the service: from its start until the
last group arrived), groups per minute, CPU per rollout (user+sys of the process and everything it
reaped, os.wait4), the time from the POST to the first group and one rollout's nominal duration
(its LLM calls x latency) and the median of the service's rollouts' own wall time (their
records' timing.wall_s: under this load and concurrency). The load average is printed beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server import BenchServer  # noqa: E402
from throughput import _PROFILED, REPO, check_output, write_dataset  # noqa: E402

FLAGS = ["--model=bench", "--distribution=terminal_only", "--sandbox=local", "--batch_size=100",
         "--output_dir=out", "--api_key=bench"]


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in ("OPENROUTER_API_KEY", "OPENAI_API_KEY")}
    out["PYTHONPATH"] = str(REPO / "src")
    return out


async def wait4(proc: subprocess.Popen[bytes]) -> float:
    _, status, usage = await asyncio.get_running_loop().run_in_executor(None, os.wait4, proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


async def with_run(args: argparse.Namespace, url: str, work: Path) -> dict[str, Any]:
    dataset = work / "rows.jsonl"
    write_dataset(dataset, args.groups)
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "trajforge", "run", f"--dataset_file={dataset}", "--run_name=bench",
                             f"--base_url={url}", f"--num_workers={args.num_workers}", f"--samples_per_prompt={args.n}",
                             *FLAGS], cwd=work, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cpu = await wait4(proc)
    wall = time.monotonic() - t0
    errors, _ = check_output(work / "out" / "bench", args.groups * args.n, 1)
    return {"rollout_s": None, "how": "trajforge run", "wall_s": wall, "cpu_s": cpu, "first_group_s": None, "errors": errors,
            "exit": proc.returncode}


async def with_service(args: argparse.Namespace, url: str, work: Path) -> dict[str, Any]:
    dataset = work / "rows.jsonl"
    write_dataset(dataset, args.groups)
    rows = [json.loads(x) for x in dataset.read_text().splitlines()]
    t0 = time.monotonic()
    prefix = [sys.executable, "-c", _PROFILED, args.profile] if args.profile else [sys.executable, "-m", "trajforge"]
    proc = subprocess.Popen([*prefix, "serve", "--port=0", "--run_name=bench",
                             f"--base_url={url}", f"--num_workers={args.num_workers}", *FLAGS],
                            cwd=work, env=env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    cpu_task = asyncio.ensure_future(wait4(proc))
    assert proc.stdout is not None
    line = (await asyncio.get_running_loop().run_in_executor(None, proc.stdout.readline)).decode()
    api = line.split(" at ")[1].split()[0]
    got, first = 0, None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as s:
        posted = time.monotonic()
        async with s.post(f"{api}/groups", json={"rows": rows, "n": args.n}) as r:
            assert r.status == 200, await r.text()
        async with s.get(f"{api}/groups/stream?cursor=0") as r:
            async for raw in r.content:
                group = json.loads(raw)
                first = first or time.monotonic() - posted
                got += 1
                async with s.post(f"{api}/groups/ack", json={"ids": [group["id"]]}) as a:
                    assert a.status == 200
                if got == args.groups:
                    break
    wall = time.monotonic() - t0
    proc.terminate()
    cpu = await cpu_task
    errors, _ = check_output(work / "out" / "bench", args.groups * args.n, 1)
    walls = sorted(json.loads(x)["timing"]["wall_s"]
                   for x in (work / "out" / "bench" / "trajectories.jsonl").read_text().splitlines())
    return {"rollout_s": walls[len(walls) // 2], "how": "trajforge serve", "wall_s": wall, "cpu_s": cpu, "first_group_s": first, "errors": errors,
            "exit": proc.returncode}


async def main(args: argparse.Namespace) -> None:
    rollout_s = 2 * args.latency  # one rollout: 2 LLM calls of the scripted tool user
    rows = []
    for _ in range(args.repeat):
        for how in (with_run, with_service):
            server = BenchServer(turns=1, latency=args.latency)
            await server.start()
            load = os.getloadavg()[0]
            with tempfile.TemporaryDirectory() as tmp:
                result = await how(args, server.url, Path(tmp))
            await server.aclose()
            result |= {"load_before": load, "groups_per_min": 60 * args.groups / result["wall_s"],
                       "cpu_ms_per_rollout": 1000 * result["cpu_s"] / (args.groups * args.n)}
            rows.append(result)
    print(f"{args.groups} groups x {args.n} rollouts, latency {args.latency} s, --num_workers {args.num_workers}, "
          f"one rollout's nominal duration {rollout_s:.2f} s")
    print("| how | load before | wall s | groups/min | CPU ms / rollout | first group s | median rollout wall s "
          "| errors | exit |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        first = "-" if r["first_group_s"] is None else f"{r['first_group_s']:.2f}"
        own = "-" if r["rollout_s"] is None else f"{r['rollout_s']:.2f}"
        print(f"| {r['how']} | {r['load_before']:.2f} | {r['wall_s']:.2f} | {r['groups_per_min']:.0f} | "
              f"{r['cpu_ms_per_rollout']:.2f} | {first} | {own} | {r['errors']} | {r['exit']} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--latency", type=float, default=0.5)
    ap.add_argument("--num_workers", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--profile", help="write a cProfile of the service to this file (inflates its CPU figures)")
    asyncio.run(main(ap.parse_args()))
