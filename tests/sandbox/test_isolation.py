"""Root-mode bwrap, played by a hostile sample: nothing that serves a sample holds a privilege or a
handle of the host, and no sample sees another's state, one after another or at the same time.

The invariant (the sandbox package's docstring): the helper and every command have real,
effective and saved uid and gid equal to the sample's, empty capability sets, no_new_privs, no
descriptor but their own; every sandbox is made for one sample and destroyed after it."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from pathlib import Path

from trajforge.catalog.sandboxes import NetworkMode
import pytest

from trajforge.sandbox.backends.bwrap.bwrap_sandbox import BwrapSandbox, root_runtime
from trajforge.sandbox.backends.bwrap.bwrap_backend import probe
from trajforge.sandbox.host.cgroups import hierarchies
from trajforge.sandbox.network import egress_support
from trajforge.sandbox.host.resources import ResourceLimits
from trajforge.sandbox.host.seccomp import sample_program

STATUS = asyncio.run(probe())
pytestmark = pytest.mark.skipif(not STATUS.usable or STATUS.mode != "root",
                                reason=f"needs root-mode bwrap ({STATUS.detail})")
LIMITS = ResourceLimits(memory=512 << 20 if hierarchies() else None, disk=256 << 20, tmp_size=64 << 20,
                      shm_size=32 << 20)
MODES = ["none", "egress"]


async def _mode(mode: str) -> str:
    if mode == "egress" and not (await egress_support("bwrap")).usable:
        pytest.skip("egress networking is not available here")
    return mode


def _sandbox(root: Path, runtime: object, mode: str, cwd: str | None = None) -> BwrapSandbox:
    network = NetworkMode.EGRESS if mode == "egress" else NetworkMode.NONE
    return BwrapSandbox(root, network=network, sample_limits=LIMITS, cwd=cwd,
                        runtime=runtime)  # type: ignore[arg-type]


def _fields(status: str) -> dict[str, str]:
    return {k: v.strip() for k, _, v in (line.partition(":") for line in status.splitlines()) if v}


def assert_unprivileged(status: str, uid: int) -> None:
    """/proc/<pid>/status of a process that serves or is a sample."""
    f = _fields(status)
    assert f["Uid"].split() == [str(uid)] * 4 and f["Gid"].split() == [str(uid)] * 4, f  # real, effective, saved, fs
    assert f.get("Groups", "") == "", f
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(f[cap], 16) == 0, (cap, f)
    assert f["NoNewPrivs"] == "1" and f["Seccomp"] == "2", f


def assert_own_descriptors(fds: dict[str, str]) -> None:
    """Only what a helper serves with: its channel and pipes, /dev/null. No namespace, no directory."""
    for fd, target in fds.items():
        assert target.startswith(("socket:[", "pipe:[", "anon_inode:")) or target == "/dev/null", (fd, target, fds)


@pytest.mark.parametrize("mode", MODES)
def test_the_helper_and_the_commands_hold_no_privilege_and_no_handle(tmp_path: Path, mode: str) -> None:
    async def main() -> None:
        m = await _mode(mode)
        sb = _sandbox(tmp_path, None, m, cwd="/app/sub")
        await sb.start()
        try:
            assert sb._channel is not None
            inside = await sb._channel.inspect()  # from inside the helper: /proc/self
            assert inside["sealed"] is True  # it loads no module any more (guard.py)
            assert_unprivileged(inside["status"], sb.uid)
            assert_own_descriptors(inside["fds"])
            with open(f"/proc/{sb.helper_pid}/status") as f:  # the same, seen from the host
                assert_unprivileged(f.read(), sb.uid)
            host_fds = {n: os.readlink(f"/proc/{sb.helper_pid}/fd/{n}") for n in os.listdir(f"/proc/{sb.helper_pid}/fd")}
            assert_own_descriptors(host_fds)
            job = await sb.spawn("exec sleep 300")
            res = await sb.exec("cat /proc/self/status; ls -l /proc/self/fd", timeout=30)
            assert_unprivileged(res.stdout, sb.uid)  # a command
            assert "ns:" not in res.stdout and "mnt:" not in res.stdout, res.stdout
            await job.kill()
        finally:
            await sb.close()

    asyncio.run(main())


# A hostile sample: root back through the saved uid, into a namespace by any descriptor it can
# reach, ptrace of every process it can see, its helper's memory, environment and descriptors.
HOSTILE = r"""
for sig in KILL TERM INT HUP QUIT USR1 USR2 ALRM PIPE STOP CHLD; do kill -s $sig 1 2>/dev/null; done
for f in environ maps mem fd/0 root/etc/hostname; do
  if cat /proc/1/$f > /dev/null 2>&1; then echo "READ $f"; else echo "denied $f"; fi
