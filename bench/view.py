"""`trajforge view` at scale: index build and list paging over a synthetic 100,000-sample run.

The run is synthesised like bench/resume_plan.py does (same realistic ~3 KB trajectory lines,
plus 1% discarded and 1% failed samples in the checkpoint, and the dataset, found through
config.json). A fresh process then builds the viewer's index the way `trajforge view` does,
serves the real aiohttp app on 127.0.0.1, and times HTTP requests of list pages: the first and a
deep page unfiltered, each filter, a full-text search, and one conversation. Each request runs
once cold (the filter is computed) and then warm (cached until the index changes). Last, it times
a refresh that finds nothing new, and one that takes in 1,000 appended lines.
Run: `python bench/view.py [--samples N]`.
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

sys.path.insert(0, str(Path(__file__).parent))
from resume_plan import synthesise  # the same synthetic run as the resume benchmark

_VIEW = r"""
import asyncio, resource, sys, threading, time, urllib.request
from pathlib import Path
t0 = time.perf_counter()
from trajforge.cli.view import open_source
from trajforge.view.server import Viewer, make_app
from aiohttp import web
t1 = time.perf_counter()
index = open_source(Path(sys.argv[1]))  # the first slice, as `trajforge view` serves its first page after
index.attach_dataset()
while index.busy():  # and the rest, which `trajforge view` reads behind the first page
    index.refresh()
t2 = time.perf_counter()
print(f"imports {t1 - t0:.3f}", flush=True)
print(f"index {t2 - t1:.3f} {len(index.entries())}", flush=True)
print(f"rss_after_index {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}", flush=True)
viewer = Viewer(index)
viewer.allowed_hosts = None
loop = asyncio.new_event_loop()
runner = web.AppRunner(make_app(viewer), access_log=None)
loop.run_until_complete(runner.setup())
site = web.TCPSite(runner, "127.0.0.1", 0)
loop.run_until_complete(site.start())
port = runner.addresses[0][1]
threading.Thread(target=loop.run_forever, daemon=True).start()
base = f"http://127.0.0.1:{port}"
key = index.entries()[54321 % len(index.entries())].key
for name, path in [("page 1", "/api/samples?page=0&size=50"), ("page 1000", "/api/samples?page=1000&size=50"),
                   ("status=failed", "/api/samples?status=failed&size=50"),
                   ("reason=timeout p10", "/api/samples?reason=timeout&page=10&size=50"),
                   ("tool=terminal p500", "/api/samples?tool=terminal&page=500&size=50"),
                   ("search 'task 4242'", "/api/samples?q=task%204242&size=50"),
                   ("overview", "/api/overview"), ("conversation", "/api/sample?key=" + key.replace(":", "%3A"))]:
    times = []
    for _ in range(3):
        s = time.perf_counter()
        body = urllib.request.urlopen(base + path).read()
        times.append(time.perf_counter() - s)
    print(f"req {name!r} {times[0] * 1000:.1f} {min(times[1:]) * 1000:.1f} {len(body)}", flush=True)
s = time.perf_counter(); index.refresh(); print(f"refresh_idle {(time.perf_counter() - s) * 1000:.1f}", flush=True)
last = index.files[-1]
lines = last.read_bytes().splitlines(keepends=True)[:1000]
with last.open("ab") as f:  # new samples: the same lines under new identities
    f.write(b"".join(line.replace(b'"sample_id":"', b'"sample_id":"new', 1) for line in lines))
s = time.perf_counter(); index.refresh(); print(f"refresh_1000 {(time.perf_counter() - s) * 1000:.1f}", flush=True)
"""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=100_000)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="trajforge-view-bench-") as tmp:
        t0 = time.monotonic()
        run_dir, dataset, written = synthesise(Path(tmp), args.samples, 0)
        (run_dir / "config.json").write_bytes(orjson.dumps({"dataset_file": str(dataset), "output_dir": "data"}))
        print(f"view: {args.samples:,} samples, {written / 1e6:.0f} MB of batch files "
              f"(synthesised in {time.monotonic() - t0:.1f}s)")
        proc = subprocess.Popen([sys.executable, "-c", _VIEW, str(run_dir)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            kind, _, rest = line.strip().partition(" ")
            if kind == "index":
                secs, n = rest.split()
                print(f"  index build: {float(secs):.2f}s for {int(n):,} samples (dataset join included)")
            elif kind == "req":
                name, cold, warm, size = rest.rsplit(" ", 3)
                print(f"  {name.strip(chr(39)):<22} cold {float(cold):7.1f} ms   warm {float(warm):6.1f} ms   "
                      f"{int(size) / 1024:.0f} KB")
            elif kind == "imports":
                print(f"  imports: {float(rest):.2f}s")
            elif kind == "rss_after_index":
                print(f"  RSS after indexing: {rest} MB")
            elif kind == "refresh_idle":
                print(f"  refresh with nothing new: {rest} ms")
            elif kind == "refresh_1000":
                print(f"  refresh taking in 1,000 appended lines: {rest} ms")
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit("the viewer process failed")
        print(f"  process CPU {usage.ru_utime + usage.ru_stime:.2f}s, peak RSS {usage.ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
