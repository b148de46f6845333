"""Root-mode bwrap slots, played by a hostile sample: a slot reused by the next sample holds
nothing of the one before, and the slot's warm helper (the sample's pid 1, which shares the
sample's uid while it runs) is out of the sample's reach."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from trajforge.sandbox.base import Sandbox
from trajforge.sandbox.bwrap import BwrapSandbox, root_runtime
from trajforge.sandbox.bwrap_backend import probe
from trajforge.sandbox.network import egress_support
from trajforge.sandbox.resources import SampleLimits, cgroup_parent
from trajforge.sandbox.seccomp import seccomp_program

STATUS = asyncio.run(probe())
pytestmark = pytest.mark.skipif(not STATUS.usable or STATUS.mode != "root",
                                reason=f"needs root-mode bwrap ({STATUS.detail})")
LIMITS = SampleLimits(memory=512 << 20 if cgroup_parent() else None, disk=256 << 20, tmp_size=64 << 20,
                      shm_size=32 << 20)
PORT = 47123

LEAVE_BEHIND = f"""
echo secret > /tmp/left; echo secret > /dev/shm/left; echo secret > ~/left; mkfifo /tmp/fifo
setsid nohup sleep 1000 > /dev/null 2>&1 &
setsid sh -c 'trap "" TERM HUP INT; while :; do sleep 1; done' > /dev/null 2>&1 &
setsid python3 -c '
import socket, time
tcp = socket.socket(); tcp.bind(("127.0.0.1", {PORT})); tcp.listen()
unix = socket.socket(socket.AF_UNIX); unix.bind("\\0trajforge-left"); unix.listen()
time.sleep(1000)' > /dev/null 2>&1 &
{'ipcmk -M 4096 > /dev/null' if shutil.which('ipcmk') else 'true'}
python3 -c '
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.mq_open.restype = ctypes.c_int
print("mq", libc.mq_open(b"/left-mq", os.O_CREAT | os.O_RDWR, 0o600, None) >= 0)'
# a user namespace of its own: root there, it mounts over /tmp and the workspace in its copy of the
# slot's mount namespace, and stays (it must die with the sample, its mounts with it). The slot's
# seccomp filter refuses it (test_a_sample_cannot_make_a_user_namespace); kept for a machine
# architecture that has no filter (sandbox/seccomp.py)
setsid unshare -Urm sh -c 'mount -t tmpfs none /tmp && echo secret > /tmp/tf-left-userns &&
  mount -t tmpfs none ~ && echo secret > ~/tf-left-userns && sleep 1234' > /dev/null 2>&1 &
n=0
for d in $(find / \\( -path /proc -o -path /sys \\) -prune -o -type d -writable -print 2>/dev/null); do
  echo secret > "$d/tf-left-$n" 2>/dev/null && n=$((n + 1))
done
echo "planted in $n directories"
sleep 0.5
# where the kernel lets a sample make a user namespace, the one above must be up, or it proves nothing
if unshare -Ur true 2> /dev/null; then pgrep -f "^sleep 1234$" > /dev/null && echo "userns up" || echo "userns DOWN"; fi
echo planted
"""

FIND_LEFTOVERS = f"""
ps -e -o pid=,comm= | grep -v -w -e ps -e sh -e bash -e grep -e init || true
ls -A /tmp /dev/shm /dev/mqueue ~
find / \\( -path /proc -o -path /sys \\) -prune -o -name 'tf-left-*' -print 2>/dev/null
echo "ipc=$(ipcs -m 2>/dev/null | grep -c 0x)"
python3 -c '
import socket
for family, addr in ((socket.AF_INET, ("127.0.0.1", {PORT})), (socket.AF_UNIX, "\\0trajforge-left")):
    s = socket.socket(family)
    try:
        s.connect(addr); print("REACHED", addr)
    except OSError as e:
        print("refused", e.errno)'
