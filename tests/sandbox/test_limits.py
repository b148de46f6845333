"""Per-sample resource limits for real: a memory bomb, a /tmp fill, a /dev/shm fill and a workspace
disk fill each end their own sample as a `sandbox` failure naming the limit, while the other
samples of the same run finish, and the host keeps no more than the limits."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from trajforge.catalog.sandboxes import NetworkMode
import pytest

from tests.conftest import cli
from tests.support.policies import prompt_command_policy
from tests.support.scripted_server import ScriptedServer
from tests.support.run_state import read_records
from trajforge.config import RunConfig
from trajforge.fields import size_bytes
from trajforge.sandbox.backends.bwrap.bwrap_sandbox import BwrapSandbox
from trajforge.sandbox.backends.bwrap.bwrap_backend import probe
from trajforge.sandbox.factory import limits_for
from trajforge.sandbox.host.disk import disk_usable
from trajforge.sandbox.host.cgroups import hierarchies
from trajforge.sandbox.host.resources import ResourceLimits

STATUS = asyncio.run(probe())
ROOT_BWRAP = STATUS.usable and STATUS.mode == "root"
needs_limits = pytest.mark.skipif(not ROOT_BWRAP or hierarchies() is None or disk_usable() is not None,
                                  reason=f"needs root bwrap, a memory cgroup and loop devices ({STATUS.detail}, "
                                         f"disk: {disk_usable()})")

BOMBS = {
    "memory": "python3 -c 'b=[]\nwhile True: b.append(bytearray(8 << 20))'",
    "tmp": "head -c 64M /dev/zero > /tmp/fill; echo wrote=$?",
    "shm": "head -c 64M /dev/zero > /dev/shm/fill; echo wrote=$?",
    "disk": "for i in 1 2 3 4 5 6; do head -c 20M /dev/zero > f$i || break; done; echo wrote=$?",
}
MESSAGES = {"memory": "memory limit of 160 MiB (sandbox_memory)", "tmp": "filled /tmp (16 MiB, sandbox_tmp_size)",
            "shm": "filled /dev/shm (8 MiB, sandbox_shm_size)", "disk": "workspace disk limit of 64 MiB (sandbox_disk)"}


def test_sizes_and_defaults_map_to_limits() -> None:
    assert size_bytes("4g") == 4 << 30 and size_bytes("256m") == 256 << 20 and size_bytes("1024") == 1024
    cfg = RunConfig().sandbox_settings()
    lim = cfg.limits
    assert (lim.memory, lim.tmp_size, lim.shm_size, lim.disk, lim.cpu_seconds) == (
        4 << 30, 1 << 30, 256 << 20, 10 << 30, 600)
    assert limits_for(cfg, memory_cgroup=True).address_space_bytes is None  # the cgroup holds the sample
    assert limits_for(cfg).address_space_bytes == 4 << 30  # no cgroup: an address-space limit instead
    assert limits_for(cfg).cpu_seconds == 600
    with pytest.raises(ValueError):
        RunConfig(sandbox_disk="lots")


@needs_limits
def test_each_limit_ends_only_its_own_sample(tmp_path: Path, clean_env: dict[str, str]) -> None:
    prompts = [*BOMBS.values(), "echo survivor-1", "echo survivor-2"]
    (tmp_path / "ds.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    (tmp_path / "cfg.yaml").write_text("sandbox_memory: 160m\nsandbox_tmp_size: 16m\nsandbox_shm_size: 8m\n"
                                       "sandbox_disk: 64m\ntask_types: {}\n")
    ws = tmp_path / "data" / "lim" / "workspaces"
    with ScriptedServer() as server:
        server.handler = prompt_command_policy
        proc = subprocess.run(
            cli("run", "--dataset_file=ds.jsonl", "--batch_size=10", "--run_name=lim", f"--base_url={server.url}",
                "--model=scripted", "--distribution=terminal_only", "--sandbox=bwrap", "--config=cfg.yaml",
                "--num_workers=6", "--tool_timeout=60"),
            cwd=tmp_path, env=clean_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3 and "4 of 6 sample(s) failed (sandbox 4)" in proc.stderr, proc.stderr  # failed samples: exit 3
    records = read_records(tmp_path / "data" / "lim")
    finished = {prompts[r["prompt_index"]] for r in records}
    assert finished == {"echo survivor-1", "echo survivor-2"}, proc.stderr
    for kind, message in MESSAGES.items():
        failed = [line for line in proc.stderr.splitlines() if "failed (sandbox)" in line and message in line]
        assert failed, (kind, proc.stderr)
    assert not ws.exists() or not any(ws.iterdir())
    mounts = Path("/proc/self/mounts").read_text()
    assert str(tmp_path) not in mounts  # every workspace disk was unmounted


@needs_limits
def test_disk_image_is_sparse_and_removed(tmp_path: Path) -> None:
    async def main() -> None:
        sb = BwrapSandbox(tmp_path, network=NetworkMode.NONE, sample_limits=ResourceLimits(disk=256 << 20, memory=None))
        await sb.start()
        try:
            # the slot's disk, mounted on a directory of the pool's tmpfs (loopdisk.Disks), in the
            # first region of the pool's first image; workspaces are made in its loopdisk.WORKSPACES
            point = sb.workspace.parent.parent
            assert point.parent.name == f".slots.trajforge-{os.getpid()}" and point.parent.parent == tmp_path
            image = tmp_path / f".slots.trajforge-{os.getpid()}-0.img"
            assert image.stat().st_size == 256 << 20 and image.stat().st_blocks * 512 < 32 << 20
            mounts = Path("/proc/self/mounts").read_text()
            assert f" {point.parent} tmpfs " in mounts and f" {point} ext4 " in mounts
            res = await sb.exec("df -B1 --output=size . | tail -1; ls -A", timeout=30)
            assert int(res.stdout.split()[0]) <= 256 << 20 and "lost+found" not in res.stdout
            await sb.write_file("note.txt", b"x")  # the file tools write into the mounted disk
            assert (await sb.exec("cat note.txt", timeout=30)).stdout == "x"
        finally:
            await sb.close()
        assert not image.exists() and not sb.workspace.exists() and not point.parent.exists()
        assert not list(tmp_path.glob("*.img")) and str(tmp_path) not in Path("/proc/self/mounts").read_text()

    asyncio.run(main())


@needs_limits
def test_kept_workspace_survives_the_unmount(tmp_path: Path) -> None:
    async def main() -> Path:
        sb = BwrapSandbox(tmp_path, network=NetworkMode.NONE, keep=True, sample_limits=ResourceLimits(disk=64 << 20, memory=None))
        await sb.start()
        await sb.exec("mkdir -p d && echo kept > d/file", timeout=30)
        await sb.close()
        return sb.workspace

    ws = asyncio.run(main())
    assert (ws / "d" / "file").read_text() == "kept\n"
    assert str(ws) not in Path("/proc/self/mounts").read_text()
    shutil.rmtree(ws)


@pytest.mark.skipif(not ROOT_BWRAP or hierarchies() is None, reason="needs root bwrap and a memory cgroup")
def test_cpu_time_per_command_is_limited(tmp_path: Path) -> None:
    async def main() -> None:
        from trajforge.sandbox.process import Limits

        sb = BwrapSandbox(tmp_path, network=NetworkMode.NONE, limits=Limits(cpu_seconds=1),
                          sample_limits=ResourceLimits(memory=None, disk=None))
        await sb.start()
        try:
            res = await sb.exec("python3 -c 'while True: pass'; echo rc=$?", timeout=60)
            assert "rc=137" in res.stdout or "rc=152" in res.stdout, res  # SIGXCPU, or SIGKILL at the hard limit
        finally:
            await sb.close()

    asyncio.run(main())
    assert os.path.exists(tmp_path)


def _cpu_seconds(procs_files: list[str]) -> float:
    """The CPU time the processes of a cgroup have used so far (utime + stime from /proc)."""
    pids = {int(x) for f in procs_files for x in Path(f).read_text().split()}
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone since
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not ROOT_BWRAP or hierarchies() is None or not hierarchies().has("cpu"),  # type: ignore[union-attr]
                    reason="needs root bwrap and a cpu cgroup")
def test_sixteen_busy_loops_in_a_sample_get_no_more_than_its_cpus(tmp_path: Path) -> None:
    """A sample may keep `sandbox_cpus` CPUs busy (1 by default), however many loops it starts: over
    a second of the host doing nothing, its processes use at most that many CPUs' worth of it.
    The interval is a measurement, not a wait for an event: the bound holds for any length, and
    other load can only lower the sample's share, never raise it. Without the quota, 16 loops on
    this machine's 2 idle cores take ~2 CPUs, well over the bound (the host staying busy instead
    would not tell: the group's fair share alone holds it near 1 against one host job)."""
    async def main() -> tuple[float, float, str, float | None]:
        sb = BwrapSandbox(tmp_path, network=NetworkMode.NONE, sample_limits=ResourceLimits(memory=None, disk=None, cpus=1.0))
        await sb.start()
        try:
            res = await sb.exec("for i in $(seq 16); do (while :; do :; done) > /dev/null 2>&1 & done; echo spawned",
                                timeout=30)
            assert res.stdout.startswith("spawned"), res  # the loops run in the background from here on
            assert sb.cgroup is not None
            before = _cpu_seconds(sb.cgroup.procs)
            window = time.monotonic()
            await asyncio.sleep(1.0)
            window = time.monotonic() - window
            used = _cpu_seconds(sb.cgroup.procs) - before
            procs = (await sb.exec("ps -e -o comm= | grep -c bash", timeout=30)).stdout
            quota = sb.cgroup.cpu_quota()
        finally:
            await sb.close()
        return window, used, procs, quota

    window, used, procs, quota = asyncio.run(main())
    assert int(procs) >= 16, procs  # the loops were running while the host measured
    # One CFS period (0.1 s) of both cores beyond the quota, and the clock ticks' rounding.
    assert used <= 1.0 * window + 0.4, (window, used)
    assert quota == 1.0


