"""`trajforge view RUN_DIR_OR_JSONL [--port P] [--host H]`: index the source, serve the page.

The index is built before the server listens (a big run says it is indexing), then the one line
with the URL is printed. SIGINT / SIGTERM stop the server cleanly (exit 0). Bad input is one
`error:` line and exit code 2, like every command.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

from aiohttp import web

from trajforge.cli.flags import Flag, Parser
from trajforge.errors import UsageError
from trajforge.run_layout import BATCHES, RunLayout
from trajforge.view.index import RunIndex
from trajforge.view.dataset import load_rows
from trajforge.view.server import SLICE, Viewer, allowed_hosts, catch_up, make_app

FLAGS = [Flag("source", "path", "a run directory (data/<run_name>) or a JSONL file of trajectories", positional=True,
              metavar="RUN_DIR_OR_JSONL"),
         Flag("port", "port", "TCP port (0 picks a free one)", default=8765),
         Flag("host", "str", "address to listen on", default="127.0.0.1")]
FIRST = 0.5  # seconds of indexing before the page is served (a first batch file); the rest is read behind it


def open_source(path: Path) -> RunIndex:
    if not path.exists():
        raise UsageError(f"{path}: no such run directory or JSONL file")
    layout = RunLayout(path)
    if path.is_dir() and not layout.has_results():
        runs = sorted(str(p) for p in path.iterdir() if p.is_dir() and RunLayout(p).has_results())[:5]
        hint = f"; runs inside it: {', '.join(runs)}" if runs else ""
        raise UsageError(f"{path}: not a run directory (no {BATCHES}, {layout.checkpoint.name} or "
                         f"{layout.trajectories.name})" + hint)
    index = RunIndex(path)
    try:
        index.refresh(FIRST)
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror or e}") from None
    return index


async def serve(index: RunIndex, host: str, port: int) -> int:
    viewer = Viewer(index)
    runner = web.AppRunner(make_app(viewer), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e} (pass --port N; 0 picks a free port)") \
            from None
    background = [asyncio.create_task(catch_up(index, viewer.idle))]
    if index.run_dir is not None:  # the dataset (prompts of failed samples, task types): a thread of its own
        index.dataset_pending = True  # said by /api/status from the first request on: figures may still change
        background.append(asyncio.create_task(_attach_dataset(index, viewer.idle)))
    bound = runner.addresses[0][1]
    allowed = viewer.allowed_hosts = allowed_hosts(host, bound)
    shown = f"[{host}]" if ":" in host else host
    count = f"{len(index.entries())} samples" + (", reading the rest" if index.behind else "")
    print(f"trajforge view: {index.source} ({count}) at http://{shown}:{bound}/ (Ctrl-C to stop)", flush=True)
    if allowed is None:
        print(f"trajforge view: warning: listening on {host}, not loopback: anyone who can reach this machine "
              "can read the run", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for task in background:
            task.cancel()
        await runner.cleanup()
    return 0


async def _attach_dataset(index: RunIndex, idle: asyncio.Event) -> None:
    assert index.run_dir is not None
    try:  # until it is read, the samples of rows no longer in the dataset cannot be told apart
        index.use_dataset(*await asyncio.to_thread(load_rows, index.run_dir))
        index.refresh(SLICE)  # the samples without a record, made again with their rows: the figures are right now
    finally:
        index.dataset_pending = False
    await catch_up(index, idle)  # the records read so far get their task types


def _size(source: Path) -> int:
    files = RunLayout(source).batch_files() if source.is_dir() else [source]
    return sum(p.stat().st_size for p in files if p.is_file())


def main(argv: list[str]) -> int:
    ns = Parser("trajforge view", "Browse a run directory (live or finished) or a trajectories JSONL file in a "
                "local web page, read-only.", FLAGS).parse(argv)
    t0 = time.monotonic()
    if ns.source.exists() and (size := _size(ns.source)) > 100_000_000:
        print(f"trajforge view: indexing {size / 1e6:,.0f} MB of trajectories (the page opens once the first "
              "are read; the rest follows)...", file=sys.stderr, flush=True)
    index = open_source(ns.source)
    if time.monotonic() - t0 > 2 and not index.behind:
        print(f"trajforge view: indexed {len(index.entries())} samples in {time.monotonic() - t0:.1f}s",
              file=sys.stderr)
    return asyncio.run(serve(index, ns.host, ns.port))
