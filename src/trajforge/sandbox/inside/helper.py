"""The in-sandbox helper: one small process serving a sample, inside its namespaces, with its rights.

It serves the sample's channel (a unix socket): as bwrap's command in user mode (`python3 -S
-I -c <boot>`, the source on stdin, see `source()`), in root mode as the first process of a
sandbox made for this one sample (sandbox_init.py), and as a container's file helper
(zygote.op_enter). Either way it runs with the sample's uid and no privilege, and everything it
does the sample could have done itself (the sandbox package's invariant):

- commands are spawned by it (commands.py): no per-command entry chain into the namespaces,
  and it collects their output itself;
- file operations run fsops in the sandbox's own mount view.

Protocol (both ways): frames of `<II` (meta length, payload length), meta, payload. Runner to
helper: meta is `marshal` (trusted side). Helper to runner: meta is JSON written by `_enc` (no
json import: it would cost the start-up as much as the interpreter), which the runner parses as
untrusted input. One reply per request ({"id": n, ...} or {"id": n, "error": kind, "msg": ...})
and an {"ev": "exit", "id": n, "code": c, ...} event per command (with a foreground command's
output as the payload). Stdlib only; it loads no module after its start (guard.py).
"""

from __future__ import annotations

import _signal
import _socket
import marshal
import os
import select
import struct

from trajforge.sandbox.inside.fsops import locate, read, reply_of, search, write
from trajforge.sandbox.inside.guard import preload, seal, sealed
from trajforge.sandbox.inside.commands import CD_FAILED, CD_FAILED_EXIT, Commands, drain  # noqa: F401 (channel.py)

_HEAD = struct.Struct("<II")
_ESC = {i: f"\\u{i:04x}" for i in range(32)}
_ESC.update({34: '\\"', 92: "\\\\"})


def _enc(o: object) -> str:
    t = type(o)  # exact types first: the messages are mostly small ints and short strings
    if t is int:
        return str(o)
    if t is str:
        return '"' + o.translate(_ESC) + '"'  # type: ignore[attr-defined]
    if t is dict:
        return "{" + ",".join(['"' + str(k).translate(_ESC) + '":' + _enc(v) for k, v in o.items()]) + "}"  # type: ignore[attr-defined]
    if o is None or o is True or o is False:
        return "null" if o is None else "true" if o else "false"
    if isinstance(o, int):
        return str(int(o))  # type: ignore[call-overload]
    if isinstance(o, str):
        return _enc(str(o))
    if isinstance(o, list | tuple):
        return "[" + ",".join(map(_enc, o)) + "]"
    if isinstance(o, dict):
        return _enc(dict(o))
    return _enc(str(o))