@pytest.mark.skipif(not ROOT_BWRAP or hierarchies() is None or not hierarchies().has("cpu"),  # type: ignore[union-attr]
                    reason="needs root bwrap and a cpu cgroup")
def test_without_the_cpu_quota_the_busy_loops_are_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation check: the test above fails when the sample's group gets no CPU quota (by the
    CPU it used on an idle machine, and by the quota it reads back in any case)."""
    from trajforge.sandbox.host.cgroups import SampleGroup

    real = SampleGroup._settings
    monkeypatch.setattr(SampleGroup, "_settings", lambda self: [s for s in real(self) if s[0] != "cpu"])
    with pytest.raises(AssertionError):
        test_sixteen_busy_loops_in_a_sample_get_no_more_than_its_cpus(tmp_path)


@needs_limits
def test_a_killed_runner_s_disk_cgroup_and_workspace_root_are_swept(tmp_path: Path, clean_env: dict[str, str],
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import signal
    import sys
    import tempfile
    import textwrap

    from trajforge.sandbox.host import resources

    temp = tmp_path / "temp"  # the runner's temporary directory, where its workspace root goes
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where this process's sweep looks

    script = textwrap.dedent("""
        import asyncio, sys
        from pathlib import Path
        from trajforge.catalog.sandboxes import NetworkMode
        from trajforge.sandbox.backends.bwrap.bwrap_sandbox import BwrapSandbox
        from trajforge.sandbox.host.resources import ResourceLimits
        from trajforge.sandbox.workspace import RunRoot
        async def main():
            root = RunRoot()  # in TMPDIR, named with this process's pid
            sb = BwrapSandbox(Path(root.name), network=NetworkMode.NONE,
                              sample_limits=ResourceLimits(disk=64 << 20, memory=64 << 20))
            await sb.start()
            print(sb.workspace.parent.parent, sb.cgroup.path, flush=True)  # the disk: .slots.trajforge-<pid>/sb-N, workspaces in sb-N/w
            await asyncio.sleep(60)
        asyncio.run(main())
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], env={**clean_env, "TMPDIR": str(temp)},
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    ws, group = map(Path, proc.stdout.readline().split())
    [root] = temp.iterdir()
    assert root.name.startswith(f"trajforge-ws-{proc.pid}-") and ws.is_relative_to(root)
    assert ws.exists() and group.exists() and str(ws) in Path("/proc/self/mounts").read_text()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    resources._swept = False  # the sweep runs once per process; this process has not swept the new leftovers
    with caplog.at_level(logging.WARNING, logger="trajforge.sandbox"):
        gone = asyncio.run(resources.sweep_leftovers())
    [line] = [r.getMessage() for r in caplog.records if r.name == "trajforge.sandbox"]  # one line says what went
    assert f"removed {len(gone)} leftover(s) of a killed trajforge run" in line and gone[0] in line
    assert str(ws) in gone and str(ws) not in Path("/proc/self/mounts").read_text()
    assert str(root) in gone and not root.exists()  # the workspace root with its images and mount points' tmpfs
    assert str(tmp_path) not in Path("/proc/self/mounts").read_text()
    for _ in range(100):  # the killed holder's processes leave the cgroup as the kernel reaps them
        if not group.exists():
            break
        resources._swept = False
        asyncio.run(resources.sweep_leftovers())
        import time

        time.sleep(0.05)
    assert not group.exists()


