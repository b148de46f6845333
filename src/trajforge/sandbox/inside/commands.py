"""The commands of the in-sandbox helper (helper.py): spawning, output, exit, kill. Stdlib only.

Every command is `bash -c` (the sample's limits set by the shell itself, process.bash_limits_prefix,
then its cwd), in its own session, spawned with posix_spawn: a vfork, not a fork of the helper's
interpreter. Signals the helper ignores are reset for it.
- Foreground (`exec`): the helper reads the command's stdout and stderr itself, keeping the first
  and the last `cap // 2` bytes of each, and sends them with the exit event once the command has
  exited and both pipes are closed, or DETACH_GRACE seconds after it exited while something it
  started still holds them: that process group is killed then and the event says `detached`.
  So the runner handles one request and one event per command, no pipes.
- Background (`exec` with `log`): output goes to a memfd only the helper holds, read back by
  offset (`log`); the exit event carries the code alone.
The helper is its pid namespace's init, so `reap` also collects every orphan of the sample.
"""

from __future__ import annotations

import _signal
import os
import time

# A command whose cwd cannot be entered never starts; the runner's exec() turns this line into
# ExecResult.start_error (a failed tool call, not a command that ran).
CD_FAILED = "trajforge-sandbox: cannot enter the working directory"
CD_FAILED_EXIT = 125
DETACH_GRACE = 0.5  # also the local backend's (process.DETACH_GRACE)
# Reset in every command: Python ignores SIGPIPE and SIGXFSZ, a root-mode sandbox's helper
# (sandbox_init.py) ignores the rest, and an ignored signal stays ignored across exec.
_DEFAULT_SIGNALS = (_signal.SIGCHLD, _signal.SIGPIPE, _signal.SIGXFSZ, _signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP,
                    _signal.SIGQUIT, _signal.SIGUSR1, _signal.SIGUSR2, _signal.SIGALRM)


def drain(fd: int) -> None:
    """Empty a non-blocking pipe (a signal wakeup pipe: only that it woke up matters)."""
    while True:
        try:
            if not os.read(fd, 4096):
                return
        except BlockingIOError:
            return


def reaped() -> list[tuple[int, int]]:
    """(pid, exit code) of every child that has exited, reaped now."""
    out = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return out
        if pid == 0:
            return out
        out.append((pid, os.waitstatus_to_exitcode(status)))


def quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