done
python3 - <<'PY'
import ctypes, glob, os
libc = ctypes.CDLL(None, use_errno=True)
for call, args in (("setresuid", (0, 0, 0)), ("setresgid", (0, 0, 0)), ("setuid", (0,)), ("seteuid", (0,))):
    r = getattr(libc, call)(*args)
    print(call, "ROOT" if r == 0 and os.geteuid() == 0 else "refused")
entered = 0
for path in glob.glob("/proc/*/fd/*") + glob.glob("/proc/*/ns/*") + glob.glob("/proc/*/task/*/ns/*"):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        continue
    if libc.setns(fd, 0) == 0:
        entered += 1
        print("ENTERED", path)
    os.close(fd)
print("setns entered", entered)
attached = 0
for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
    if pid == os.getpid():
        continue
    if libc.ptrace(16, pid, 0, 0) == 0:  # PTRACE_ATTACH
        attached += 1
        print("ATTACHED", pid, open(f"/proc/{pid}/comm").read().strip())
        os.waitpid(pid, 0x40000000)  # __WALL: it stops for its tracer first
        libc.ptrace(17, pid, 0, 0)  # PTRACE_DETACH
print("ptrace attached", attached)
try:
    os.open("/proc/1/mem", os.O_RDONLY); print("OPENED mem")
except OSError as e:
    print("mem", e.errno)
PY
echo done
"""


@pytest.mark.parametrize("mode", MODES)
def test_a_sample_cannot_regain_root_enter_a_namespace_or_trace_its_helper(tmp_path: Path, mode: str) -> None:
    async def main() -> None:
        m = await _mode(mode)
        sb = _sandbox(tmp_path, None, m)
        await sb.start()
        try:
            job = await sb.spawn("sleep 300")  # a process of its own it may trace: only that
            out = (await sb.exec(HOSTILE, timeout=60)).stdout
            assert "READ" not in out and "OPENED" not in out and "ROOT" not in out, out
            assert "ENTERED" not in out and "setns entered 0" in out, out
            attached = re.findall(r"ATTACHED \d+ (\S+)", out)
            assert "python3" not in attached and all(comm in ("sleep", "bash", "sh") for comm in attached), out
            assert out.strip().endswith("done"), out
            # the helper survived all of it
            assert (await sb.exec("echo alive", timeout=10)).stdout == "alive\n"
            await sb.write_file("still.txt", b"here")
            assert await sb.read_file("still.txt") == b"here"
            await job.kill()
        finally:
            await sb.close()

    asyncio.run(main())


PORT = 47123
LEAVE_BEHIND = f"""
echo secret > /tmp/left; echo secret > /dev/shm/left; echo secret > ~/left; mkfifo /tmp/fifo
for i in $(seq 100); do : > /tmp/f$i; done; stat -c 'tmp-inode %i' /tmp/f1
setsid nohup sleep 1000 > /dev/null 2>&1 &
setsid sh -c 'trap "" TERM HUP INT; while :; do sleep 1; done' > /dev/null 2>&1 &
python3 - <<'PY'
import socket
for _ in range(137):  # the UDP counters of /proc/net/snmp
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", 9))
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", {PORT})); srv.listen()
c = socket.socket(); c.connect(("127.0.0.1", {PORT})); a, _ = srv.accept(); c.close(); a.close()  # TIME_WAIT
PY
setsid python3 -c '
import socket, time
tcp = socket.socket(); tcp.bind(("127.0.0.1", {PORT + 1})); tcp.listen()
unix = socket.socket(socket.AF_UNIX); unix.bind("\\0trajforge-left"); unix.listen()
time.sleep(1000)' > /dev/null 2>&1 &
for i in $(seq 300); do /bin/true; done; echo "pid-after $(sh -c 'echo $$')"
{'ipcmk -M 4096 > /dev/null; ipcmk -S 2 > /dev/null; ipcmk -Q > /dev/null' if shutil.which('ipcmk') else 'true'}
echo x > /dev/mqueue/left-mq
n=0
for d in $(find / \\( -path /proc -o -path /sys \\) -prune -o -type d -writable -print 2>/dev/null); do
  echo secret > "$d/tf-left-$n" 2>/dev/null && n=$((n + 1))