id -u
"""


def _sandbox(root: Path, runtime: object, mode: str) -> BwrapSandbox:
    return BwrapSandbox(root, network=False, egress=mode == "egress", sample_limits=LIMITS,
                        runtime=runtime)  # type: ignore[arg-type]


def test_a_reused_slot_holds_nothing_of_the_previous_sample(tmp_path: Path) -> None:
    async def main() -> None:
        mode = "egress" if (await egress_support("bwrap")).usable else "none"
        runtime = await root_runtime(None, mode, (), LIMITS)
        try:
            a = _sandbox(tmp_path, runtime, mode)
            await a.start()
            try:
                res = await a.exec(LEAVE_BEHIND, timeout=60)
                assert res.stdout.strip().endswith("planted") and "mq True" in res.stdout, res
                assert "userns DOWN" not in res.stdout, res.stdout
                # at least the workspace, /tmp and /dev/shm (/dev/mqueue holds queues only: mq_open above)
                assert int(res.stdout.split("planted in ")[1].split()[0]) >= 3, res.stdout
                uid_a, helper = a.uid, a.helper_pid
            finally:
                await a.close()
            b = _sandbox(tmp_path, runtime, mode)
            await b.start()
            try:
                assert b.helper_pid == helper  # the same slot: otherwise this test proves nothing
                res = await b.exec(FIND_LEFTOVERS, timeout=60)
            finally:
                await b.close()
            lines = res.stdout.splitlines()
            assert not [line for line in lines if "sleep" in line or "python3" in line], res.stdout  # no process
            assert "left" not in res.stdout and "fifo" not in res.stdout, res.stdout  # no file anywhere
            assert "REACHED" not in res.stdout and res.stdout.count("refused") == 2, res.stdout  # no listener
            assert "ipc=0" in lines or not shutil.which("ipcmk"), res.stdout  # no SysV segment
            assert int(lines[-1]) != uid_a  # a uid of its own
        finally:
            await runtime.aclose()

    asyncio.run(main())


def test_neighbouring_disks_in_one_image_cannot_reach_each_other(tmp_path: Path) -> None:
    """Two slots' disks are adjacent regions of one image file (loopdisk.Disks): a sample that fills
    its disk to the last block neither spills into its neighbour's region nor sees its files."""
    import hashlib

    from trajforge.sandbox.base import SandboxError

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


@pytest.mark.skipif(not shutil.which("ipcmk"), reason="needs ipcmk (util-linux)")
@pytest.mark.parametrize("plant", ["ipcmk -M 4096", "ipcmk -S 2", "ipcmk -Q", "echo x > /dev/mqueue/left"],
                         ids=["shm", "sem", "msg", "mqueue"])
def test_each_kind_of_ipc_object_is_gone_for_the_next_sample(tmp_path: Path, plant: str) -> None:
    """One object of one kind: the slot's check for a used IPC namespace must see each alone."""
    async def main() -> None:
        runtime = await root_runtime(None, "none", (), LIMITS)
        try:
            a = _sandbox(tmp_path, runtime, "none")
            await a.start()
            try:
                planted = await a.exec(f"{plant} > /dev/null && ipcs -a | grep -c 0x; ls /dev/mqueue | wc -l",
                                       timeout=30)
                assert sorted(planted.stdout.split()) == ["0", "1"], planted  # exactly the one object
                helper = a.helper_pid
            finally:
                await a.close()
            b = _sandbox(tmp_path, runtime, "none")
            await b.start()
            try:
                assert b.helper_pid == helper
                res = await b.exec("ipcs -a | grep -c 0x; ls /dev/mqueue | wc -l", timeout=30)
            finally:
                await b.close()
            assert res.stdout.split() == ["0", "0"], res
        finally:
            await runtime.aclose()

    asyncio.run(main())


