"""glibc malloc settings for the processes that read model replies: blocks up to 4 MiB from the
heap, freed heap given back above 32 MiB.

Every read of an asyncio transport (each model reply) takes a 256 KiB buffer that then shrinks to
what was read. glibc maps a block above its mmap threshold (128 KiB; it rises only when such a
block is freed whole, never when one shrinks) and unmaps it at the free: system calls and page
faults on every read, several times what the heap costs (bench/RESULTS.md).

`tune_allocator` is called by every process of trajforge's own that serves model calls: the
`trajforge` command (trajforge.cli.entry, for every subcommand), `python batch_runner.py`,
`python trajectory_compressor.py`, and each Ray actor process that runs samples
(executors.ray_actor). Processes forked from those (the sandbox's helpers) inherit it. It is not
applied where the process is someone else's: a program that calls trajforge.cli.main() or the
runner in-process keeps its allocator, and so do Ray's own processes (raylet, GCS) and the
commands the samples run. Elsewhere than glibc (no mallopt, or musl's that ignores it) nothing
changes. A leaf module, so any entry point can call it first.
"""

from __future__ import annotations


def tune_allocator() -> None:
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(-3, 4 << 20)  # M_MMAP_THRESHOLD
    mallopt(-1, 32 << 20)  # M_TRIM_THRESHOLD
