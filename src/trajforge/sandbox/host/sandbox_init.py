"""The first process of a root-mode sandbox: made ready as root, then one sample's, unprivileged.

The zygote forks it (zygote.op_sandbox) as pid 1 of a new pid namespace, in the background,
before any sample wants it. As root, with nothing of a sample anywhere in reach, it:
- joins the sandbox's cgroups (memory, CPU, processes: resources.SampleGroup), then new UTS,
  cgroup and IPC namespaces, and the network namespace the zygote made for it;
- clones the sandbox's workspace (a directory the runner just made) while still in the host's
  mount namespace, then builds its own mount namespace (root_view.py) and mounts the clone at
  /workspace;
- closes every descriptor but its channel to the runner: no namespace, directory or socket of
  the host or of another sandbox stays with it; and says it is ready.
Then it waits. `begin`, sent by the runner when a sample takes the sandbox, names the mount
points of the row's absolute cwd (bound from the workspace, root_view.alias) and the commands'
settings; then the process drops every privilege for good: real, effective and saved uid and
gid become the sample's, the supplementary groups go, every capability set is emptied (the
bounding set and no_new_privs are the zygote's, zygote.confine), it stops being dumpable, takes
the sample's seccomp filter (seccomp.py) and seals its imports (guard.py). Only then does it
read the sample's first request, as the sample's helper (helper.py), for the rest of its life.
It exits when the runner closes the channel; the kernel then kills every process of its pid
namespace, and the sandbox is gone: nothing of it is ever given to another sample. Stdlib and ctypes only: part of the zygote's
assembled source.
"""

from __future__ import annotations

import _signal
import os

from trajforge.sandbox.inside.guard import seal
from trajforge.sandbox.inside.helper import Helper
from trajforge.sandbox.host.root_view import RootView, checked
from trajforge.sandbox.host.seccomp import confine_sample

_NEWCGROUP, _NEWUTS, _NEWIPC, _NEWNET = 0x2000000, 0x4000000, 0x8000000, 0x40000000
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_NAME, _PR_CAP_AMBIENT = 1, 4, 15, 47
_PR_CAP_AMBIENT_CLEAR_ALL, _PR_CAPBSET_READ, _PR_CAPBSET_DROP, _CAP_LAST = 4, 23, 24, 63
_CAPABILITY_VERSION_3 = 0x20080522
_SYS_OPEN_TREE = 428
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC, _AT_SYMLINK_NOFOLLOW, _AT_FDCWD = 1, 0o2000000, 0x100, -100
# Signals a sample's processes (the same uid) could send; pid 1 ignores what has no handler
# anyway, but the helper's own wake-up handlers must not be the sample's lever either.
_IGNORED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGPIPE", "SIGXFSZ")


def drop_privileges(libc, ctypes, uid: int, gid: int) -> None:  # type: ignore[no-untyped-def]
    """For good: uid and gid (real, effective, saved) become the sample's, no supplementary
    group, every capability set empty (the bounding set again: joining a user namespace fills
    it), not dumpable, and the sample's seccomp filter (seccomp.py), which every command inherits.
    Raises if any of it did not hold."""
    for cap in range(_CAP_LAST + 1):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the kernel's last cap: fine
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # no uid 0 left: the kernel clears the permitted and effective sets
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    checked(libc.capset(header, (ctypes.c_uint32 * 6)()), "capset")  # inheritable too
    checked(libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "ambient")
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)  # after the uid change, which would reset it
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups() \
            or libc.prctl(_PR_CAPBSET_READ, 0, 0, 0, 0) != 0:
        raise OSError("the sandbox helper could not drop its privileges")
    confine_sample(libc)


def close_all_but(keep: set[int]) -> None:
    low = 3
    for fd in sorted(keep):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, 1 << 16)


class SandboxInit:
    """One sandbox's first process (module doc). `req` is the zygote's sandbox request."""

    def __init__(self, libc, ctypes, req: dict, channel: int) -> None:  # type: ignore[no-untyped-def]
        self.libc, self.ctypes, self.req, self.channel = libc, ctypes, req, channel
        self.view = RootView(libc)

    def prepare(self, net: int, template: int) -> None:
        """Everything a sandbox is made of, as root, before any sample (module doc)."""
        libc, req = self.libc, self.req
        libc.prctl(_PR_SET_NAME, b"tf-sandbox", 0, 0, 0)
        libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)  # the zygote's death ends the sandbox
        for name in _IGNORED:
            _signal.signal(getattr(_signal, name), _signal.SIG_IGN)
        _signal.set_wakeup_fd(-1)  # the zygote's wake-up pipe is not ours
        for procs in req.get("cgroups", ()):  # every command it starts inherits them
            fd = os.open(procs, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        tree = checked(libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, req["workspace"].encode(),
                                    _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_SYMLINK_NOFOLLOW), "open_tree")
        if net >= 0:
            checked(libc.setns(net, _NEWNET), "setns(net)")
        checked(libc.unshare(_NEWUTS | _NEWCGROUP | _NEWIPC), "unshare")
        checked(libc.sethostname(b"sandbox", 7), "sethostname")
        self.view.build(template, tree, req.get("tmp"), req.get("shm"))
        os.setgroups([])
        null = os.open("/dev/null", os.O_RDWR)  # the sandbox's: stdin, stdout and stderr were the runner's
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        close_all_but({self.channel})

    def serve(self) -> None:
        """Ready; the sample's `begin`; the drop; then the sample's helper until the channel closes."""
        import _socket

        sock = _socket.socket(fileno=self.channel)
        sock.setblocking(True)
        helper = Helper(sock)
        helper.send({"id": 0, "ready": os.getpid()})
        frames: list = []
        while not frames:
            frames = helper.frames()
        begin = frames.pop(0)[0]
        try:
            for inside, source in begin["aliases"]:
                self.view.alias(inside, source)
            drop_privileges(self.libc, self.ctypes, begin["uid"], begin["gid"])
            helper.setup(begin)
            seal()
        except Exception as e:  # noqa: BLE001 (the runner ends the sandbox)
            helper.send({"id": begin["id"], "error": "other", "msg": f"{type(e).__name__}: {e}"})
            os._exit(1)
        helper.send({"id": begin["id"], "uid": os.getuid()})
        for meta, payload in frames:  # sent right behind `begin`: the sample's
            helper.handle(meta, payload)
        try:
            helper.serve()
        except (EOFError, ConnectionError):
            os._exit(0)


def sandbox_main(libc, ctypes, req: dict, channel: int, net: int, template: int) -> None:  # type: ignore[no-untyped-def]
    """The body of the zygote's fork (zygote.op_sandbox); never returns."""
    init = SandboxInit(libc, ctypes, req, channel)
    try:
        init.prepare(net, template)
    except Exception as e:  # noqa: BLE001 (said to the runner, which ends the sandbox)
        import _socket

        Helper(_socket.socket(fileno=channel)).send({"id": 0, "error": "other", "msg": f"{type(e).__name__}: {e}"})
        os._exit(1)
    init.serve()
    os._exit(0)
