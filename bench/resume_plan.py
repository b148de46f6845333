"""Resume planning at scale: time and peak memory to find what is left of a 100,000-sample run.

It synthesises a finished run the way trajforge writes one: a dataset file, batch files holding
one realistic trajectory line (~3 KB: system turn with the tool schemas, a terminal call and its
output, reasoning) per finished sample, built by trajforge's own build_record, and a checkpoint
that also lists some discarded and failed samples. Then a fresh process does what `--resume` does
before running anything (read the dataset's rows, load the checkpoint, `trajforge.runner.scheduling.plan`:
here a checkpoint of version 1, so every batch file is read, as a run made before the index
resumes once) and reports its own timings; this process reaps it with os.wait4 for its
peak RSS. Run: `python bench/resume_plan.py [--samples N] [--extra M]`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from trajforge.agent.loop import SessionResult, ToolResult, Turn
from trajforge.agent.record import build_record
from trajforge.dataset import content_hash
from trajforge.model.types import ToolCall, Usage
from trajforge.tools.toolsets import KNOWN_TOOLS
from trajforge.tools.terminal import ProcessTool, TerminalTool

BATCH_SIZE = 1000
_PLAN = """
import resource, sys, time
from pathlib import Path
t0 = time.perf_counter()
from trajforge.config import RunConfig
from trajforge.run_layout import RunLayout
from trajforge.runner.state.checkpoint import Checkpoint
from trajforge.runner.scheduling.plan import plan
from trajforge.runner.scheduling.rows import RunRows
t1 = time.perf_counter()
run_dir, dataset_file = Path(sys.argv[1]), Path(sys.argv[2])
rows = RunRows.read(RunConfig(dataset_file=dataset_file, run_name="resume-bench"))
t2 = time.perf_counter()
checkpoint = Checkpoint.load(RunLayout(run_dir), "resume-bench")
planned = plan(rows, checkpoint)
t3 = time.perf_counter()
print(f"{len(rows)} {len(planned.todo)} {len(planned.problems)} {t1 - t0:.3f} {t2 - t1:.3f} {t3 - t2:.3f}")
"""


def template_record(prompt: str) -> dict:
    tools = [TerminalTool(), ProcessTool()]
    call = ToolCall(id="call_1", name="terminal", arguments='{"command": "ls -la && python3 --version"}')
    output = orjson.dumps({"output": "total 8\ndrwx------ 2 u u 4096 .\n" * 6 + "Python 3.11.7\n",
                           "exit_code": 0, "error": None}).decode()
    turns = [Turn("Let me look at the working directory first.", "I should inspect the files before "
                  "answering, then check the interpreter version." * 3, [call], [ToolResult(call, output, False)],
                  "tool_calls"),
             Turn("The directory is empty and Python 3.11.7 is installed, so the task can start "
                  "from scratch." * 2, "The listing shows nothing to reuse." * 4, [], [], "stop")]
    session = SessionResult(prompt, [t.schema() for t in tools], turns, True, False, 2,
                            Usage(820, 240, 60, 0.0031), "answer")
    return build_record(session, prompt_index=0, sample_id="x", batch_num=0, model="bench/model",
                        toolsets_used=["terminal"], known_tools=KNOWN_TOOLS)


def synthesise(root: Path, samples: int, extra: int) -> tuple[Path, Path, int]:
    """Write dataset (samples + extra rows), batch files and checkpoint; return (run_dir, dataset, bytes)."""
    run_dir = root / "data" / "resume-bench"
    run_dir.mkdir(parents=True)
    dataset = root / "dataset.jsonl"
    base = template_record("placeholder")
    entries: dict[str, dict] = {}
    written = 0
    files: dict[int, object] = {}
    with dataset.open("wb") as ds:
        for i in range(samples + extra):
            prompt = f"Task {i}: set up a small project, run its tests and report the results ({i * 7919 % 100003})."
            ds.write(orjson.dumps({"prompt": prompt}) + b"\n")
            identity = f"{content_hash(prompt, None, None, None)}:0"
            if i >= samples:
                continue
            if i % 100 == 7:  # discarded earlier (no batch line), final
                entries[identity] = {"status": "discarded", "batch": i // BATCH_SIZE, "attempts": 1,
                                     "reason": "no_reasoning"}
                continue
            if i % 100 == 8:  # failed earlier: retried on resume
                entries[identity] = {"status": "failed", "batch": i // BATCH_SIZE, "attempts": 3,
                                     "reason": "timeout", "message": "exceeded the 600s sample limit"}
                continue
            rec = dict(base, prompt_index=i, sample_id=identity)
            rec["conversations"] = [base["conversations"][0], {"from": "human", "value": prompt},
                                    *base["conversations"][2:]]
            rec["metadata"] = dict(base["metadata"], batch_num=i // BATCH_SIZE)
            line = orjson.dumps(rec) + b"\n"
            f = files.get(i // BATCH_SIZE)
            if f is None:
                f = files[i // BATCH_SIZE] = (run_dir / f"batch_{i // BATCH_SIZE}.jsonl").open("wb")
            f.write(line)  # type: ignore[attr-defined]
            written += len(line)
            entries[identity] = {"status": "done", "batch": i // BATCH_SIZE, "attempts": 1}
    for f in files.values():
        f.close()  # type: ignore[attr-defined]
    (run_dir / "checkpoint.json").write_bytes(orjson.dumps(
        {"version": 1, "run_name": "resume-bench", "updated": time.time(), "samples": entries,
         "invocations": [{"started": time.time(), "seconds": 1.0, "ran": samples, "interrupted": False}]}))
    return run_dir, dataset, written


def measure(run_dir: Path, dataset: Path) -> dict[str, float]:
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", _PLAN, str(run_dir), str(dataset)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    out = proc.stdout.read().decode().split()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - t0
    if proc.returncode != 0 or len(out) != 6:
        raise SystemExit(f"planning process failed (exit {proc.returncode}): {out}")
    total, todo, problems, imports, load, scan = out
    return {"dataset_rows": int(total), "to_run": int(todo), "problems": int(problems), "process_wall_s": wall,
            "imports_s": float(imports), "dataset_load_s": float(load), "scan_and_plan_s": float(scan),
            "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": usage.ru_maxrss / 1024}


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=100_000, help="samples of the finished run")
    ap.add_argument("--extra", type=int, default=1_000, help="dataset rows added since (left to run)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="trajforge-resume-bench-") as tmp:
        t0 = time.monotonic()
        run_dir, dataset, written = synthesise(Path(tmp), args.samples, args.extra)
        made = time.monotonic() - t0
        r = measure(run_dir, dataset)
    print(f"resume planning: {args.samples:,} finished samples ({written / 1e6:.0f} MB of batch files, "
          f"synthesised in {made:.1f}s), {args.extra:,} new dataset rows")
    print(f"  process wall {r['process_wall_s']:.2f}s (imports {r['imports_s']:.2f}s, dataset load "
          f"{r['dataset_load_s']:.2f}s, checkpoint + scan + plan {r['scan_and_plan_s']:.2f}s), "
          f"CPU {r['cpu_s']:.2f}s, peak RSS {r['peak_rss_mb']:.0f} MB")
    print(f"  {r['to_run']:,} of {r['dataset_rows']:,} samples left to run (new rows + retried failures), "
          f"{r['problems']} scan problems")
    return r


if __name__ == "__main__":
    main()
