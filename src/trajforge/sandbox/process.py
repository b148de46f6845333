"""Running sandboxed commands as host processes: the layer every backend builds on.

Owns the process mechanics shared by the local, bwrap and container backends: a minimal clean
environment (no runner secrets), resource limits applied in the child, foreground runs with a
per-stream output cap (head and tail kept) and a timeout that kills the whole process group,
and killing by process group (by environment tag: tagkill.py).

Every process starts in its own session (`start_new_session=True`), so its pid is also its
process-group id and one `killpg` reaches everything it forked, unless a child calls setsid
itself; tagkill.kill_tagged catches those escapees through a marker variable in their environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from trajforge.sandbox.inside import commands
from trajforge.sandbox.interface import ExecResult

DEFAULT_OUTPUT_CAP = 50_000  # bytes kept per stream of a foreground command
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The shell of the local and bwrap sandboxes' commands (host binaries are bwrap's too).
SHELL = shutil.which("bash", path=SAFE_PATH) or "/bin/sh"
# After the shell exits, how long children that inherited its stdout/stderr may keep them open.
DETACH_GRACE = commands.DETACH_GRACE  # the same grace for the helper's commands
DETACH_NOTE = ("\n[background processes still attached to this command's output were killed; "
               "redirect their output to a file (cmd > log 2>&1 &) or use the process tool]\n")


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-process rlimits; None leaves the runner's own limit in place.

    nproc: RLIMIT_NPROC counts every process of the real user id (runner and other samples
    included) and the kernel ignores it for root, so only set it when samples run as a
    dedicated unprivileged user. address_space_bytes breaks runtimes that reserve large virtual
    ranges (V8/wasm, ASan, some JVMs), hence no default.
    """

    cpu_seconds: int | None = None
    address_space_bytes: int | None = None
    file_size_bytes: int | None = None
    nproc: int | None = None


# A cap on single files stops one sample from filling the disk shared by thousands of others.
DEFAULT_LIMITS = Limits(file_size_bytes=1 << 30)


def tool_path(name: str) -> str | None:
    """A system tool as root should run it: looked up in SAFE_PATH only, never the runner's PATH."""
    return shutil.which(name, path=SAFE_PATH)