done
echo "planted in $n directories"
echo planted
"""

FIND_LEFTOVERS = f"""
echo "first-pid $$"
ps -e -o pid=,comm= | grep -v -w -e ps -e sh -e bash -e grep -e init -e python3 || true
ls -A /tmp /dev/shm /dev/mqueue ~ /
find / \\( -path /proc -o -path /sys \\) -prune -o -name 'tf-left-*' -print 2>/dev/null
echo "ipc=$(ipcs -a 2>/dev/null | grep -c 0x)"
awk '/^Udp:/ {{n++}} /^Udp:/ && n == 2 {{print "udp-out", $5}}' /proc/net/snmp
awk 'NR > 1 {{print "tcp", $2, $3, $4}}' /proc/net/tcp
: > /tmp/mine; stat -c 'tmp-inode %i' /tmp/mine
python3 -c '
import socket
for family, addr in ((socket.AF_INET, ("127.0.0.1", {PORT + 1})), (socket.AF_UNIX, "\\0trajforge-left")):
    s = socket.socket(family)
    try:
        s.connect(addr); print("REACHED", addr)
    except OSError as e:
        print("refused", e.errno)'
id -u
"""


@pytest.mark.parametrize("mode", MODES)
def test_the_next_sample_finds_nothing_of_the_one_before(tmp_path: Path, mode: str) -> None:
    """Files, processes, listeners, IPC objects, UDP counters, TIME_WAIT sockets, pid numbers,
    /tmp inode numbers and the names of its cwd: a sample after another from the same pool finds
    none of them (the pool makes each sandbox for one sample)."""
    async def main() -> None:
        m = await _mode(mode)
        runtime = await root_runtime(None, m, (), LIMITS)
        try:
            a = _sandbox(tmp_path, runtime, m, cwd="/leftover-cwd-name/sub")
            await a.start()
            try:
                res = await a.exec(LEAVE_BEHIND, timeout=120)
                assert res.stdout.strip().endswith("planted"), res
                assert int(res.stdout.split("planted in ")[1].split()[0]) >= 3, res.stdout  # workspace, /tmp, /dev/shm
                first_inode = int(res.stdout.split("tmp-inode ")[1].split()[0])
                assert int(res.stdout.split("pid-after ")[1].split()[0]) > 300
                uid_a = a.uid
            finally:
                await a.close()
            b = _sandbox(tmp_path, runtime, m)
            await b.start()
            try:
                out = (await b.exec(FIND_LEFTOVERS, timeout=60)).stdout
            finally:
                await b.close()
        finally:
            await runtime.aclose()
        lines = out.splitlines()
        assert not [line for line in lines if "sleep" in line], out  # no process
        assert "left" not in out and "fifo" not in out and "f100" not in out, out  # no file anywhere
        assert "leftover-cwd-name" not in out, out  # not even the name of the other's cwd
        assert "REACHED" not in out and out.count("refused") == 2, out  # no listener
        assert "ipc=0" in lines or not shutil.which("ipcmk"), out
        assert "udp-out 0" in lines, out  # fresh counters
        assert not [line for line in lines if line.startswith("tcp")], out  # no socket, TIME_WAIT included
        assert int(out.split("first-pid ")[1].split()[0]) < 50, out  # its own pid numbers, from the start
        assert int(out.split("tmp-inode ")[1].split()[0]) <= first_inode, out  # its own /tmp inodes
        assert int(lines[-1]) != uid_a  # a uid of its own

    asyncio.run(main())


SIGNAL = """
python3 - <<'PY'
import socket
for _ in range({n}):
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", 9))
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", {port})); srv.listen()
c = socket.socket(); c.connect(("127.0.0.1", {port})); a, _ = srv.accept(); c.close(); a.close()
PY
: > /tmp/mark-{i}; echo $$ > /dev/shm/pid-{i}
"""
LISTEN = """
awk '/^Udp:/ {n++} /^Udp:/ && n == 2 {print "udp-out", $5}' /proc/net/snmp
awk 'NR > 1 {print "tcp", $2, $3}' /proc/net/tcp
ls -A / /tmp /dev/shm
"""


@pytest.mark.parametrize("mode", MODES)
def test_samples_running_at_once_see_nothing_of_each_other(tmp_path: Path, mode: str) -> None:
    """Six samples at once each signal through every channel the adversarial pass found (UDP
    counters, TIME_WAIT ports, cwd names, /tmp, pids), then each listens: each hears only itself."""
    async def main() -> None:
        m = await _mode(mode)
        runtime = await root_runtime(None, m, (), LIMITS)
        samples = [_sandbox(tmp_path, runtime, m, cwd=f"/chan-{i}") for i in range(6)]
        try:
            await asyncio.gather(*(sb.start() for sb in samples))
            await asyncio.gather(*(sb.exec(SIGNAL.format(n=10 * (i + 1), port=47200 + i, i=i), timeout=60)
                                   for i, sb in enumerate(samples)))
            heard = await asyncio.gather(*(sb.exec(LISTEN, timeout=60) for sb in samples))
        finally:
            await asyncio.gather(*(sb.close() for sb in samples), return_exceptions=True)
            await runtime.aclose()
        for i, res in enumerate(heard):
            out = res.stdout
            assert f"udp-out {10 * (i + 1)}\n" in out, (i, out)
            ports = {int(line.split()[2].split(":")[1], 16) for line in out.splitlines() if line.startswith("tcp ")}
            assert ports <= {47200 + i}, (i, ports)
            others = [j for j in range(6) if j != i]
            assert not any(f"chan-{j}" in out or f"mark-{j}" in out or f"pid-{j}" in out for j in others), (i, out)

    asyncio.run(main())


def test_a_broken_sandbox_is_destroyed_and_the_next_sample_gets_a_new_one(tmp_path: Path) -> None:
    async def main() -> None:
        runtime = await root_runtime(None, "none", (), LIMITS)
        try:
            a = _sandbox(tmp_path, runtime, "none")
            await a.start()
            helper = a.helper_pid
            os.kill(helper, 9)
            with pytest.raises(Exception):
                for _ in range(100):  # the channel breaks once the kernel has killed the namespace
                    await a.exec("true", timeout=5)
            await a.close()
            b = _sandbox(tmp_path, runtime, "none")
            await b.start()
            try:
                assert b.helper_pid != helper
                assert (await b.exec("echo ok", timeout=10)).stdout == "ok\n"
            finally:
                await b.close()
        finally:
            await runtime.aclose()
        assert not any(tmp_path.glob("sb-*")), list(tmp_path.iterdir())
        assert not any(tmp_path.glob(".slots.*")), list(tmp_path.iterdir())  # every disk, image and mount point gone

    asyncio.run(main())


def test_the_pool_makes_sandboxes_ahead_for_the_demand_and_trims_when_the_run_drains(tmp_path: Path) -> None:
    """Samples waiting for their first tool call are the demand: the pool has that many made
    before they ask; once no new sample will start, ready ones beyond the demand go, and the
    run's close has nothing left to do."""
    from trajforge.config import RunConfig
    from trajforge.sandbox.interface import Sandbox
    from trajforge.sandbox.factory import SandboxProvider

    def made() -> set[str]:  # with a disk limit, the mount points are on the pool's tmpfs (loopdisk.Disks)
        return {p.name for p in tmp_path.glob(".slots.*/sb-*") if p.is_dir()}

    async def main() -> None:
        async with SandboxProvider(RunConfig(sandbox="bwrap", sandbox_network="none").sandbox_settings()) as p:
            async def create() -> Sandbox:
                return await p.create(cwd=None, image=None, root=tmp_path)

            async def no_runtime() -> None:
                raise AssertionError("the first sample starts the runtime")

            lazies = [p.lazy(create, root=tmp_path) for _ in range(5)]
            await p._prepared[("", tmp_path)]  # the runtime is up: its pool makes five, unasked
            pool = (await p.state("bwrap.runtime", no_runtime)).pool(tmp_path)
            while pool._making or len(pool._ready) < 5:
                await asyncio.wait(pool._tasks, return_when=asyncio.FIRST_COMPLETED)
            assert len(made()) == 5 and p.waiting == 5
            first = {sb.pid for sb in pool._ready}
            used = lazies[:2]
            for sb in used:
                assert (await sb.exec("echo ok", timeout=10)).stdout == "ok\n"
            assert {(await sb.real()).helper_pid for sb in used} <= first  # type: ignore[attr-defined]
            await lazies[2].close()  # a sample that never called a tool
            p.drain()
            await pool.settle()
            assert len(pool._ready) == 2 and p.waiting == 2  # two still wanted: the other ready one went
            for sb in used:
                await sb.close()
            await pool.settle()
            assert len(made()) == 2
            for sb in lazies[3:]:
                assert (await sb.exec("echo again", timeout=10)).stdout == "again\n"
                await sb.close()
            await pool.settle()
            assert made() == set() and not pool._ready  # before the close
            retry = p.lazy(create, root=tmp_path)  # a retry after the drain still gets a sandbox
            assert (await retry.exec("echo retried", timeout=10)).stdout == "retried\n"
            await retry.close()
            await pool.settle()
            assert made() == set()

    asyncio.run(main())


