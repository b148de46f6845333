"""What a run's event loop is given besides the work: its child watcher, its collector settings,
its signals, its flush.

runner.invocation runs the phases of a run; this module owns how the loop meets the operating system
while they run. On Python 3.11 the loop waits for subprocesses through pidfds (one `terminal`
command need not cost a thread); SIGINT/SIGTERM first stop scheduling and give in-flight samples a
few seconds, and a second one syncs the batch files and the checkpoint and exits at once (130);
while no sample finishes, a periodic flush still fsyncs, saves the checkpoint and redraws the
status line, and hands an output error to the run's halt. The garbage collector is tuned for the
run's duration (tuned_collector: the start-up heap frozen, young objects collected less often).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import sys
from collections.abc import Callable, Iterator

from trajforge.errors import OutputError
from trajforge.runner.state import store
from trajforge.runner.state.checkpoint import Checkpoint
from trajforge.runner.reporting.progress import Progress


def use_pidfd_child_watcher() -> bool:
    """Wait for subprocesses through a pidfd in the event loop instead of a thread per process.

    Python 3.11's default (ThreadedChildWatcher) starts a thread for every `terminal` command and
    blocks the loop until it runs: ~5% of the loop's time in bench/throughput.py. 3.12+ already
    uses pidfds when the kernel has them (Linux 5.3+), so this only changes 3.11."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return False
    if type(asyncio.get_event_loop_policy()) is not asyncio.DefaultEventLoopPolicy:
        return False  # e.g. uvloop's, which waits for children its own way
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # an older kernel, or a seccomp filter that forbids it
        return False
    asyncio.set_child_watcher(asyncio.PidfdChildWatcher())
    return True


@contextlib.contextmanager
def tuned_collector(young: int = 10_000) -> Iterator[None]:
    """Python's cyclic garbage collector during a run: what exists before the loop starts (modules,
    the config, the dataset's samples) is frozen out of its scans, and the youngest generation is
    collected after `young` net allocations instead of 700 (older ones keep their ratios).

    A run allocates in bursts (a reply parsed per session, 256 in one tick): with the defaults the
    collector ran hundreds of times in bench/throughput.py's main scenario, a twelfth of the event
    loop's time, a fifth of that with this (bench/RESULTS.md). The cost is at most `young` objects' worth of unreclaimed
    cycles at a time. In-process callers (tests, notebooks) get the defaults back; one that froze its
    own heap before keeps it frozen (gc.unfreeze cannot tell whose objects are whose, so the run
    then adds nothing to the frozen set)."""
    before = gc.get_threshold()
    ours = gc.get_freeze_count() == 0
    if ours:
        gc.freeze()
    gc.set_threshold(young, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        if ours:
            gc.unfreeze()


async def flush_periodically(batch_store: store.BatchStore, checkpoint: Checkpoint, progress: Progress,
                             halt: Callable[[OutputError], None], every: float = 2.0,
                             before_save: Callable[[], None] | None = None) -> None:
    """Keep the durability promises while no sample finishes: fsync, checkpoint, status line.
    `before_save` brings what changed without an outcome (the spend of samples in flight) into
    the checkpoint, so a kill during long samples loses seconds of spend, not all of it."""
    while True:
        await asyncio.sleep(every)
        try:
            batch_store.sync()
            if before_save is not None:
                before_save()
            checkpoint.save()
        except OutputError as e:
            halt(e)
            return
        progress.tick()


def remove_signals() -> None:
    """SIGINT/SIGTERM back to Python's defaults (Ctrl-C raises KeyboardInterrupt) once scheduling is over."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(sig)


def install_signals(stop: asyncio.Event, batch_store: store.BatchStore, checkpoint: Checkpoint) -> None:
    """SIGINT/SIGTERM in the running loop: the first sets `stop` (no new samples); a second syncs the
    batch files and saves the checkpoint, then exits at once with 130."""
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if not stop.is_set():
            print("\ntrajforge: stopping: no new samples, in-flight ones get a few seconds "
                  "(press Ctrl-C again to exit now)", file=sys.stderr)
            stop.set()
            return
        with contextlib.suppress(OutputError):  # exiting now was asked for; the files are as good as they get
            batch_store.sync()
            checkpoint.save(force=True)
        os._exit(130)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
