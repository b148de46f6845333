"""Root mode: one process per run that makes every sandbox's namespaces, ahead of time.

Starting a Python interpreter, or even a bwrap, per sample costs more CPU than everything else a
one-command sample does, so when the runner is root one *zygote* (this code, in the helper
script, started once per run by the runtime, bwrap_runtime.py) does the privileged setup in-process:

- `op_template`: it keeps a descriptor of the run's *template* mount namespace, built by one bwrap
  per run (the read-only system view, /dev and the mount points).
- `op_router`, `op_netns`: network namespaces made with unshare/setns and wired with netlink
  (netlink.py), no `ip` process: the run's router (router.py) and each sandbox's namespace, with
  its loopback and, in egress mode, a veth link to the router.
- `op_sandbox`: a sandbox, made before any sample wants it (sandbox_pool.py): the zygote unshares a new
  pid namespace for its next child and forks it, so the child is pid 1 there; the child builds
  the sandbox as root and later serves one sample, unprivileged (sandbox_init.py).
- `op_enter`: a file helper in every namespace of a container (backends/container/sandbox.py), as the
  container's uid and without any capability.

The zygote itself runs nothing of a sample and reads no path a sample can write: its requests
come from the runner alone, and what it forks drops every privilege before a sample's first
request reaches it (the invariant of the sandbox package). An empty capability bounding set,
no_new_privs and a seccomp filter (seccomp.py) that keeps samples from making user namespaces
are the zygote's own, set once at its start and inherited by every fork.

Protocol with the runner (zygote_client.py), both ways: `<I` length + marshal dict; requests carry
"id" and get one reply {"id": n, ...} or {"id": n, "error": text}; {"ev": "exit", "id": n,
"code": c} follows when the child of request n is reaped (a sandbox: once every process of its
pid namespace is dead). A sandbox or enter request carries one descriptor (SCM_RIGHTS): the
channel. The zygote exits when the runner's end of its socket closes or the runner dies.
"""

from __future__ import annotations

import _signal
import _socket
import functools
import marshal
import os
import select
import struct

from trajforge.sandbox.inside.guard import preload
from trajforge.sandbox.inside.commands import drain, reaped
from trajforge.sandbox.host.root_view import checked
from trajforge.sandbox.host.sandbox_init import close_all_but, drop_privileges, sandbox_main
from trajforge.sandbox.host.seccomp import forbid_user_namespaces
from trajforge.sandbox.host.netns import Namespaces

_NEWPID = 0x20000000
_PR_SET_PDEATHSIG, _PR_SET_NAME, _PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP = 1, 15, 38, 24
_CAP_LAST = 63
# A container's namespaces, in the order a file helper joins them: the user namespace last.
_ENTER = (("mnt", 0x20000), ("net", 0x40000000), ("ipc", 0x8000000), ("uts", 0x4000000),
          ("cgroup", 0x2000000), ("pid", 0x20000000), ("user", 0x10000000))
_FRAME = struct.Struct("<I")


