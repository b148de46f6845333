"""Export at scale: trajectories per second and peak memory of `trajforge export`, per format.

It synthesises a trajectories.jsonl the way trajforge writes one (build_record over the real
terminal tool schemas): each line ~6 KB with two parallel tool calls, one failed, a follow-up
call, reasoning on every turn. Then, for each format, a fresh `python -m trajforge export`
process exports it; this process reaps it with os.wait4 for its CPU time and peak RSS. Running
the same at a tenth of the size shows whether memory grows with the run (it should not).
Run: `python bench/export.py [--samples N] [--formats openai,sharegpt,parquet,hf]`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

from trajforge.agent.loop import SessionResult, ToolResult, Turn
from trajforge.agent.record import build_record
from trajforge.model.types import ToolCall, Usage
from trajforge.tools.toolsets import KNOWN_TOOLS
from trajforge.tools.terminal import ProcessTool, TerminalTool

FORMATS = ("openai", "sharegpt", "parquet", "hf")
_SUFFIX = {"openai": ".jsonl", "sharegpt": ".jsonl", "parquet": ".parquet", "hf": ""}


def template_record() -> dict:
    tools = [TerminalTool(), ProcessTool()]
    ls = ToolCall("call_1", "terminal", '{"command": "ls -la && python3 --version"}')
    bad = ToolCall("call_2", "terminal", '{"cmd": "pytest -q"}')
    again = ToolCall("call_1", "terminal", '{"command": "python3 -m pytest -q"}')
    listing = orjson.dumps({"output": "total 8\ndrwx------ 2 u u 4096 .\n" * 6 + "Python 3.11.7\n",
                            "exit_code": 0, "error": None}).decode()
    failed = orjson.dumps({"success": False, "error": "missing required argument(s): command"}).decode()
    tests = orjson.dumps({"output": "....F.\n1 failed, 5 passed in 0.12s\n", "exit_code": 1, "error": None}).decode()
    turns = [Turn("Let me look at the project and run its tests.", "I should inspect the files, then run the "
                  "tests to see what fails." * 3, [ls, bad], [ToolResult(ls, listing, False),
                                                             ToolResult(bad, failed, True)], "tool_calls"),
             Turn("", "The second call used a wrong argument name; retry with `command`." * 2, [again],
                  [ToolResult(again, tests, False)], "tool_calls"),
             Turn("One test fails: the rest of the suite passes, so the fix is local to that test." * 2,
                  "Summarise the result for the user." * 3, [], [], "stop")]
    session = SessionResult("placeholder", [t.schema() for t in tools], turns, True, False, 3,
                            Usage(1820, 340, 90, 0.0041), "answer")
    return build_record(session, prompt_index=0, sample_id="x", batch_num=0, model="bench/model",
                        toolsets_used=["terminal"], known_tools=KNOWN_TOOLS)


def synthesise(path: Path, samples: int) -> int:
    base = template_record()
    head, rest = base["conversations"][0], base["conversations"][2:]
    written = 0
    with path.open("wb") as f:
        for i in range(samples):
            prompt = f"Task {i}: set up a small project, run its tests and report the results ({i * 7919 % 100003})."
            rec = dict(base, prompt_index=i, sample_id=f"{i * 2654435761 % 2**40:010x}:0",
                       conversations=[head, {"from": "human", "value": prompt}, *rest],
                       metadata=dict(base["metadata"], batch_num=i // 100), completed=i % 10 != 3)
            line = orjson.dumps(rec) + b"\n"
            f.write(line)
            written += len(line)
    return written


def _run_reaped(source: Path, fmt: str, out_dir: Path, extra: list[str]) -> dict[str, float]:
    """One export in a fresh process, reaped with wait4 for its CPU time and peak RSS."""
    output = out_dir / f"out-{fmt}{_SUFFIX[fmt]}"
    args = [sys.executable, "-m", "trajforge", "export", str(source), "--format", fmt, "--output", str(output),
            *extra]
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
        pid = subprocess.Popen(args, stdout=out_f, stderr=err_f).pid
        done = threading.Event()
        anon = [0]
        sampler = threading.Thread(target=_sample_anon, args=(pid, done, anon), daemon=True)
        sampler.start()
        _, status, usage = os.wait4(pid, 0)
        wall = time.monotonic() - t0
        done.set()
        sampler.join()
        out_f.seek(0)
        err_f.seek(0)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            raise SystemExit(f"export --format {fmt} failed (exit {code}): {err_f.read().decode()}")
        first = out_f.read().decode().splitlines()[0]  # "exported N of M trajectories ..."
    size = sum(p.stat().st_size for p in ([output] if output.is_file() else output.rglob("*")) if p.is_file())
    shutil.rmtree(output) if output.is_dir() else output.unlink()
    return {"exported": int(first.split()[1]), "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_rss_mb": usage.ru_maxrss / 1024, "peak_anon_mb": anon[0] / 1024, "output_mb": size / 1e6}


def _sample_anon(pid: int, done: threading.Event, peak: list[int]) -> None:
    """Peak RssAnon (kB) of the export, sampled every 20 ms. ru_maxrss also counts the file pages
    the process maps (the hf format memory-maps its Arrow files to save them), which the kernel
    can drop at any time; anonymous memory is what would grow if rows were held."""
    while not done.wait(0.02):
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        peak[0] = max(peak[0], int(line.split()[1]))
        except OSError:
            return


def main(argv: list[str] | None = None) -> list[dict[str, object]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=100_000, help="trajectories in the synthetic run")
    ap.add_argument("--formats", default=",".join(FORMATS), help="comma-separated formats to measure")
    ap.add_argument("--also_tenth", action="store_true", help="also measure a run a tenth the size (memory growth)")
    ap.add_argument("--split", default=None, help="pass --split to every export, e.g. train=0.95,test=0.05")
    args = ap.parse_args(argv)
    formats = [f for f in args.formats.split(",") if f]
    extra = ["--split", args.split] if args.split else []
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="trajforge-export-bench-") as tmp:
        sizes = [args.samples] + ([args.samples // 10] if args.also_tenth else [])
        for n in sizes:
            source = Path(tmp) / f"trajectories-{n}.jsonl"
            t0 = time.monotonic()
            written = synthesise(source, n)
            print(f"{n:,} trajectories, {written / 1e6:.0f} MB ({written / n / 1e3:.1f} KB each), synthesised in "
                  f"{time.monotonic() - t0:.1f}s; load average {os.getloadavg()[0]:.2f}", flush=True)
            print("| format | trajectories | load before | wall s | trajectories/s | per CPU-second | peak RSS MB "
                  "| peak anon MB | output MB |\n|---|---|---|---|---|---|---|---|---|", flush=True)
            for fmt in formats:
                load = os.getloadavg()[0]
                r = _run_reaped(source, fmt, Path(tmp), extra)
                if r["exported"] != n:
                    raise SystemExit(f"--format {fmt} exported {r['exported']} of {n}")
                row = {"format": fmt, "trajectories": n, "load_before": load, **r,
                       "per_s": n / r["wall_s"], "cpu_per_s": n / r["cpu_s"]}
                rows.append(row)
                print(f"| {fmt} | {n:,} | {load:.1f} | {r['wall_s']:.1f} | {row['per_s']:,.0f} | "
                      f"{row['cpu_per_s']:,.0f} | {r['peak_rss_mb']:.0f} | {r['peak_anon_mb']:.0f} | "
                      f"{r['output_mb']:.0f} |",
                      flush=True)
            source.unlink()
    return rows


if __name__ == "__main__":
    main()