def test_the_sandbox_s_own_proc_keeps_bwrap_s_read_only_parts(tmp_path: Path) -> None:
    """The sandbox mounts a /proc of its pid namespace over the template's, whose /proc/sys,
    /proc/irq and /proc/bus bwrap had made read-only: they are read-only again (a layer beside
    the sample's lack of privilege, which alone refuses the writes)."""
    async def main() -> str:
        sb = BwrapSandbox(tmp_path, network=NetworkMode.NONE, sample_limits=LIMITS)
        await sb.start()
        try:
            return (await sb.exec("cat /proc/self/mounts; echo 1 > /proc/sys/kernel/ns_last_pid; echo rc=$?",
                                  timeout=30)).stdout
        finally:
            await sb.close()

    out = asyncio.run(main())
    visible: dict[str, str] = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1].startswith("/proc"):
            visible[fields[1]] = fields[3]  # the last mount on a path is the one seen
    assert visible["/proc"].startswith("rw,"), visible
    for path in ("/proc/sys", "/proc/irq", "/proc/bus"):
        if path in visible or os.path.exists(path):
            assert visible[path].startswith("ro,"), (path, visible)
    assert "rc=0" not in out, out


def test_the_zygote_s_reply_encoder_says_what_the_helper_s_own_does() -> None:
    """Sandbox helpers reply through json's C encoder (set by zygote_main), a helper started alone
    through helper._enc: the runner must read the same message from either, odd strings included
    (lone surrogates from undecodable file names, control characters, quotes)."""
    import json

    from trajforge.sandbox.inside.helper import _enc
    from trajforge.sandbox.host.zygote import reply_encoder

    fast = reply_encoder()
    meta = {"id": 3, "found": ["a\udcffb", "é\x00\x1f\"\\"], "more": True, "x": None, "raw": b"xy", "t": (1, 2),
            5: "k", "nested": {"sizes": [0, 1, 2]}}
    assert json.loads(fast(meta).encode("utf-8", "replace")) == json.loads(_enc(meta).encode("utf-8", "replace"))


