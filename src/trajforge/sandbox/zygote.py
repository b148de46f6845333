"""Root mode: one warm process per run that makes the namespaces and helpers of every slot.

Starting a Python interpreter, or even a bwrap, per sample costs more CPU than everything else a
one-command sample does, so when the runner is root one *zygote* (this code, in the helper
script, started once per run by the runtime, bwrap_root.py) does the privileged setup in-process:

- `op_template`: it keeps a descriptor of the run's *template* mount namespace, built by one bwrap
  per run (the read-only system view, /dev and the mount points).
- `op_router`, `op_netns`: network namespaces made with unshare/setns and wired with netlink
  (netlink.py), no `ip` process: the run's router (router.py) and each slot's namespace, with
  its loopback and, in egress mode, a veth link to the router.
- `op_enter`: a file helper in a container's mount namespace (container.py), as the container's
  uid and without any capability.
- `op_slot`: a slot's helper (slot_helper.py), forked once per slot: the zygote unshares a new
  pid namespace for its next child and forks, so the helper is pid 1 there; it joins the slot's
  memory cgroup and network namespace, unshares uts and cgroup namespaces and stops being
  dumpable, then serves its channel sample after sample. An empty capability bounding set,
  no_new_privs and a seccomp filter (seccomp.py) that keeps it and its samples from making user
  namespaces are the zygote's own, set once at its start and inherited by every fork. The
  zygote reaps it once the kernel has killed everything in its pid namespace, and reports that
  exit.

Protocol with the runner (forkserver.py), both ways: `<I` length + marshal dict; requests carry
"id" and get one reply {"id": n, ...} or {"id": n, "error": text}; {"ev": "exit", "id": n,
"code": c} follows when the helper of slot request n is reaped. A slot request carries one
descriptor (SCM_RIGHTS): the slot's channel. The zygote holds no sample data and never runs
sample code; it exits when the runner's end of its socket closes or the runner dies.
"""

from __future__ import annotations

import _signal
import _socket
import functools
import marshal
import os
import select
import struct

from trajforge.sandbox.helper_exec import drain, reaped
from trajforge.sandbox.seccomp import forbid_user_namespaces
from trajforge.sandbox.slot_helper import run_slot_helper
from trajforge.sandbox.slot_mounts import SlotMounts, checked
from trajforge.sandbox.zygote_net import Namespaces

