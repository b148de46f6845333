"""The in-sandbox helper: one small process per sample, inside its namespaces, with its rights.

It serves the sample's channel (a unix socket): as bwrap's command in user mode (`python3 -S
-I -c <boot>`, the source on stdin: safe_fs + fsops + this file + zygote, see `source()`), or,
in root mode, forked by the run's zygote into the sample's namespaces with the sample's uid as
its effective uid (zygote.py). Either way everything it does the sample could have done itself:

- commands fork from it (setsid, rlimits, the sample's uid, cwd, clean env, `bash -c`): no
  per-command entry chain into the namespaces. Foreground commands get the runner's pipes
  (passed with SCM_RIGHTS); background jobs write to a memfd only the helper holds, read back
  by offset;
- file operations run fsops in the sandbox's own mount view.

Protocol (both ways): frames of `<II` (meta length, payload length), meta, payload. Runner to
helper: meta is `marshal` (trusted side). Helper to runner: meta is JSON written by `_enc` (no
json import: it would cost the start-up as much as the interpreter), which the runner parses as
untrusted input. One reply per request ({"id": n, ...} or {"id": n, "error": kind, "msg": ...})
and an {"ev": "exit", "id": n, "code": c} event per process. Stdlib only.
"""

from __future__ import annotations

import _signal
import _socket
import marshal
import os
import select
import struct

from trajforge.sandbox.fsops import FileOpError, locate, read, search, write
from trajforge.sandbox.safe_fs import PathEscapeError, SymlinkError

_HEAD = struct.Struct("<II")
# A command whose cwd cannot be entered ends with this line and code; the runner's exec() turns it
# into ExecResult.start_error (a failed tool call, not a command that ran).
CD_FAILED = "trajforge-sandbox: cannot enter the working directory"
CD_FAILED_EXIT = 125
# Reset in every command: Python ignores SIGPIPE and SIGXFSZ, a slot helper (slot_helper.py)
# ignores the rest, and an ignored signal stays ignored across exec.
_DEFAULT_SIGNALS = (_signal.SIGCHLD, _signal.SIGPIPE, _signal.SIGXFSZ, _signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP,
                    _signal.SIGQUIT, _signal.SIGUSR1, _signal.SIGUSR2, _signal.SIGALRM)
_ESC = {i: f"\\u{i:04x}" for i in range(32)}
_ESC.update({34: '\\"', 92: "\\\\"})


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _enc(o: object) -> str:
    if o is None or o is True or o is False:
        return "null" if o is None else "true" if o else "false"
    if isinstance(o, int):
        return str(o)
    if isinstance(o, str):
        return '"' + o.translate(_ESC) + '"'
    if isinstance(o, list | tuple):
        return "[" + ",".join(map(_enc, o)) + "]"
    if isinstance(o, dict):
        return "{" + ",".join(_enc(str(k)) + ":" + _enc(v) for k, v in o.items()) + "}"
    return _enc(str(o))