class Capture:
    """A foreground command's output: head and tail of each stream, like process.CappedBuffer."""

    __slots__ = ("rid", "pid", "half", "heads", "tails", "totals", "open", "code", "deadline", "killed")

    def __init__(self, rid: int, pid: int, cap: int) -> None:
        self.rid, self.pid, self.half = rid, pid, max(cap // 2, 1)
        self.heads, self.tails, self.totals = [b"", b""], [b"", b""], [0, 0]
        self.open = 2
        self.code: int | None = None
        self.deadline = 0.0
        self.killed = False  # its group was killed for holding the pipes: now they close, or time is up

    def feed(self, stream: int, data: bytes) -> None:
        self.totals[stream] += len(data)
        room = self.half - len(self.heads[stream])
        if room > 0:
            self.heads[stream] += data[:room]
            data = data[room:]
        if data:
            self.tails[stream] = (self.tails[stream] + data)[-self.half:]


class Commands:
    def init_commands(self) -> None:
        self.procs: dict[int, int] = {}  # pid -> request id
        self.logs: dict[int, int] = {}  # job id -> memfd
        self.captures: dict[int, Capture] = {}  # request id -> capture, until its exit event is sent
        self.readers: dict[int, tuple[Capture, int]] = {}  # pipe read end -> (capture, stream)

    def op_exec(self, m: dict, _p: bytes) -> tuple[dict, bytes]:
        cwd = self.cfg["cwd"]  # type: ignore[attr-defined]
        if m.get("cwd"):
            root, rel = self.where(m["cwd"])  # type: ignore[attr-defined]
            cwd = os.path.join(root, rel) if rel != "." else root
        try:  # the sample may have removed its own working directory
            if not os.path.isdir(cwd):  # the usual case costs one stat, not a failed mkdir
                os.makedirs(cwd, exist_ok=True)
            if not os.access(cwd, os.X_OK):
                raise PermissionError(13, "Permission denied")
        except OSError as e:  # never run the command elsewhere
            return {"pid": 0, "failed": CD_FAILED_EXIT, "err": f"{CD_FAILED}: {e.strerror}\n"}, b""
        if m.get("log"):
            log = self.logs[m["id"]] = os.memfd_create(f"job-{m['id']}", os.MFD_CLOEXEC)
            pid = self.spawn(m["cmd"], cwd, log, log)
        else:
            pipes = [os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK), os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)]
            try:
                pid = self.spawn(m["cmd"], cwd, pipes[0][1], pipes[1][1])
            except BaseException:
                for r, _ in pipes:
                    os.close(r)
                raise
            finally:
                for _, w in pipes:
                    os.close(w)
            capture = self.captures[m["id"]] = Capture(m["id"], pid, m.get("cap", 50_000))
            for stream, (r, _) in enumerate(pipes):
                self.readers[r] = (capture, stream)
                self.poll.register(r, 1)  # type: ignore[attr-defined]  # POLLIN
        self.procs[pid] = m["id"]
        return {"pid": pid}, b""

    def spawn(self, cmd: str, cwd: str, out: int, err: int) -> int:
        c = self.cfg  # type: ignore[attr-defined]
        script = f"{c['prefix']}cd -- {quote(cwd)} || exit {CD_FAILED_EXIT}; {cmd}"
        return os.posix_spawn(c["shell"], [c["shell"], "-c", script], c["env"], setsid=True,
                              file_actions=[(os.POSIX_SPAWN_DUP2, self.devnull, 0),  # type: ignore[attr-defined]
                                            (os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, err, 2)],
                              setsigdef=_DEFAULT_SIGNALS)

    def readable(self, fd: int) -> None:
        capture, stream = self.readers[fd]
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            capture.feed(stream, data)
            return
        self._close_reader(fd)
        capture.open -= 1
        self._maybe_done(capture)

    def _close_reader(self, fd: int) -> None:
        del self.readers[fd]
        self.poll.unregister(fd)  # type: ignore[attr-defined]
        os.close(fd)

    def _maybe_done(self, capture: Capture, detached: bool = False) -> None:
        if capture.code is None or (capture.open and not detached):
            return
        detached = detached or capture.killed
        for fd in [fd for fd, (c, _) in self.readers.items() if c is capture]:
            self._close_reader(fd)
        del self.captures[capture.rid]
        heads, tails = capture.heads, capture.tails
        event = {"ev": "exit", "id": capture.rid, "code": capture.code, "detached": detached,
                 "sizes": [len(heads[0]), len(tails[0]), capture.totals[0], len(heads[1]), len(tails[1]),
                           capture.totals[1]]}
        self.send(event, heads[0] + tails[0] + heads[1] + tails[1])  # type: ignore[attr-defined]

    def next_deadline(self) -> float | None:
        """Seconds until the earliest detach grace ends, None when none is running."""
        if not self.captures:  # (once per wake-up of the helper: the usual case costs nothing)
            return None
        pending = [c.deadline for c in self.captures.values() if c.code is not None]
        return max(0.0, min(pending) - time.monotonic()) if pending else None

    def expire(self) -> None:
        """Kill what still holds the pipes of commands that exited DETACH_GRACE ago, then give the
        killed processes DETACH_GRACE more to exit (and close them) before reporting regardless."""
        if not self.captures:
            return
        now = time.monotonic()
        for capture in [c for c in self.captures.values() if c.code is not None and c.deadline <= now]:
            if capture.killed:
                self._maybe_done(capture, detached=True)  # one escaped the group: report without it
            else:
                self.killpg(capture.pid)
                capture.killed, capture.deadline = True, now + DETACH_GRACE

    def killpg(self, pgid: int) -> None:
        # Even after the leader was reaped: a group id is not reused while the group has members,
        # and in this pid namespace every process is the sample's own anyway.
        if pgid > 1:  # never the helper's own group (0) or itself (pid 1)
            try:
                os.killpg(pgid, 9)
            except OSError:
                pass

    def op_kill(self, m: dict, _p: bytes) -> tuple[dict, bytes]:
        self.killpg(m["pgid"])
        return {}, b""

    def op_log(self, m: dict, _p: bytes) -> tuple[dict, bytes]:
        fd, offset, cap = self.logs[m["job"]], m["offset"], m["cap"]
        size = os.fstat(fd).st_size
        if size - offset <= cap:
            return {"end": size, "dropped": 0, "head": size - offset}, os.pread(fd, size - offset, offset)
        half = cap // 2
        head, tail = os.pread(fd, half, offset), os.pread(fd, half, size - half)
        return {"end": size, "dropped": size - offset - 2 * half, "head": len(head)}, head + tail

    def op_forget(self, m: dict, _p: bytes) -> tuple[dict, bytes]:
        fd = self.logs.pop(m["job"], None)
        if fd is not None:
            os.close(fd)
        return {}, b""

    def reap(self) -> None:
        for pid, code in reaped():  # as pid 1 it also reaps every orphan of the namespace
            rid = self.procs.pop(pid, None)
            if rid is None:
                continue
            capture = self.captures.get(rid)
            if capture is None:
                self.send({"ev": "exit", "id": rid, "code": code})  # type: ignore[attr-defined]
            else:
                capture.code, capture.deadline = code, time.monotonic() + DETACH_GRACE
                self._maybe_done(capture)