def test_neighbouring_disks_in_one_image_cannot_reach_each_other(tmp_path: Path) -> None:
    """Two sandboxes' disks are adjacent regions of one image file (loopdisk.Disks): a sample that fills
    its disk to the last block neither spills into its neighbour's region nor sees its files."""
    import hashlib

    from trajforge.sandbox.interface import SandboxError

    plant = "head -c 1048576 /dev/urandom > mine; df -B1 --output=size . | tail -1; ls -A"

    async def main() -> None:
        runtime = await root_runtime(None, "none", (), LIMITS)
        try:
            a, b = _sandbox(tmp_path, runtime, "none"), _sandbox(tmp_path, runtime, "none")
            await a.start()
            await b.start()
            try:
                assert a.workspace.parent.parent.parent == b.workspace.parent.parent.parent  # one pool's disks
                images = list(tmp_path.glob(f".slots.trajforge-{os.getpid()}-*.img"))
                assert len(images) == 1 and images[0].stat().st_size == 2 * LIMITS.disk, images  # side by side
                for sb in (a, b):
                    out = (await sb.exec(plant, timeout=60)).stdout.split()
                    assert int(out[0]) <= LIMITS.disk and out[1:] == ["mine"], out  # its own disk, its own file
                before = {sb: hashlib.sha256((sb.workspace / "mine").read_bytes()).digest() for sb in (a, b)}
                for sb in (a, b):  # each fills its disk to the last block, in turn
                    with pytest.raises(SandboxError, match="workspace disk limit"):
                        await sb.exec("dd if=/dev/zero of=big bs=1M; dd if=/dev/urandom of=big2 bs=4k", timeout=120)
                    assert sorted(p.name for p in sb.workspace.iterdir()) == ["big", "big2", "mine"]
                for sb in (a, b):  # every byte of each sample's own file as it wrote it
                    assert hashlib.sha256((sb.workspace / "mine").read_bytes()).digest() == before[sb]
                    st = os.statvfs(sb.workspace)
                    assert st.f_bavail * st.f_frsize < 1 << 20
            finally:
                await a.close()
                await b.close()
        finally:
            await runtime.aclose()
        assert not list(tmp_path.glob("*.img"))

    asyncio.run(main())