class Zygote(Namespaces):
    def __init__(self, fd: int) -> None:
        import ctypes

        self.ctypes = ctypes
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
        self.libc.syscall.restype = ctypes.c_long
        self.libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)  # the runner's death ends the zygote
        self.libc.prctl(_PR_SET_NAME, b"tf-zygote", 0, 0, 0)  # for ps and perf on the host
        self.sock = _socket.socket(fileno=fd)
        self.fd = fd
        self.host_net = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self.host_pid = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        self.template = -1
        self.nets: dict[int, int] = {}  # handle -> descriptor of a network namespace
        self.helpers: dict[int, int] = {}  # host pid -> the sandbox or enter request that forked it
        self.buf = b""

    def confine(self) -> None:
        """What every sandbox and its sample must have, set once on the zygote itself, which every
        fork inherits: no_new_privs, an empty capability bounding set (the zygote keeps its own
        capabilities: it never executes a program) and the seccomp filter against user
        namespaces and keyrings (seccomp.py; the zygote's own unshare calls carry no
        CLONE_NEWUSER)."""
        libc, check = self.libc, self.check
        check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        for cap in range(_CAP_LAST + 1):
            libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the kernel's last cap: fine
        forbid_user_namespaces(libc)

    # --- plumbing ----------------------------------------------------------------------------
    def check(self, result: int, what: str) -> int:
        return checked(result, what)

    def send(self, msg: dict) -> None:
        data = marshal.dumps(msg)
        self.sock.sendall(_FRAME.pack(len(data)) + data)

    def serve(self) -> None:
        wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        _signal.signal(_signal.SIGCHLD, lambda *_: None)
        _signal.set_wakeup_fd(wake_w)
        poll = select.poll()
        poll.register(self.fd, select.POLLIN)
        poll.register(wake_r, select.POLLIN)
        while True:
            try:
                events = poll.poll()
            except InterruptedError:
                continue
            for fd, _ in events:
                if fd == wake_r:
                    drain(wake_r)
                    self.reap()
                else:
                    self.receive()

    def receive(self) -> None:
        try:
            data, anc, _flags, _addr = self.sock.recvmsg(1 << 16, _socket.CMSG_LEN(4 * 4), _socket.MSG_CMSG_CLOEXEC)
        except InterruptedError:
            return
        if not data:
            os._exit(0)
        fds = [int.from_bytes(raw[i:i + 4], "little", signed=True)
               for level, kind, raw in anc if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS
               for i in range(0, len(raw) - 3, 4)]
        self.buf += data
        while len(self.buf) >= 4:
            (size,) = _FRAME.unpack_from(self.buf)
            if len(self.buf) < 4 + size:
                break
            req = marshal.loads(self.buf[4:4 + size])
            self.buf = self.buf[4 + size:]
            channel = fds.pop(0) if req.get("op") in ("sandbox", "enter") and fds else -1
            try:
                reply = getattr(self, "op_" + req["op"])(req, channel)
            except Exception as e:  # noqa: BLE001 (reported to the runner, the zygote goes on)
                reply = {"error": f"{type(e).__name__}: {e}"}
            finally:
                if channel >= 0:
                    os.close(channel)
            reply["id"] = req["id"]
            self.send(reply)
        for extra in fds:
            os.close(extra)

    def reap(self) -> None:
        for pid, code in reaped():
            rid = self.helpers.pop(pid, None)
            if rid is not None:
                self.send({"ev": "exit", "id": rid, "code": code})

    # --- requests ----------------------------------------------------------------------------
    def op_template(self, req: dict, _channel: int) -> dict:
        fd = os.open(f"/proc/{req['pid']}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        if self.template >= 0:
            os.close(self.template)
        self.template = fd
        return {}

    def op_kill(self, req: dict, _channel: int) -> dict:
        if req["pid"] in self.helpers:  # never a pid that is not one of ours (and still unreaped)
            os.kill(req["pid"], 9)
        return {}

    def _fork(self, what: str, body) -> int:  # type: ignore[no-untyped-def]
        """Fork a child that runs `body` and never returns here; its pid."""
        pid = os.fork()
        if pid == 0:
            try:
                body()
            except BaseException as e:  # noqa: BLE001
                os.write(2, f"trajforge zygote: cannot start {what}: {e}\n".encode())
            os._exit(1)
        return pid

    def op_enter(self, req: dict, channel: int) -> dict:
        """Fork a file helper into every namespace of the container whose process is `pid`, with
        that process's uid and gid and no capability (backends/container/sandbox.py): the container's own view
        of its files, network and processes, nothing of the host. The fork joins them and forks
        the helper (pid namespaces take effect for children), then exits: the helper lives on in
        the container, as one of its processes, until the runner closes its channel."""
        if channel < 0:
            raise ValueError("a file helper needs a channel")
        target = req["pid"]
        spaces = []
        for kind, flag in _ENTER:
            path = f"/proc/{target}/ns/{kind}"
            if os.path.exists(path) and os.stat(path).st_ino != os.stat(f"/proc/self/ns/{kind}").st_ino:
                spaces.append((os.open(path, os.O_RDONLY | os.O_CLOEXEC), flag))
        try:
            pid = self._fork("a container's file helper", lambda: self._enter_container(req, channel, spaces))
        finally:
            for fd, _ in spaces:
                os.close(fd)
        self.helpers[pid] = req["id"]
        return {"pid": pid}

    def _enter_container(self, req: dict, channel: int, spaces: list) -> None:
        libc = self.libc
        libc.prctl(_PR_SET_NAME, b"tf-files", 0, 0, 0)
        for sig in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGPIPE):
            _signal.signal(sig, _signal.SIG_IGN)
        _signal.set_wakeup_fd(-1)
        for procs in req.get("cgroups", ()):  # the container's cgroups: its limits hold the helper too
            try:
                with open(procs, "w") as f:
                    f.write("0")
            except OSError:
                pass
        uid, gid = req["uid"], req["gid"]
        if spaces and spaces[-1][1] == _ENTER[-1][1]:  # its ids as the container's user namespace has them
            uid, gid = (_inside_id(f"/proc/{req['pid']}/{kind}_map", host) for kind, host in (("uid", uid), ("gid", gid)))
        for fd, flag in spaces:  # the user namespace last: it takes this process's host capabilities
            checked(libc.setns(fd, flag), f"setns({flag:#x})")
        os.chdir("/")  # root and cwd became the container's with its mount namespace
        for fd, ends in ((0, os.pipe()), (1, os.pipe()), (2, os.pipe())):  # never the runner's streams
            os.dup2(ends[0] if fd == 0 else ends[1], fd)  # reads see EOF, writes EPIPE (SIGPIPE is ignored)
            os.close(ends[0])
            os.close(ends[1])
        close_all_but({channel})
        if os.fork():  # the helper is the child: in the container's pid namespace
            os._exit(0)
        libc.prctl(_PR_SET_PDEATHSIG, 0, 0, 0, 0)
        drop_privileges(libc, self.ctypes, uid, gid)
        run_helper(channel)  # noqa: F821 (helper.py)

    def op_sandbox(self, req: dict, channel: int) -> dict:
        """Fork a sandbox's first process: pid 1 of a new pid namespace, in the network namespace
        made for it in the same request (`net`: op_netns's request), serving `channel`
        (sandbox_init.py). The zygote keeps nothing of it but its pid."""
        if channel < 0 or self.template < 0:
            raise ValueError("a sandbox needs a channel and the template")
        net = -1
        if req.get("net") is not None:
            net = self.op_netns(req["net"], -1)["ns"]
            self.nets.pop(net, None)  # the sandbox's alone: closed here once it has joined
        try:
            # The next child is pid 1 of a new pid namespace; the zygote's own children after it are not.
            self.check(self.libc.unshare(_NEWPID), "unshare(pid)")
            try:
                pid = self._fork("a sandbox", lambda: sandbox_main(self.libc, self.ctypes, req, channel, net,
                                                                   self.template))
            finally:
                self.check(self.libc.setns(self.host_pid, _NEWPID), "setns(host pid)")
        finally:
            if net >= 0:
                os.close(net)
        self.helpers[pid] = req["id"]
        return {"pid": pid}