_NEWCGROUP, _NEWUTS, _NEWPID, _NEWNET = 0x2000000, 0x4000000, 0x20000000, 0x40000000
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_NAME, _PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP = 1, 4, 15, 38, 24
_CAP_LAST = 63
_CAPABILITY_VERSION_3 = 0x20080522
_NEWNS = 0x20000
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
        self.helpers: dict[int, int] = {}  # host pid -> slot request id
        self.buf = b""

    def confine(self) -> None:
        """What every slot helper and its samples must have, set once on the zygote itself, which
        every fork inherits: no_new_privs, an empty capability bounding set (the zygote keeps its
        own capabilities: it never executes a program) and the seccomp filter against user
        namespaces and keyrings (seccomp.py; the zygote's own unshare calls carry no
        CLONE_NEWUSER). Installed per helper, these cost each new slot ~1 ms of CPU."""
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
            channel = fds.pop(0) if req.get("op") in ("slot", "enter") and fds else -1
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
        """Fork a file helper into the mount namespace of a container's process `pid`, with that
        process's uid and gid and no capability (container.py): the container's own view of its
        files, symlinks resolved by its kernel view, no host path."""
        if channel < 0:
            raise ValueError("a file helper needs a channel")
        target = req["pid"]
        # A container with a user namespace of its own (rootful Podman, container_backend.py): the
        # helper stays in this one, as the host uid and gid that the container's process has, so
        # files are checked as that process's are (its capabilities inside aside, as for uid 0).
        mnt = os.open(f"/proc/{target}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        try:
            pid = self._fork("a container's file helper", lambda: self._enter_container(req, channel, mnt))
        finally:
            os.close(mnt)
        self.helpers[pid] = req["id"]
        return {"pid": pid}

    def _enter_container(self, req: dict, channel: int, mnt: int) -> None:
        libc, check = self.libc, self.check
        libc.prctl(_PR_SET_NAME, b"tf-files", 0, 0, 0)
        for sig in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGPIPE):
            _signal.signal(sig, _signal.SIG_IGN)
        check(libc.setns(mnt, _NEWNS), "setns(mnt)")  # root and cwd become the container's
        os.chdir("/")  # no_new_privs, no bounding set, the seccomp filter: the zygote's (`confine`)
        uid, gid = req["uid"], req["gid"]
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        # As uid 0 (the image's USER is root) the capabilities stay: drop every one (capset).
        header = (self.ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
        data = (self.ctypes.c_uint32 * 6)()
        check(libc.capset(header, data), "capset")
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)
        _close_all_but({channel})
        run_helper(channel)  # noqa: F821 (helper.py)

    def op_slot(self, req: dict, channel: int) -> dict:
        """Fork a slot's helper: pid 1 of a new pid namespace, serving `channel` (slot_helper.py)."""
        if channel < 0 or self.template < 0:
            raise ValueError("a slot needs a channel and the template")
        made = None
        if req.get("new_net") is not None:  # the slot's namespace, in the same request (op_netns)
            made = self.op_netns(req["new_net"], -1)["ns"]
            req["net"] = made
        net = self.nets[req["net"]] if req.get("net") is not None else -1
        try:
            # The next child is pid 1 of a new pid namespace; the zygote's own children after it are not.
            self.check(self.libc.unshare(_NEWPID), "unshare(pid)")
            try:
                pid = self._fork("a slot's helper", lambda: self._slot(req, channel, net))
            finally:
                self.check(self.libc.setns(self.host_pid, _NEWPID), "setns(host pid)")
        except BaseException:
            if made is not None:  # the runner never hears of it: not kept
                self.op_drop({"ns": made}, -1)
            raise
        self.helpers[pid] = req["id"]
        return {"pid": pid, "ns": made}

    def _slot(self, req: dict, channel: int, net: int) -> None:
        libc, check = self.libc, self.check
        libc.prctl(_PR_SET_NAME, b"tf-helper", 0, 0, 0)
        for sig in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT, _signal.SIGUSR1,
                    _signal.SIGUSR2, _signal.SIGALRM, _signal.SIGPIPE, _signal.SIGXFSZ):
            _signal.signal(sig, _signal.SIG_IGN)  # the samples share its uid: no signal may end it
        if req.get("cgroup"):  # "0": this process; every command it starts inherits the cgroup
            with open(req["cgroup"], "w") as f:
                f.write("0")
        host_mnt = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        if net >= 0:
            check(libc.setns(net, _NEWNET), "setns(net)")
        check(libc.unshare(_NEWUTS | _NEWCGROUP), "unshare")
        name = b"sandbox"
        check(libc.sethostname(name, len(name)), "sethostname")
        # No new privileges, an empty bounding set and the seccomp filter are the zygote's own
        # (`confine`), inherited by this fork: nothing it starts can ever gain a capability (the
        # helper keeps its own, dormant) or make a user namespace.
        os.setgroups([])
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        keep = {channel, host_mnt, self.template}
        for fd in sorted(keep):
            os.set_inheritable(fd, False)
        _close_all_but(keep)
        run_slot_helper(channel, SlotMounts(libc, host_mnt, self.template))

def _close_all_but(keep: set[int]) -> None:
    low = 3
    for fd in sorted(keep):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, 1 << 16)


def reply_encoder():  # type: ignore[no-untyped-def]
    """The slot helpers' reply encoder in place of helper._enc, which spares a helper started alone
    the import of json: here json's C encoder is imported once, before any fork, and costs ~15 us
    less per reply. The same JSON for the runner (tests/test_sandbox_slots.py)."""
    import json

    return functools.partial(json.dumps, ensure_ascii=False, separators=(",", ":"), default=str)


def zygote_main(fd: int) -> None:
    global _enc
    import fnmatch  # noqa: F401  everything a helper may import later, imported while the host's
    import gc
    import posixpath  # noqa: F401  library is still visible: inside, the runner's interpreter is not
    import re  # noqa: F401
    import resource  # noqa: F401

    _enc = reply_encoder()
    zygote = Zygote(fd)
    zygote.confine()
    # Every object so far is shared with the forked helpers: no collection may touch (and so copy)
    # their pages. Helpers make little garbage and live as long as one sample.
    gc.freeze()
    gc.disable()
    zygote.serve()