HOSTILE_TO_PID_1 = """
for sig in KILL TERM INT HUP QUIT USR1 USR2 ALRM PIPE STOP CHLD; do kill -s $sig 1 2>/dev/null; done
for f in environ maps mem fd/0 root/etc/hostname; do
  if cat /proc/1/$f > /dev/null 2>&1; then echo "READ $f"; else echo "denied $f"; fi
done
python3 -c '
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print("ptrace", libc.ptrace(16, 1, 0, 0), ctypes.get_errno() != 0)  # PTRACE_ATTACH
try:
    os.open("/proc/1/mem", os.O_RDONLY); print("OPENED mem")
except OSError as e:
    print("mem", e.errno)'
prlimit --pid 1 --nofile=0:0 2>/dev/null && echo "LIMITED" || echo "prlimit refused"
echo done
"""


def test_the_slot_helper_is_out_of_the_sample_s_reach(tmp_path: Path) -> None:
    async def main() -> None:
        sb = BwrapSandbox(tmp_path, network=False, sample_limits=LIMITS)
        await sb.start()
        try:
            res = await sb.exec(HOSTILE_TO_PID_1, timeout=30)
            out = res.stdout
            assert "READ" not in out and "OPENED" not in out and "LIMITED" not in out, out
            assert "ptrace -1 True" in out and out.strip().endswith("done"), out
            # the helper survived all of it: commands and file operations still work
            assert (await sb.exec("echo alive", timeout=10)).stdout == "alive\n"
            await sb.write_file("still.txt", b"here")
            assert await sb.read_file("still.txt") == b"here"
            assert os.path.exists(f"/proc/{sb.helper_pid}")
        finally:
            await sb.close()

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


@pytest.mark.skipif(seccomp_program(os.uname().machine) is None, reason="no seccomp table for this machine")
def test_a_sample_cannot_make_a_user_namespace_or_use_keyrings(tmp_path: Path) -> None:
    async def main() -> None:
        sb = BwrapSandbox(tmp_path, network=False, sample_limits=LIMITS)
        await sb.start()
        try:
            out = (await sb.exec(USERNS, timeout=30)).stdout
        finally:
            await sb.close()
        # Set once on the zygote, inherited by the slot's helper (pid 1 here) and every command.
        for who in ("self", "init"):
            assert f"{who}-NoNewPrivs:\t1\n" in out and f"{who}-Seccomp:\t2\n" in out, out
            assert f"{who}-CapBnd:\t0000000000000000\n" in out, out
        assert "self-CapEff:\t0000000000000000\n" in out, out
        assert "unshare-cmd=0" not in out and "Operation not permitted" in out, out
        assert "unshare -1 1\n" in out and "clone -1 1\n" in out, out  # EPERM
        assert "unshare-x32 -1 " in out, out  # EPERM from the filter, or ENOSYS without x32
        assert "clone3 -1 38\n" in out, out  # ENOSYS: the C library falls back to clone
        if os.uname().machine == "x86_64":
            assert "add_key -1 1\n" in out and "keyctl -1 1\n" in out, out
        if os.uname().machine == "x86_64" and "unshare-i386" in out:  # (absent: no 32-bit entry here)
            assert "unshare-i386 -1\n" in out, out  # -EPERM
        assert "thread ok" in out and "spawned ok" in out and "forked 7" in out, out

    asyncio.run(main())


def test_a_slot_whose_sample_will_not_end_cleanly_is_destroyed(tmp_path: Path) -> None:
    """A helper that breaks mid-sample (here: killed from the host) costs its slot; the next
    sample gets a new one and works."""
    async def main() -> None:
        runtime = await root_runtime(None, "none", (), LIMITS)
        try:
            a = _sandbox(tmp_path, runtime, "none")
            await a.start()
            helper = a.helper_pid
            os.kill(helper, 9)
            await asyncio.sleep(0.2)
            with pytest.raises(Exception):
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
        assert not any(tmp_path.glob("slot-*")), list(tmp_path.iterdir())
        assert not any(tmp_path.glob(".slots.*")), list(tmp_path.iterdir())  # every disk, image and mount point gone

    asyncio.run(main())


