"""The DNS forwarder's start: the only part of it that runs as root, before any sample byte.

service.py runs this as `nsenter --net=<namespace> python -I -S -c LAUNCH ...`. Already in the
network namespace the forwarder serves, it makes every socket the forwarder will use (the UDP
and TCP listeners; UDP sockets connected to the upstream resolver, marked with SO_MARK, which
takes CAP_NET_ADMIN to set, so that a container's firewall can tell the forwarder's queries from
a sample's; the UDP listener's receive buffer raised past the system's limit, which also takes
it, so that the datagrams the samples' rates let through outlast a moment in which the forwarder
does not get a CPU on a busy host). It raises its scheduling priority (NICE), then leaves the
host's files behind: a mount namespace of its own whose root is an empty read-only tmpfs
holding, read-only, only the interpreter's prefix, the system's libraries and the forwarder's
source (`confine_files`). Then it gives up every privilege: supplementary groups, real,
effective and saved uid and gid set to the forwarder's own id, the capability bounding, ambient,
inheritable, permitted and effective sets emptied, no_new_privs; it checks all of that in
/proc/self/status and only then execs the forwarder (forward.py) in a fresh `-I -S` interpreter,
with an empty environment and no descriptor but those sockets. Any failure is one line on the
control socket. Stdlib only.
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys

FORWARD = ("import sys; sys.path.append(sys.argv[1]); "
           "from trajforge.sandbox.dns.forward import main; main(sys.argv[2:])")
SYSTEM = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/etc/ld.so.cache")  # the loader and libraries
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
_CAPABILITY_VERSION_3 = 0x20080522
_SO_MARK = getattr(socket, "SO_MARK", 36)
_SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
# Ahead of the samples for the CPU: it serves all of them, and what each can make it do is
# bounded by its rate (dns/fair.py), so on a busy host a sample's lookups wait for the forwarder's
# turn no longer than for their own, and no sample can make them wait longer by flooding.
NICE = -10
_RECEIVE_BUFFER = 4 << 20  # thousands of queries (a small datagram takes about 1 KiB of it)
_NEWNS = 0x20000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _sockets(listen: tuple[str, int], upstream: tuple[str, int], mark: int, count: int) -> list[socket.socket]:
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(listen)  # no SO_REUSEADDR: a port something else holds is an error, not a shared port
    udp.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, _RECEIVE_BUFFER)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(listen)
    tcp.listen(64)
    ups = []
    for _ in range(count):
        up = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        up.setsockopt(socket.SOL_SOCKET, _SO_MARK, mark)
        up.connect(upstream)
        ups.append(up)
    return [udp, tcp, *ups]


def confine_files(keep: list[str]) -> None:
    """A mount namespace of its own whose root is an empty read-only tmpfs holding only `keep`, each
    bound read-only at its own path (a symbolic link copied as one): nothing else of the host."""
    _check(_libc.unshare(_NEWNS), "unshare(mount)")
    _check(_libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "making / private")
    sources: list[tuple[str, str | None, int]] = []
    for path in keep:
        if any(path.startswith(kept.rstrip("/") + "/") for kept, _, _ in sources):
            continue  # inside one already bound
        if os.path.islink(path):
            sources.append((path, os.readlink(path), -1))
        elif os.path.exists(path):  # opened here (in this namespace): the tmpfs may hide the path
            sources.append((path, None, os.open(path, os.O_PATH | os.O_CLOEXEC)))
    _check(_libc.mount(b"tmpfs", b"/tmp", b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0755,size=64k"), "tmpfs")
    os.umask(0o022)
    for path, link, fd in sources:
        target = "/tmp" + path
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if link is not None:
            os.symlink(link, target)
            continue
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.mkdir(target)
        else:
            os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o444))
        _check(_libc.mount(f"/proc/self/fd/{fd}".encode(), target.encode(), None, _MS_BIND | _MS_REC, None),
               f"binding {path}")
        _check(_libc.mount(None, target.encode(), None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV,
                           None), f"making {path} read-only")
        os.close(fd)
    _check(_libc.mount(None, b"/tmp", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None), "read-only root")
    os.chroot("/tmp")  # no way back out once the capabilities are gone, and no descriptor leads there
    os.chdir("/")


def drop_privileges(uid: int, status_fd: int) -> None:
    """Become `uid` (and gid) with nothing else: no groups, no capability in any set, no_new_privs;
    checked in /proc/self/status (`status_fd`, opened while /proc was in view)."""
    libc = _libc
    for cap in range(64):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the kernel's last one: fine
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # clears the permitted and effective sets (no keep-caps)
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    _check(libc.capset(header, (ctypes.c_uint32 * 6)()), "capset")  # the inheritable set too
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    text = os.pread(status_fd, 1 << 16, 0).decode("ascii", "replace")
    status = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    ids = " ".join([str(uid)] * 4)
    wrong = [k for k, want in (("Uid", ids), ("Gid", ids), ("Groups", ""), ("NoNewPrivs", "1"),
                               *((c, "0" * 16) for c in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")))
             if " ".join(status.get(k, "?").split()) != want]
    if wrong:
        raise OSError(f"privileges left after the drop: {', '.join(f'{k}:{status.get(k)}' for k in wrong)}")


def main(argv: list[str]) -> None:
    """argv: source root, control fd, uid, listen address and port, upstream address and port,
    mark, number of upstream sockets."""
    src, control, uid, lip, lport, uip, uport, mark, count = argv
    try:
        status = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
        socks = _sockets((lip, int(lport)), (uip, int(uport)), int(mark), int(count))
        exe, prefix = os.path.realpath(sys._base_executable), os.path.realpath(sys.base_prefix)  # not a venv's
        src = os.path.realpath(src)
        if not exe.startswith(prefix + "/"):
            raise OSError(f"the interpreter {exe} is outside its prefix {prefix}")
        confine_files([*SYSTEM, prefix, src])
        os.setpriority(os.PRIO_PROCESS, 0, NICE)
        drop_privileges(int(uid), status)
        os.close(status)
        fds = [int(control), *(s.fileno() for s in socks)]
        for fd in fds:
            os.set_inheritable(fd, True)
        os.execve(exe, [exe, "-I", "-S", "-c", FORWARD, src, *map(str, fds)], {})
    except Exception as e:  # noqa: BLE001 (reported whole to the runner, which fails the start)
        os.write(int(control), f"error: {type(e).__name__}: {e}\n".encode(errors="replace"))
        os._exit(1)