# A hostile sample trying every way into a user namespace of its own (root there: mounts, network
# devices, root-only kernel code), then what ordinary programs do with the same calls.
USERNS = r"""
grep -E '^(NoNewPrivs|Seccomp|CapBnd|CapEff):' /proc/self/status | sed 's/^/self-/'
grep -E '^(NoNewPrivs|Seccomp|CapBnd):' /proc/1/status | sed 's/^/init-/'
unshare -Ur id -u 2>&1; echo "unshare-cmd=$?"
python3 - <<'PY'
import ctypes, mmap, os, subprocess, sys, threading
sys.stdout.reconfigure(line_buffering=True)  # nothing buffered is printed again by a forked child
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def result(r):
    return f"{r} {ctypes.get_errno()}" if r < 0 else f"{r} ok"
print("unshare", result(libc.unshare(0x10000000)))
print("unshare-x32", result(libc.syscall(0x40000000 | 272, 0x10000000)))
r = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)  # clone(CLONE_NEWUSER | SIGCHLD): a child if allowed
if r == 0:
    os._exit(0)
print("clone", result(r))
print("clone3", result(libc.syscall(435, 0, 0)))
if os.uname().machine == "x86_64":  # kernel keyrings: add_key into the uid's keyring, a new session one
    print("add_key", result(libc.syscall(248, b"user", b"left", b"secret", 6, -4)))
    print("keyctl", result(libc.syscall(250, 1, 0)))
# the 32-bit entry (int 0x80) of x86_64, with i386 numbers: push rbx; eax=310 (unshare); ebx=flags
code = bytes.fromhex("53b836010000bb00000010cd805bc3")
if os.uname().machine == "x86_64":
    pid = os.fork()
    if pid == 0:
        m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        m.write(code)
        fn = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
        print("unshare-i386", fn(), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
t = threading.Thread(target=lambda: print("thread ok")); t.start(); t.join()
print(subprocess.run(["echo", "spawned ok"], capture_output=True, text=True).stdout.strip())
pid = os.fork()
if pid == 0:
    os._exit(7)
print("forked", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
PY
"""


@pytest.mark.skipif(sample_program(os.uname().machine) is None, reason="no seccomp table for this machine")
def test_a_sample_cannot_make_a_user_namespace_or_use_keyrings(tmp_path: Path) -> None:
    async def main() -> None:
        sb = BwrapSandbox(tmp_path, network=NetworkMode.NONE, sample_limits=LIMITS)
        await sb.start()
        try:
            out = (await sb.exec(USERNS, timeout=30)).stdout
        finally:
            await sb.close()
        # Set once on the zygote, inherited by the sandbox's helper (pid 1 here) and every command.
        for who in ("self", "init"):
            assert f"{who}-NoNewPrivs:\t1\n" in out and f"{who}-Seccomp:\t2\n" in out, out
            assert f"{who}-CapBnd:\t0000000000000000\n" in out, out
        assert "self-CapEff:\t0000000000000000\n" in out, out
        assert "unshare-cmd=0" not in out and "Operation not permitted" in out, out
        assert "unshare -1 1\n" in out and "clone -1 1\n" in out, out  # EPERM
        assert "unshare-x32 -1 38\n" in out, out  # ENOSYS: the sample's filter refuses x32 whole
        assert "clone3 -1 38\n" in out, out  # ENOSYS: the C library falls back to clone
        if os.uname().machine == "x86_64":
            assert "add_key -1 1\n" in out and "keyctl -1 1\n" in out, out
        if os.uname().machine == "x86_64" and "unshare-i386" in out:  # (absent: no 32-bit entry here)
            assert "unshare-i386 -38\n" in out, out  # -ENOSYS: the 32-bit entry refused whole
        assert "thread ok" in out and "spawned ok" in out and "forked 7" in out, out

    asyncio.run(main())