class Helper(Commands):
    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.poll = select.poll()
        self.init_commands()

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
        if cfg.get("nice"):  # no CPU cgroup (an unprivileged runner): the closest share it can have
            os.nice(cfg["nice"])

    def frames(self) -> list[tuple[dict, bytes]]:
        try:
            # 64 KiB, not more: glibc serves a larger buffer with mmap and munmap, ~20 us a call.
            data, anc, _flags, _addr = self.sock.recvmsg(1 << 16, _socket.CMSG_LEN(64 * 4),
                                                         _socket.MSG_CMSG_CLOEXEC)
        except InterruptedError:
            return []
        if not data:
            raise EOFError
        for level, kind, raw in anc:  # the protocol passes no descriptors: none may accumulate here
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                for i in range(0, len(raw) - 3, 4):
                    os.close(int.from_bytes(raw[i:i + 4], "little", signed=True))
        buf = self.buf
        buf += data  # a bytearray: a large payload arrives in many reads, each appended in place
        out, start = [], 0
        while len(buf) - start >= 8:
            mlen, plen = _HEAD.unpack_from(buf, start)
            end = start + 8 + mlen + plen
            if len(buf) < end:
                break
            meta = marshal.loads(buf[start + 8:start + 8 + mlen])
            out.append((meta, bytes(buf[start + 8 + mlen:end])))
            start = end
        del buf[:start]
        return out

    def handle(self, meta: dict, payload: bytes) -> None:
        rid, op = meta["id"], meta["op"]
        try:
            reply, data = getattr(self, "op_" + op)(meta, payload)
        except Exception as e:  # noqa: BLE001 (reported, the helper goes on)
            reply, data = reply_of(e), b""
        reply["id"] = rid
        self.send(reply, data)

    def where(self, path: str) -> tuple[str, str]:
        c = self.cfg
        return locate(path, cwd=c["cwd"], roots=c["roots"], workdir=c["workdir"])

    def op_read(self, m: dict, _p: bytes) -> tuple[dict, bytes]:
        return {}, read(*self.where(m["path"]), m["max"], m.get("offset"))

    def op_write(self, m: dict, p: bytes) -> tuple[dict, bytes]:
        return {"rel": write(*self.where(m["path"]), p, m["how"])}, b""

    def op_self(self, _m: dict, _p: bytes) -> tuple[dict, bytes]:
        """What the helper itself holds: its /proc status and what each descriptor is (the
        invariant of the sandbox package, checked from inside by the tests and `trajforge doctor`)."""
        with open("/proc/self/status", "rb") as f:
            status = f.read().decode("ascii", "replace")
        fds = {}
        for name in os.listdir("/proc/self/fd"):
            try:
                fds[name] = os.readlink(f"/proc/self/fd/{name}")
            except OSError:
                pass  # the listing's own descriptor, closed already
        ns = {}
        for kind in ("mnt", "net", "pid", "ipc", "uts", "cgroup", "user"):
            try:
                ns[kind] = os.readlink(f"/proc/self/ns/{kind}")
            except OSError:
                pass
        import sys

        flags = {"isolated": sys.flags.isolated, "no_site": sys.flags.no_site, "path": list(sys.path)}
        return {"status": status, "fds": fds, "ns": ns, "flags": flags, "sealed": sealed()}, b""

    def op_search(self, m: dict, _p: bytes) -> tuple[dict, bytes]:
        found, more = search(*self.where(m["path"]), m["path"], m["pattern"], target=m["target"], glob=m["glob"],
                             limit=m["limit"], max_file=m["max_file"], max_files=m["max_files"],
                             seconds=m.get("seconds"))
        return {"found": found, "more": more}, b""

    def serve(self) -> None:
        wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        _signal.signal(_signal.SIGCHLD, lambda *_: None)
        _signal.set_wakeup_fd(wake_w)
        poll, sock = self.poll, self.sock.fileno()
        poll.register(sock, select.POLLIN)
        poll.register(wake_r, select.POLLIN)
        while True:
            wait = self.next_deadline()
            try:
                events = poll.poll(None if wait is None else wait * 1000 + 1)
            except InterruptedError:
                continue
            for fd, _ in events:
                if fd == sock:
                    for meta, payload in self.frames():
                        self.handle(meta, payload)
                elif fd == wake_r:
                    drain(wake_r)
                    self.reap()
                elif fd in self.readers:
                    self.readable(fd)
            self.expire()


def main() -> None:
    import sys

    fd = int(sys.argv[1])
    null = os.open("/dev/null", os.O_RDONLY)  # stdin was the pipe the source came through
    os.dup2(null, 0)
    os.close(null)
    if sys.argv[2:] == ["zygote"]:
        zygote_main(fd)  # noqa: F821 (zygote.py, which follows in the assembled source)
    else:
        preload()  # before the sample's first request: nothing loads after it (guard.py)
        run_helper(fd)


def run_helper(fd: int) -> None:
    """Serve one sample on socket `fd` until the runner closes it: its first frame is the
    configuration; imports are sealed (guard.py) before the first request is read."""
    os.set_inheritable(fd, False)
    sock = _socket.socket(fileno=fd)
    helper = Helper(sock)
    sock.setblocking(True)
    frames: list = []
    while not frames:
        frames = helper.frames()
    cfg = frames.pop(0)[0]
    helper.setup(cfg)
    seal()
    helper.send({"id": 0, "ready": os.getpid(), "uid": os.getuid()})
    for meta, payload in frames:
        helper.handle(meta, payload)
    try:
        helper.serve()
    except (EOFError, ConnectionError):  # the runner closed the channel: the sample is over
        os._exit(0)


# The modules of the helper's assembled source, in order (each defines what the next imports);
# the zygote's adds the privileged setup it does before a sandbox is any sample's.
INSIDE = ("inside.guard", "inside.safe_fs", "inside.fsops", "inside.commands", "inside.helper")
ZYGOTE = ("host.root_view", "host.sandbox_init", "host.netlink", "host.netns", "host.seccomp", "host.zygote")


def source(zygote: bool = False) -> str:
    """The helper as one stdlib-only script: INSIDE's modules (and, for the root mode's zygote,
    ZYGOTE's), their package imports dropped, and a call of `main`."""
    import importlib

    parts = ["from __future__ import annotations"]  # annotations stay strings: nothing to import for them
    for name in (*INSIDE, *(ZYGOTE if zygote else ())):
        mod = importlib.import_module(f"trajforge.sandbox.{name}")
        with open(mod.__file__ or "", encoding="utf-8") as f:
            text = f.read()
        text = text.split("\n# The modules of the helper's assembled source")[0]  # not source() itself
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