def test_the_root_sweep_removes_only_dead_runners_roots_and_never_follows_what_a_sample_left(tmp_path: Path) -> None:
    """What a killed sample left in its workspace is hostile: a link to a host directory, a FIFO,
    a directory it made read-only. The sweep removes the tree without following or opening any."""
    import fcntl
    import sys

    from trajforge.sandbox.workspace import sweep_roots

    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout.strip()
    host = tmp_path / "host"
    host.mkdir()
    (host / "precious").write_text("keep")
    temp = tmp_path / "temp"
    dead = temp / f"trajforge-ws-{dead_pid}-abc"
    sample = dead / "sample-1"
    (sample / "ro").mkdir(parents=True)
    (sample / "ro" / "f").write_text("x")
    (sample / "link").symlink_to(host)
    (sample / "file-link").symlink_to(host / "precious")
    os.mkfifo(sample / "fifo")
    os.chmod(sample / "ro", 0o500)
    live = temp / "trajforge-ws-1-abc"  # pid 1 is alive
    older = temp / "trajforge-ws-abcdefgh"  # a root without a pid (an older version's): not ours to judge
    someone_else = temp / f"trajforge-ws-{dead_pid}-other"  # another user's directory of that name
    locked = temp / f"trajforge-ws-{dead_pid}-locked"  # a live runner's whose pid means nothing here
    for keep in (live, older, someone_else, locked):
        (keep / "sample-1").mkdir(parents=True)
    lock = os.open(locked, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(lock, fcntl.LOCK_EX)
    if os.geteuid() == 0:
        os.chown(someone_else, 1000, -1)
    else:
        someone_else = live
    try:
        assert sweep_roots(str(temp)) == [str(dead)]
        assert not dead.exists() and live.exists() and older.exists() and someone_else.exists() and locked.exists()
    finally:
        os.close(lock)  # the runner is gone: the lock goes with it
    assert sweep_roots(str(temp)) == [str(locked)]
    assert (host / "precious").read_text() == "keep"
    if os.geteuid() == 0:  # a dead root with a filesystem mounted beneath it is not emptied through it
        (sample / "ro").mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "none", str(sample / "ro")], check=True)
        try:
            (sample / "ro" / "inside").write_text("mounted")
            assert sweep_roots(str(temp)) == []
            assert (sample / "ro" / "inside").exists()
        finally:
            subprocess.run(["umount", str(sample / "ro")], check=True)
        assert sweep_roots(str(temp)) == [str(dead)]