def _inside_id(map_path: str, host: int) -> int:
    """The id of a user namespace that host id `host` is (its uid_map or gid_map, read from the host)."""
    with open(map_path, encoding="ascii") as f:
        for line in f:
            inside, outside, count = (int(x) for x in line.split())
            if outside <= host < outside + count:
                return host - outside + inside
    raise ValueError(f"id {host} is not mapped in {map_path}")


def reply_encoder():  # type: ignore[no-untyped-def]
    """The sandbox helpers' reply encoder in place of helper._enc, which spares a helper started alone
    the import of json: here json's C encoder is imported once, before any fork, and is cheaper per
    reply than the helper's own (bench/RESULTS.md). The same JSON for the runner
    (tests/sandbox/test_isolation.py)."""
    import json

    return functools.partial(json.dumps, ensure_ascii=False, separators=(",", ":"), default=str)


def zygote_main(fd: int) -> None:
    global _enc
    import gc

    preload()  # everything a helper may need, loaded here: it loads nothing after its start (guard.py)
    _enc = reply_encoder()
    zygote = Zygote(fd)
    zygote.confine()
    # Every object so far is shared with the forked sandboxes: no collection may touch (and so
    # copy) their pages. A helper makes little garbage and lives as long as one sample.
    gc.freeze()
    gc.disable()
    zygote.serve()