def clean_env(home: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a sandboxed command: nothing is inherited from the runner.

    PATH is fixed rather than copied so the runner's virtualenv (and its pip) is not the
    sample's `python`. SHELL is set because bash looks it up in the user database otherwise, and
    a sample's uid (root-mode bwrap) has no entry there: that lookup goes through every NSS source
    of nsswitch.conf, systemd's included, on every command (its cost: bench/RESULTS.md)."""
    env = {"PATH": SAFE_PATH, "HOME": home, "SHELL": SHELL, "LANG": "C.UTF-8", "TERM": "dumb", "PAGER": "cat"}
    env.update(extra or {})
    return env


def make_preexec(limits: Limits) -> Callable[[], None] | None:
    """A preexec_fn applying `limits` in the child, or None when there is nothing to set.

    The values are computed here, in the parent, so the child only calls setrlimit (forked
    children of a threaded parent should do as little as possible)."""
    pairs = limit_pairs(limits)
    if not pairs:
        return None

    def apply() -> None:
        for res, pair in pairs:
            resource.setrlimit(res, pair)

    return apply


# bash's `ulimit` option and unit (bytes per step) of each resource Limits can set.
_ULIMIT = {resource.RLIMIT_CPU: ("t", 1), resource.RLIMIT_AS: ("v", 1024),
           resource.RLIMIT_FSIZE: ("f", 1024), resource.RLIMIT_NPROC: ("u", 1)}


def bash_limits_prefix(limits: Limits) -> str:
    """The limits of make_preexec, set by bash itself: a prefix for a `bash -c` script.

    Any preexec_fn makes Python fork() the whole runner instead of vfork(), the largest
    per-command cost there was (bench/RESULTS.md). The prefix stays on the script's first line, so bash's line numbers
    still match the command's; if a limit cannot be set the command does not run (exit 126).
    Units round down, so a limit is never looser than asked. bash only: dash counts -f in 512s."""
    steps = []
    for res, (soft, hard) in limit_pairs(limits):
        flag, unit = _ULIMIT[res]
        # Soft first: lowering the hard limit below the current soft one would fail.
        steps += [f"ulimit -S -{flag} {soft // unit}", f"ulimit -H -{flag} {hard // unit}"]
    return " && ".join(steps) + " || exit 126; " if steps else ""


def limit_pairs(limits: Limits) -> list[tuple[int, tuple[int, int]]]:
    """(resource, (soft, hard)) for each limit that is set, capped by the runner's own hard limits."""
    pairs: list[tuple[int, tuple[int, int]]] = []
    for res, value in (
        (resource.RLIMIT_CPU, limits.cpu_seconds),
        (resource.RLIMIT_AS, limits.address_space_bytes),
        (resource.RLIMIT_FSIZE, limits.file_size_bytes),
        (resource.RLIMIT_NPROC, limits.nproc),
    ):
        if value is None:
            continue
        _, hard = resource.getrlimit(res)
        # An unprivileged runner cannot raise its hard limit; never ask for more than it has.
        cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
        # CPU: the soft limit sends SIGXCPU first; the hard one (a few seconds later) SIGKILLs.
        new_hard = cap + 5 if res == resource.RLIMIT_CPU and hard == resource.RLIM_INFINITY else cap
        pairs.append((res, (cap, new_hard)))
    return pairs


class CappedBuffer:
    """Collects a byte stream keeping at most `cap` bytes: the first and the last half."""

    def __init__(self, cap: int) -> None:
        self.half = max(cap // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.half:
                del self.tail[: len(self.tail) - self.half]

    def restore(self, head: bytes, tail: bytes, total: int) -> None:
        """The state a feed of `total` bytes left: what a helper that kept them sends back."""
        self.head, self.tail = bytearray(head[:self.half]), bytearray(tail[-self.half:] if tail else b"")
        self.total = max(total, len(self.head) + len(self.tail))

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        head = self.head.decode("utf-8", "replace")
        if not self.truncated:
            return head + self.tail.decode("utf-8", "replace")
        dropped = self.total - len(self.head) - len(self.tail)
        return head + truncation_marker(dropped) + self.tail.decode("utf-8", "replace")


def truncation_marker(dropped: int) -> str:
    return f"\n[... {dropped} bytes truncated ...]\n"


def cap_text(text: str, cap: int) -> tuple[str, bool]:
    """Cap an already-decoded text to about `cap` bytes, keeping head and tail."""
    data = text.encode("utf-8", "replace")
    if len(data) <= cap:
        return text, False
    buf = CappedBuffer(cap)
    buf.feed(data)
    return buf.text(), True


class _Collector(asyncio.SubprocessProtocol):
    """Feeds both pipes into capped buffers and reports exit and pipe closure separately.

    asyncio's Process.wait() only returns once every pipe is closed, so a background child that
    inherited stdout would make a finished command look like it hangs; this protocol tells the
    two events apart."""

    def __init__(self, cap: int) -> None:
        self.out, self.err = CappedBuffer(cap), CappedBuffer(cap)
        loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()  # exited and all pipes closed

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        (self.out if fd == 1 else self.err).feed(data)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


def kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the process group led by `proc` (started with start_new_session=True)."""
    _killpg(proc.pid)


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def run_argv(
    argv: Sequence[str],
    *,
    timeout: float,
    cwd: str | Path | None,
    env: Mapping[str, str],
    preexec_fn: Callable[[], None] | None = None,
    output_cap: int = DEFAULT_OUTPUT_CAP,
) -> ExecResult:
    """Run `argv` to completion or `timeout` seconds; on timeout or cancellation its process
    group is killed and reaped. Children still holding stdout/stderr DETACH_GRACE seconds after
    the main process exits are killed too (otherwise `server &` would hang until the timeout);
    children that redirected their output survive until the sandbox closes."""
    loop = asyncio.get_running_loop()
    transport, proto = await loop.subprocess_exec(
        lambda: _Collector(output_cap), *argv, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=cwd, env=dict(env),
        start_new_session=True, preexec_fn=preexec_fn,
    )
    pid = transport.get_pid()
    timed_out = detached = False
    try:
        # asyncio.wait never cancels the futures it watches, so a timeout leaves them usable.
        done, _ = await asyncio.wait([proto.exited], timeout=timeout)
        timed_out = not done
        if done:
            done, _ = await asyncio.wait([proto.closed], timeout=DETACH_GRACE)
            detached = not done
    finally:
        if not proto.closed.done():
            # A group id is not reused while the group has members (here: the pipe holders).
            _killpg(pid)
            await asyncio.wait([proto.closed], timeout=DETACH_GRACE)  # bounded: one may have escaped
        transport.close()
    stderr = proto.err.text()
    if detached:
        stderr += DETACH_NOTE
    return ExecResult(
        exit_code=None if timed_out else transport.get_returncode(),
        stdout=proto.out.text(), stderr=stderr, timed_out=timed_out,
        truncated=proto.out.truncated or proto.err.truncated,
    )