@pytest.mark.skipif(not ROOT_BWRAP or hierarchies() is None, reason="needs root bwrap and a memory cgroup")
def test_helper_commands_and_background_jobs_are_all_in_the_sample_memory_cgroup(tmp_path: Path) -> None:
    """The sandbox's first process is forked by the run's zygote, not by bwrap: it must join the
    sandbox's group itself, or nothing a sample runs would be held by its memory limit."""
    async def main() -> None:
        sb = BwrapSandbox(tmp_path, network=NetworkMode.NONE, sample_limits=ResourceLimits(memory=256 << 20, disk=None))
        await sb.start()
        try:
            assert sb.cgroup is not None
            group = sb.cgroup.path
            job = await sb.spawn("exec sleep 300")
            res = await sb.exec("cat /proc/self/cgroup", timeout=30)
            # a foreground command: at the root of its cgroup namespace, which is the sandbox's group
            assert ":memory:/\n" in res.stdout and group.name not in res.stdout, res
            for _ in range(100):  # the job's shell execs `sleep` on its own time
                members = (group / "cgroup.procs").read_text().split()
                cmdlines = [_cmdline(pid) for pid in members]
                if any(c.startswith(b"sleep\x00300") for c in cmdlines):
                    break
                await asyncio.sleep(0.05)
            assert str(sb.helper_pid) in members
            assert any(c.startswith(b"sleep\x00300") for c in cmdlines), cmdlines  # the background job
            assert any(c.startswith(b"sandbox-init") for c in cmdlines), cmdlines  # the helper itself
            await job.kill()
        finally:
            await sb.close()
        assert not group.exists()

    asyncio.run(main())


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@needs_limits
def test_disks_mounted_at_once_get_regions_of_their_own(tmp_path: Path) -> None:
    """A pool mounts its slots' disks from several threads at once (loopdisk.Disks): each gets a
    region no other disk has, a filesystem of its own size, and nothing is left after close."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from trajforge.sandbox.host import loopdisk

    disks = loopdisk.Disks(tmp_path, 32 << 20)
    disks.per_file = 5  # a new image file every 5 regions: 24 disks need 5 files
    disks.create()
    try:
        start = threading.Barrier(8)

        def mount(i: int) -> tuple[Path, loopdisk.Region]:
            if i < 8:
                start.wait()
            point, region = disks.mount(f"slot-{i}")
            (point / loopdisk.WORKSPACES / "id").write_text(str(i))
            return point, region

        with ThreadPoolExecutor(8) as pool:
            mounted = list(pool.map(mount, range(24)))
        assert len({(r.image, r.offset) for _, r in mounted}) == 24
        assert len({r.image for _, r in mounted}) == 5
        for i, (point, _) in enumerate(mounted):
            assert (point / loopdisk.WORKSPACES / "id").read_text() == str(i)  # no two share a filesystem
            st = os.statvfs(point)
            assert st.f_blocks * st.f_frsize <= 32 << 20
        first = [(p, r) for p, r in mounted if r.number == 0]
        for point, region in first:  # the first file's regions all released: the file goes
            assert region.image.exists()
            disks.unmount(point, region)
        assert not first[0][1].image.exists() and len(list(tmp_path.glob("*.img"))) == 5  # 4 + the template
        for point, region in mounted:
            if region.number:
                disks.unmount(point, region)
    finally:
        disks.close()
    assert not list(tmp_path.iterdir()) and str(tmp_path) not in Path("/proc/self/mounts").read_text()


def test_oom_kill_count_reads_either_cgroup_version() -> None:
    from trajforge.sandbox.host.cgroups import oom_kill_count

    assert oom_kill_count(b"oom_kill_disable 0\nunder_oom 0\noom_kill 3\n") == 3  # v1 memory.oom_control
    assert oom_kill_count(b"low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 1\n") == 2  # v2 memory.events
    assert oom_kill_count(b"oom_kill_disable 0\nunder_oom 0\n") == 0


def test_a_tree_thousands_of_levels_deep_is_removed_without_following_anything(tmp_path: Path) -> None:
    """A sample's `for i in range(3000): mkdir d; cd d` (with read-only levels, links out and a
    FIFO on the way down) is removed whole: shutil.rmtree's RecursionError at ~1,000 levels left
    the slot, its disk and the workspace root behind, and the next run's sweep failed on it."""
    from trajforge.sandbox.workspace import _remove_tree

    host = tmp_path / "host"
    host.mkdir()
    (host / "precious").write_text("keep")
    root = tmp_path / "ws"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for i in range(3000):  # deeper than PATH_MAX allows by name: walk down by descriptor
        os.mkdir("d", dir_fd=fd)
        if i % 500 == 0:
            os.symlink(str(host), "out", dir_fd=fd)
            os.mkfifo("fifo", dir_fd=fd)
            os.mkdir(".trajforge-deep-1", dir_fd=fd)  # the name the removal moves deep trees to
        sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        if i % 700 == 0:
            os.fchmod(fd, 0o500)  # a level the sample made read-only
        os.close(fd)
        fd = sub
    os.close(fd)
    _remove_tree(root)
    assert not root.exists()
    assert (host / "precious").read_text() == "keep" and sorted(os.listdir(host)) == ["precious"]