def test_a_draining_run_keeps_idle_slots_only_for_sandboxes_still_to_be_made(tmp_path: Path) -> None:
    """Once no new sample will start, a slot whose sample ends is destroyed at once unless a
    sandbox not made yet may still take it, so the run's close has (almost) nothing left to do."""
    from trajforge.config import RunConfig
    from trajforge.sample.settings import sandbox_settings
    from trajforge.sandbox.factory import SandboxProvider

    def slot_dirs() -> set[str]:
        # with a disk limit, the slots' mount points are on the pool's tmpfs (loopdisk.Disks)
        return {p.name for p in (*tmp_path.glob("slot-*"), *tmp_path.glob(".slots.*/slot-*")) if p.is_dir()}

    async def main() -> None:
        async with SandboxProvider(sandbox_settings(RunConfig(sandbox="bwrap", sandbox_network="none"))) as p:
            async def create() -> Sandbox:
                return await p.create(cwd=None, image=None, root=tmp_path)

            async def no_runtime() -> None:
                raise AssertionError("the first sandbox starts the runtime")

            running = [p.lazy(create) for _ in range(4)]
            waiting = [p.lazy(create) for _ in range(2)]  # samples still in their first model call
            unused = p.lazy(create)  # a sample that will never call a tool
            for sb in running:  # a file in the workspace: they keep their slots (no parking)
                assert (await sb.exec("echo ok | tee kept", timeout=10)).stdout == "ok\n"
            helpers = {(await sb.real()).helper_pid for sb in running}  # type: ignore[attr-defined]
            pool = (await p.state("bwrap.runtime", no_runtime)).pool(tmp_path)
            assert len(helpers) == 4 and len(slot_dirs()) == 4 and p.waiting == 3
            await unused.close()
            p.drain()
            for sb in running:
                await sb.close()
            await pool.settle()
            assert len(slot_dirs()) == 2  # two kept for the two still to be made, two destroyed
            assert sum(_alive(pid) for pid in helpers) == 2
            for sb in waiting:
                assert (await sb.exec("echo again", timeout=10)).stdout == "again\n"
            assert {(await sb.real()).helper_pid for sb in waiting} <= helpers  # type: ignore[attr-defined]
            assert len(slot_dirs()) == 2  # reused, none made
            for sb in waiting:
                await sb.close()
            await pool.settle()
            assert slot_dirs() == set() and not any(_alive(pid) for pid in helpers)  # before the close
            retry = p.lazy(create)  # a retry after the drain still gets a sandbox
            assert (await retry.exec("echo retried", timeout=10)).stdout == "retried\n"
            await retry.close()
            await pool.settle()
            assert slot_dirs() == set()

    asyncio.run(main())


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_zygote_s_reply_encoder_says_what_the_helper_s_own_does() -> None:
    """Slot helpers reply through json's C encoder (set by zygote_main), a helper started alone
    through helper._enc: the runner must read the same message from either, odd strings included
    (lone surrogates from undecodable file names, control characters, quotes)."""
    import json

    from trajforge.sandbox.helper import _enc
    from trajforge.sandbox.zygote import reply_encoder

    fast = reply_encoder()
    meta = {"id": 3, "found": ["a\udcffb", "é\x00\x1f\"\\"], "more": True, "x": None, "raw": b"xy", "t": (1, 2),
            5: "k", "nested": {"sizes": [0, 1, 2]}}
    assert json.loads(fast(meta).encode("utf-8", "replace")) == json.loads(_enc(meta).encode("utf-8", "replace"))


def test_the_slot_s_own_proc_keeps_bwrap_s_read_only_parts(tmp_path: Path) -> None:
    """The slot's helper mounts a /proc of its pid namespace over the template's, whose /proc/sys,
    /proc/irq and /proc/bus bwrap had made read-only: the slot makes them read-only again (a layer
    beside the sample's lack of privilege, which alone refuses the writes)."""
    async def main() -> str:
        sb = BwrapSandbox(tmp_path, network=False, sample_limits=LIMITS)
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