class Helper:
    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.fds: list[int] = []
        self.procs: dict[int, int] = {}  # pid -> request id
        self.pids: dict[int, int] = {}  # request id -> pid (until reaped)
        self.logs: dict[int, int] = {}  # job id -> memfd

    def send(self, meta: dict, payload: bytes = b"") -> None:
        data = _enc(meta).encode("utf-8", "replace")
        self.sock.sendall(_HEAD.pack(len(data), len(payload)) + data + payload)

    def setup(self, cfg: dict) -> None:
        self.cfg = cfg
        self.devnull = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
        if cfg.get("limits"):  # a shell other than bash: the limits are the helper's, and inherited
            import resource

            for res, soft, hard in cfg["limits"]:
                resource.setrlimit(res, (soft, hard))

    def frames(self) -> list[tuple[dict, bytes]]:
        try:
            data, anc, _flags, _addr = self.sock.recvmsg(1 << 20, _socket.CMSG_LEN(64 * 4),
                                                         _socket.MSG_CMSG_CLOEXEC)
        except InterruptedError:
            return []
        if not data:
            raise EOFError
        for level, kind, raw in anc:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                self.fds += [int.from_bytes(raw[i:i + 4], "little", signed=True) for i in range(0, len(raw) - 3, 4)]
        self.buf += data
        out = []
        while len(self.buf) >= 8:
            mlen, plen = _HEAD.unpack_from(self.buf)
            if len(self.buf) < 8 + mlen + plen:
                break
            meta = marshal.loads(self.buf[8:8 + mlen])
            out.append((meta, self.buf[8 + mlen:8 + mlen + plen]))
            self.buf = self.buf[8 + mlen + plen:]
        return out

    def handle(self, meta: dict, payload: bytes) -> None:
        rid, op = meta["id"], meta["op"]
        try:
            reply, data = getattr(self, "op_" + op)(meta, payload)
        except SymlinkError as e:
            reply, data = {"error": "symlink", "msg": str(e), "rel": e.rel, "link": e.link}, b""
        except PathEscapeError as e:
            reply, data = {"error": "escape", "msg": str(e)}, b""
        except FileOpError as e:
            reply, data = {"error": e.kind, "msg": str(e)}, b""
        except Exception as e:  # noqa: BLE001 (reported, the helper goes on)
            reply, data = {"error": "other", "msg": f"{type(e).__name__}: {e}"}, b""
        reply["id"] = rid
        self.send(reply, data)

    def where(self, path: str) -> tuple[str, str]:
        c = self.cfg
        return locate(path, cwd=c["cwd"], roots=c["roots"], workdir=c["workdir"])

    def op_read(self, m: dict, _p: bytes) -> tuple[dict, bytes]:
        return {}, read(*self.where(m["path"]), m["max"])

    def op_write(self, m: dict, p: bytes) -> tuple[dict, bytes]:
        return {"rel": write(*self.where(m["path"]), p, m["how"])}, b""

    def op_search(self, m: dict, _p: bytes) -> tuple[dict, bytes]:
        found, more = search(*self.where(m["path"]), m["path"], m["pattern"], target=m["target"], glob=m["glob"],
                             limit=m["limit"], max_file=m["max_file"], max_files=m["max_files"])
        return {"found": found, "more": more}, b""

    def op_exec(self, m: dict, _p: bytes) -> tuple[dict, bytes]:
        fds, self.fds = self.fds[:m["nfds"]], self.fds[m["nfds"]:]
        try:
            if m.get("log"):
                out = err = self.logs[m["id"]] = os.memfd_create(f"job-{m['id']}", os.MFD_CLOEXEC)
            else:
                out, err = fds
            cwd = self.cfg["cwd"]
            if m.get("cwd"):
                root, rel = self.where(m["cwd"])
                cwd = os.path.join(root, rel) if rel != "." else root
            try:  # the sample may have removed its own working directory
                os.makedirs(cwd, exist_ok=True)
                if not os.access(cwd, os.X_OK):
                    raise PermissionError(13, "Permission denied")
            except OSError as e:  # never run the command elsewhere; exec() reports a failed start
                os.write(err, f"{CD_FAILED}: {e.strerror}\n".encode())
                return {"pid": 0, "failed": CD_FAILED_EXIT}, b""
            pid = self.spawn(m["cmd"], cwd, out, err)
        finally:
            for fd in fds:
                os.close(fd)
        self.procs[pid], self.pids[m["id"]] = m["id"], pid
        return {"pid": pid}, b""

    def spawn(self, cmd: str, cwd: str, out: int, err: int) -> int:
        """bash -c, in its own session, with the sample's limits (set by the shell itself, see
        process.bash_limits_prefix) and cwd. posix_spawn: a vfork, not a fork of this interpreter."""
        c = self.cfg
        script = f"{c['prefix']}cd -- {_quote(cwd)} || exit {CD_FAILED_EXIT}; {cmd}"
        return os.posix_spawn(c["shell"], [c["shell"], "-c", script], c["env"], setsid=True,
                              file_actions=[(os.POSIX_SPAWN_DUP2, self.devnull, 0), (os.POSIX_SPAWN_DUP2, out, 1),
                                            (os.POSIX_SPAWN_DUP2, err, 2)],
                              setsigdef=_DEFAULT_SIGNALS)

    def op_kill(self, m: dict, _p: bytes) -> tuple[dict, bytes]:
        # Even after the leader was reaped: a group id is not reused while the group has members,
        # and in this pid namespace every process is the sample's own anyway.
        if m["pgid"] > 1:  # never the helper's own group (0) or itself (pid 1)
            try:
                os.killpg(m["pgid"], 9)
            except OSError:
                pass
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
        while True:  # as pid 1 it also reaps every orphan of the namespace
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            rid = self.procs.pop(pid, None)
            if rid is not None:
                del self.pids[rid]
                self.send({"ev": "exit", "id": rid, "code": os.waitstatus_to_exitcode(status)})

    def serve(self) -> None:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        _signal.signal(_signal.SIGCHLD, lambda *_: None)
        _signal.set_wakeup_fd(wake_w)
        poll = select.poll()
        poll.register(self.sock.fileno(), select.POLLIN)
        poll.register(wake_r, select.POLLIN)
        while True:
            try:
                events = poll.poll()
            except InterruptedError:
                continue
            for fd, _ in events:
                if fd == wake_r:
                    os.read(wake_r, 4096)
                    self.reap()
                else:
                    for meta, payload in self.frames():
                        self.handle(meta, payload)


def main() -> None:
    import sys

    fd = int(sys.argv[1])
    null = os.open("/dev/null", os.O_RDONLY)  # stdin was the pipe the source came through
    os.dup2(null, 0)
    os.close(null)
    if sys.argv[2:] == ["zygote"]:
        zygote_main(fd)  # noqa: F821 (zygote.py, which follows in the assembled source)
    else:
        run_helper(fd)


def run_helper(fd: int) -> None:
    """Serve one sample on socket `fd` until the runner closes it."""
    os.set_inheritable(fd, False)
    sock = _socket.socket(fileno=fd)
    helper = Helper(sock)
    sock.setblocking(True)
    cfg = None
    while cfg is None:
        frames = helper.frames()
        cfg = frames[0][0] if frames else None
    helper.setup(cfg)
    helper.send({"id": 0, "ready": os.getpid(), "uid": os.getuid()})
    try:
        helper.serve()
    except (EOFError, ConnectionError):  # the runner closed the channel: the sample is over
        os._exit(0)


def source(zygote: bool = False) -> str:
    """The helper as one stdlib-only script: safe_fs, fsops and this module (and, for the root
    mode's zygote, slot_helper, netlink and zygote), their package imports dropped (each defines
    what the next imports)."""
    import importlib

    parts = ["from __future__ import annotations"]  # annotations stay strings: nothing to import for them
    for name in ("safe_fs", "fsops", "helper", *(("slot_helper", "netlink", "zygote") if zygote else ())):
        mod = importlib.import_module(f"trajforge.sandbox.{name}")
        with open(mod.__file__ or "", encoding="utf-8") as f:
            text = f.read()
        text = text.split("\ndef source()")[0]  # not this function
        lines, skip = [], False
        for line in text.splitlines():
            if skip:
                skip = not line.rstrip().endswith(")")
                continue
            if line.startswith(("from __future__", "from trajforge", "from collections.abc")):
                skip = line.rstrip().endswith("(")
                continue
            lines.append(line)
        parts.append("\n".join(lines))
    return "\n".join(parts) + "\nmain()\n"
