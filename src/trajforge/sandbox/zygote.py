"""Root mode: helpers are forked from one warm process per run instead of started per sample.

Starting a Python interpreter for every sample's helper costs more CPU than everything else a
one-command sample does, so when the runner is root a single *zygote* (this code, in the same
helper script, started once by the run's provider) forks each sample's helper: the child opens
the namespaces of the sample's bwrap (its init's /proc/<pid>/ns/*), enters them (setns, the
mount namespace last: it also moves the root into the sandbox), forks once more so the helper
lives in the sample's pid namespace, and drops everything before it reads a request:
no_new_privs, an empty capability bounding set, no supplementary groups, gid = the sample's,
uid (real, effective, saved) = (helper uid, sample uid, helper uid). The effective uid is the
sample's, so every file it touches is the sample's to touch; the real and saved uid are not,
so nothing the sample runs can signal or ptrace the helper (`kill -9 -1` spares it). Commands
then take the sample's uid throughout (helper.child). The zygote holds no sample state, runs
with a clean environment, and exits when the runner's end of its socket closes.

Protocol: the runner sends `<I` length + marshal {"pid", "uid", "huid", "cgroup"} with the sample's
channel socket attached (SCM_RIGHTS); the helper answers on that channel (helper.run_helper).
"""

from __future__ import annotations

import _socket
import marshal
import os
import struct

_NS = ("ipc", "uts", "net", "cgroup", "pid", "mnt")  # mnt last: it changes what /proc/<pid> means
_CAP_LAST = 63
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_PDEATHSIG = 38, 24, 1


def zygote_main(fd: int) -> None:
    import ctypes
    import fnmatch  # noqa: F401  everything a helper may import later, imported while the host's
    import posixpath  # noqa: F401  library is still visible: inside, the runner's interpreter is not
    import re  # noqa: F401
    import resource  # noqa: F401

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)  # the runner's death ends the zygote
    sock = _socket.socket(fileno=fd)
    buf = b""
    while True:
        data, anc, _flags, _addr = sock.recvmsg(4096, _socket.CMSG_LEN(4 * 4), _socket.MSG_CMSG_CLOEXEC)
        if not data:
            os._exit(0)
        fds = [int.from_bytes(raw[i:i + 4], "little", signed=True)
               for level, kind, raw in anc if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS
               for i in range(0, len(raw) - 3, 4)]
        buf += data
        while len(buf) >= 4:
            (size,) = struct.unpack_from("<I", buf)
            if len(buf) < 4 + size:
                break
            req = marshal.loads(buf[4:4 + size])
            buf = buf[4 + size:]
            channel = fds.pop(0) if fds else -1
            if channel >= 0:
                _fork_helper(libc, req, channel, fd)
                os.close(channel)
        for extra in fds:
            os.close(extra)


def _fork_helper(libc, req: dict, channel: int, zygote_fd: int) -> None:  # type: ignore[no-untyped-def]
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)  # the intermediate exits as soon as the helper is forked
        return
    try:
        os.close(zygote_fd)
        if req.get("cgroup"):  # the sample's memory cgroup, joined while the host's /sys is visible:
            with open(req["cgroup"], "w") as f:  # the helper and every command it forks are in it
                f.write(str(os.getpid()))
        ns_fds = [os.open(f"/proc/{req['pid']}/ns/{ns}", os.O_RDONLY | os.O_CLOEXEC) for ns in _NS]
        for ns_fd in ns_fds:
            if libc.setns(ns_fd, 0) != 0:
                raise OSError(ctypes_errno(), "setns failed")
            os.close(ns_fd)
        os.chdir("/")
        if os.fork():  # the helper must be a child to be in the new pid namespace
            os._exit(0)
        os.setsid()
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes_errno(), "no_new_privs failed")
        for cap in range(_CAP_LAST + 1):
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the kernel's last cap: fine
        uid, huid = req["uid"], req["huid"]
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(huid, uid, huid)  # none is 0: the kernel clears every capability
        if os.geteuid() != uid or os.getuid() != huid or 0 in os.getresuid():
            raise OSError("the helper did not drop its privileges")
        os.closerange(3, channel)
        os.closerange(channel + 1, 1 << 16)
        run_helper(channel)  # noqa: F821 (helper.py, before this in the assembled source)
    except BaseException as e:  # noqa: BLE001
        os.write(2, f"trajforge zygote: cannot start a sample's helper: {e}\n".encode())
    os._exit(1)


def ctypes_errno() -> int:
    import ctypes

    return ctypes.get_errno()
