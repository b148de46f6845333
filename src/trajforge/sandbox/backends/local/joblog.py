"""The log of a `local` background job, which lives in the host's /tmp: copied from a pipe, capped.

A job of the local sandbox writing straight into its log file was bounded only by its own
RLIMIT_FSIZE (1 GiB, which its workspace files need), so each job could put that much into the
host's /tmp. The job writes into a pipe instead, and the runner copies at most JOB_LOG_BYTES of it
into the log, the same size as a container job's log: once it is full the pipe is closed and the
job's next write ends it (SIGPIPE), as a container job ends when its log client reaches that size.
Reads and waits first take in what the pipe holds (`pull`), so everything a finished job wrote is
in its log, whenever the event loop got round to it.
"""

from __future__ import annotations

import asyncio
import os

# A container job's log is capped at the same size (backends/container/argv.py), which
# imports from this backend, not the other way round.
JOB_LOG_BYTES = 64 << 20
_CHUNK = 1 << 16


class LogRelay:
    def __init__(self, log: int) -> None:
        self._log, self._cap, self._written = log, JOB_LOG_BYTES, 0
        self._pipe, self.job_end = os.pipe2(os.O_CLOEXEC)  # job_end: the job's stdout; its spawner closes it
        os.set_blocking(self._pipe, False)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._pipe, self.pull)

    def pull(self) -> None:
        """Copy what the pipe holds now; at the cap, at EOF or on a write error, stop."""
        while self._pipe >= 0:
            try:
                chunk = os.read(self._pipe, _CHUNK)
            except BlockingIOError:
                return
            keep = memoryview(chunk)[: self._cap - self._written]
            try:
                while keep:
                    n = os.write(self._log, keep)
                    self._written += n
                    keep = keep[n:]
            except OSError:  # the host's /tmp is full: the job's output goes no further
                self.close()
                return
            if not chunk or self._written >= self._cap:
                self.close()

    def close(self) -> None:
        if self._pipe >= 0:
            self._loop.remove_reader(self._pipe)
            os.close(self._pipe)
            self._pipe = -1
