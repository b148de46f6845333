"""The bwrap backend for real: escape attempts fail, limits hold, everything dies with the sample
(and with the runner), and the default sandbox of a real run contains a hostile sample."""

from __future__ import annotations

import asyncio
import hashlib
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.support.sandboxes import create_sandbox
from tests.conftest import REPO, cli
from tests.support.policies import prompt_command_policy
from tests.support.scripted_server import ScriptedServer
from tests.support.run_state import read_records
from trajforge.catalog.sandboxes import NetworkMode
from trajforge.config import RunConfig
from trajforge.sandbox.interface import PathEscapeError
from trajforge.sandbox.backends.bwrap.bwrap_sandbox import BwrapSandbox, bwrap_argv
from trajforge.sandbox.backends.bwrap.bwrap_backend import probe

STATUS = asyncio.run(probe())
needs_bwrap = pytest.mark.skipif(not STATUS.usable, reason=f"bwrap not usable here: {STATUS.detail}")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the per-sample process limit needs a root runner")


def test_argv_is_built_from_the_layout_alone() -> None:
    layout = [("usr", None), ("etc", None), ("bin", "usr/bin"), ("lib64", "usr/lib64")]
    ws = Path("/data/run/sample-1")
    argv = bwrap_argv("/x/bwrap", layout=layout, binds=[(ws, "/workspace")], chdir="/workspace/src",
                      network=False, privileged=True)
    assert argv[0] == "/x/bwrap" and argv[-2:] == ["--chdir", "/workspace/src"]
    joined = " ".join(argv)
    for part in ("--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net",
                 "--cap-drop ALL", "--ro-bind /usr /usr", "--ro-bind /etc /etc", "--symlink usr/bin /bin",
                 "--proc /proc", "--dev /dev", "--perms 1777 --tmpfs /tmp", f"--bind {ws} /workspace"):
        assert part in joined, part
    assert "--unshare-user" not in joined and "--unshare-all" not in joined  # root mode: no user namespace
    for hidden in ("/root", "/home", "/var", "/run", "/work"):
        assert f" {hidden} " not in f" {joined} "
    user = bwrap_argv("bwrap", layout=layout, binds=[(ws, "/workspace")], chdir="/workspace", network=True,
                      privileged=False)
    assert "--unshare-all" in user and "--share-net" in user and "--cap-drop" not in user
    assert "--share-net" not in bwrap_argv("bwrap", layout=layout, binds=[], chdir="/", network=False,
                                           privileged=False)


async def started(root: Path, **kw: object) -> BwrapSandbox:
    sb = BwrapSandbox(root, **kw)  # type: ignore[arg-type]
    await sb.start()
    return sb


@needs_bwrap
def test_escape_attempts_fail_and_the_host_is_untouched(tmp_path: Path) -> None:
    token = secrets.token_hex(4)
    secret = Path.home() / f".trajforge-secret-{token}"
    secret.write_text("host secret\n")
    marker_tmp = Path("/tmp") / f"trajforge-escape-{token}"

    async def body() -> None:
        sb = await started(tmp_path, network=NetworkMode.NONE)
        try:
            assert sb.workdir == "/workspace" and sb.cwd == "/workspace"
            res = await sb.exec(f"cat {secret}; ls {Path.home()}; cat /root/.bashrc", timeout=10)
            assert "host secret" not in res.stdout and res.exit_code != 0
            res = await sb.exec(f"touch /etc/x-{token} /usr/x-{token} /x-{token} 2>&1; echo rc=$?", timeout=10)
            assert "rc=1" in res.stdout and "Read-only" in res.stdout
            assert not Path(f"/etc/x-{token}").exists() and not Path(f"/usr/x-{token}").exists()
            res = await sb.exec(f"echo inside > {marker_tmp} && cat {marker_tmp}", timeout=10)
            assert res.stdout == "inside\n" and not marker_tmp.exists()  # /tmp is private
            res = await sb.exec(f"ps -eo pid,args; kill -9 {os.getpid()}; echo rc=$?", timeout=10)
            assert "pytest" not in res.stdout and str(tmp_path) not in res.stdout  # no host process or path
            assert "rc=1" in res.stdout and "No such process" in res.stderr
            res = await sb.exec("kill -9 1; echo rc=$?; kill -9 -1; echo still here", timeout=10)
            assert "still here" in res.stdout
            assert (await sb.exec("echo alive", timeout=10)).stdout == "alive\n"
            res = await sb.exec("echo hi > note.txt && ls -la /workspace", timeout=10)
            assert (sb.workspace / "note.txt").read_text() == "hi\n"
            for bad in ("/etc/passwd", "../x", str(sb.workspace.parent / "other")):
                with pytest.raises(PathEscapeError):
                    await sb.read_file(bad)
            assert await sb.read_file("/workspace/note.txt") == await sb.read_file("note.txt") == b"hi\n"
            # File operations run inside: a link to a host directory leads nowhere they can go.
            victim = tmp_path / "victim"
            victim.mkdir()
            (victim / "f").write_text("host file\n")
            await sb.exec(f"ln -s {victim} a", timeout=10)
            for attempt in (sb.read_file("a/f"), sb.write_file("a/f", b"pwned"), sb.write_file("a/g", b"pwned")):
                with pytest.raises(PathEscapeError):
                    await attempt
            assert (victim / "f").read_text() == "host file\n" and sorted(victim.iterdir()) == [victim / "f"]
            assert victim.stat().st_uid == 0 and (victim / "f").stat().st_uid == 0
        finally:
            await sb.close()
        assert not sb.workspace.exists()

    try:
        asyncio.run(body())
    finally:
        secret.unlink()


class Listener:
    """A TCP server on the host's 127.0.0.1 that records whether anyone connected."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.connected = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.sock.accept()
            self.connected.set()
            conn.close()


@needs_bwrap
def test_network_none_cannot_reach_a_host_loopback_port(tmp_path: Path) -> None:
    async def attempt(network: bool, port: int) -> str:
        sb = await started(tmp_path, network=NetworkMode.HOST if network else NetworkMode.NONE)
        try:
            res = await sb.exec(f"echo hello > /dev/tcp/127.0.0.1/{port} && echo CONNECTED; "
                                f"curl -s -m 2 http://127.0.0.1:{port}/ >/dev/null; echo curl=$?", timeout=15)
            return res.stdout + res.stderr
        finally:
            await sb.close()

    off = Listener()
    out = asyncio.run(attempt(False, off.port))
    assert "CONNECTED" not in out and "curl=0" not in out
    assert not off.connected.wait(0.5)
    on = Listener()  # the same command with the network on does connect: the check above can fail
    out = asyncio.run(attempt(True, on.port))
    assert "CONNECTED" in out and on.connected.wait(5)


FORK_COUNT = """python3 - <<'EOF'
import os, time
n = 0
try:
    for _ in range(500):
        if os.fork() == 0:
            time.sleep(20)
            os._exit(0)
        n += 1
except OSError as e:
    print("fork failed:", e.strerror)
print("forked", n)
EOF"""


def processes_of(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{entry}/status").read_text()
            if entry.isdigit() and f"Uid:\t{uid}\t" in status:
                pids.append(int(entry))
    return pids


@needs_bwrap
@needs_root
def test_fork_bomb_is_contained_and_the_sandbox_survives(tmp_path: Path) -> None:
    async def body() -> None:
        sb = await started(tmp_path, network=NetworkMode.NONE, nproc=64)
        try:
            # The bomb's shell returns at once and its forks hold the output. Its timeout outlasts the
            # suite's per-test timeout, so exec comes back only by killing the forks after the detach
            # grace (a hang fails the test); the process count below shows none of them is left.
            bomb = await sb.exec(":(){ :|:& };:", timeout=3600)
            assert not bomb.timed_out and "process tool" in bomb.stderr, bomb
            res = await sb.exec("ulimit -u; echo alive", timeout=10)
            assert res.stdout.split() == ["64", "alive"], res
            res = await sb.exec(FORK_COUNT, timeout=30)
            assert "fork failed" in res.stdout and int(res.stdout.split()[-1]) < 64, res
            await sb.exec("setsid sleep 300 > /dev/null 2>&1 &", timeout=10)  # outlives its command
            # the sleep, and the helper (the sample's pid 1, whose uid is the sample's after its drop)
            assert len(set(processes_of(sb.uid)) - {sb.helper_pid}) == 1
        finally:
            await sb.close()
        # close() returns once the namespace's init has exited, and the kernel reaps every other
        # process of a pid namespace before its init's exit completes: nothing is left to wait for.
        assert processes_of(sb.uid) == []

    asyncio.run(body())


@needs_bwrap
def test_timeouts_background_jobs_and_shared_namespace(tmp_path: Path) -> None:
    async def body() -> None:
        sb = await started(tmp_path, network=NetworkMode.NONE, cwd="proj")
        try:
            assert sb.cwd == "/workspace/proj"
            res = await sb.exec("sleep 41 & sleep 42; echo never", timeout=1)
            assert res.timed_out and "never" not in res.stdout
            ps = (await sb.exec("ps -eo args", timeout=10)).stdout
            assert "sleep 41" not in ps and "sleep 42" not in ps
            # A background listener and later commands share one network namespace (root mode).
            server = await sb.spawn("exec busybox nc -l -p 8765 > got.txt")
            sent = ""
            for _ in range(100):
                sent = (await sb.exec("echo ping > /dev/tcp/127.0.0.1/8765 && echo sent", timeout=10)).stdout
                if sent or STATUS.mode != "root":
                    break
                await asyncio.sleep(0.1)
            if STATUS.mode == "root":
                assert sent == "sent\n" and await server.wait(10) == 0
                assert (sb.workspace / "proj" / "got.txt").read_text() == "ping\n"
            sleeper = await sb.spawn("sleep 300")
            await sb.write_file("made-by-tool.txt", b"v1\n")  # the helper writes as the sample
            res = await sb.exec("echo v2 >> made-by-tool.txt && cat made-by-tool.txt && pwd", timeout=10)
            assert res.stdout == "v1\nv2\n/workspace/proj\n", res
        finally:
            await sb.close()
        assert sleeper.returncode is not None

    asyncio.run(body())


CHILD = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from trajforge.catalog.sandboxes import NetworkMode
    from trajforge.sandbox.backends.bwrap.bwrap_sandbox import BwrapSandbox

    async def main():
        sb = BwrapSandbox(Path(sys.argv[1]), network=NetworkMode.NONE)
        await sb.start()
        await sb.spawn("exec sleep 4321")
        res = await sb.exec("sleep 1234 & echo ready", timeout=30)
        print(res.stdout.strip(), flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
""")


@needs_bwrap
def test_sandbox_dies_with_the_runner(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"

    def sleepers() -> list[str]:
        out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        return [line for line in out.splitlines() if line.startswith("sleep 4321")]

    assert sleepers()
    child.send_signal(signal.SIGKILL)
    child.wait()
    deadline = time.monotonic() + 5
    while sleepers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sleepers() == []


@needs_bwrap
def test_factory_picks_bwrap_by_default(tmp_path: Path) -> None:
    async def body() -> None:
        for cfg in (RunConfig(), RunConfig(sandbox="bwrap", sandbox_network="none")):
            sb = await create_sandbox(cfg, cwd="/app", image=None, root=tmp_path)
            try:
                from trajforge.sandbox.network import resolve_mode

                mode = (await resolve_mode(cfg.sandbox_settings()))[0]  # auto: egress where it works here, else host
                assert isinstance(sb, BwrapSandbox) and sb.network == mode
                res = await sb.exec("pwd; ls -d /workspace/app", timeout=10)
                assert res.stdout == "/app\n/workspace/app\n"  # an absolute cwd is also mounted at its path
                await sb.write_file("/app/f", b"f")
                assert await sb.read_file("/workspace/app/f") == b"f" and (sb.workspace / "app" / "f").exists()
            finally:
                await sb.close()

    asyncio.run(body())


HOSTILE = [":(){ :|:& };:", "cat /root/.bashrc", "touch /etc/x", "kill -9 1", "ps aux"]


@needs_bwrap
def test_default_sandbox_contains_a_hostile_sample_end_to_end(tmp_path: Path, clean_env: dict[str, str]) -> None:
    assert not Path("/etc/x").exists()
    with ScriptedServer() as server:
        server.handler = prompt_command_policy
        prompts = [*HOSTILE, f"curl -sS -m 5 {server.url}/models; echo curl=$?"]
        ds = tmp_path / "ds.jsonl"
        ds.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
        proc = subprocess.run(cli("run", f"--dataset_file={ds}", "--batch_size=10", "--run_name=hostile",
                                  f"--base_url={server.url}", "--model=scripted", "--distribution=terminal_only",
                                  "--sandbox_network=none", "--tool_timeout=15", "--num_workers=2"),
                              cwd=tmp_path, env=clean_env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr  # a hostile sample that hung the run: the timeout above
        models_requests = [r for r in server.requests if r.path.endswith("/models")]
    records = read_records(tmp_path / "data" / "hostile")
    outputs = {prompts[r["prompt_index"]]: r["conversations"][-1]["value"] for r in records}
    assert set(outputs) == set(prompts)
    assert "No such file" in outputs["cat /root/.bashrc"]
    assert "Read-only file system" in outputs["touch /etc/x"]
    assert "Output" in outputs["kill -9 1"]  # pid 1 is the helper, which the kernel shields: the sample went on
    assert "pytest" not in outputs["ps aux"] and "trajforge" not in outputs["ps aux"].replace("TRAJFORGE", "")
    assert "curl=0" not in outputs[prompts[-1]] and models_requests == []
    assert not Path("/etc/x").exists()


def test_doctor_reports_every_backend(clean_env: dict[str, str]) -> None:
    text = subprocess.run(cli("doctor"), env=clean_env, capture_output=True, text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    for word in ("local", "bwrap", "container", "podman", "docker", "--sandbox auto uses:"):
        assert word in text.stdout
    report = json.loads(subprocess.run(cli("doctor", "--json"), env=clean_env, capture_output=True, text=True,
                                       timeout=120).stdout)
    assert report["bwrap"]["usable"] == STATUS.usable and report["bwrap"]["mode"] == STATUS.mode
    assert report["auto"] == ("bwrap" if STATUS.usable else "local")
    assert set(report["container"]["engines"]) == {"podman", "docker"}
    assert report["container"]["usable"] == any(e["usable"] for e in report["container"]["engines"].values())
    if report["container"]["usable"]:  # who a container sample is to this host, and what it lost
        isolation = report["container"]["isolation"]
        assert "capabilities dropped: NET_RAW, MKNOD" in isolation and isolation in text.stdout
        assert ("this host's uid 0" in isolation) == (report["container"]["engine"] == "docker")


@needs_bwrap
def test_nested_absolute_and_relative_cwd(tmp_path: Path) -> None:
    """A row's cwd /app/sub is mounted at that path with traversable parents (bwrap would make
    /app 0700 and root-owned: `cd: Permission denied` for the sample's uid); a relative one lives
    beneath /workspace. Commands, relative paths and file operations agree on both."""
    async def body() -> None:
        for cwd, inside in (("/app/sub", "/app/sub"), ("/srv/a/b/", "/srv/a/b"), ("proj/src", "/workspace/proj/src")):
            sb = await started(tmp_path, network=NetworkMode.NONE, cwd=cwd)
            try:
                assert sb.cwd == inside
                res = await sb.exec("pwd; echo hi > f.txt; cd .. && pwd && ls", timeout=10)
                assert res.exit_code == 0 and res.stdout.splitlines()[0] == inside, res
                assert await sb.read_file(f"{inside}/f.txt") == await sb.read_file("f.txt") == b"hi\n"
                assert (await sb.write_file("deeper/g.txt", b"g")).endswith("deeper/g.txt")
                res = await sb.exec("cat g.txt", timeout=10, cwd="deeper")
                assert res.stdout == "g", res
                res = await sb.exec(f"cat {inside}/deeper/g.txt", timeout=10, cwd="/workspace")
                assert res.stdout == "g", res
            finally:
                await sb.close()

    asyncio.run(body())


@needs_bwrap
def test_cancelled_commands_die_whenever_the_cancel_lands(tmp_path: Path) -> None:
    """Cancelled while running, or before the helper even answered: the command never survives.
    The helper handles requests in order, so a command whose request went out is spawned before
    the check below runs; the check waits for the kill itself (however late it lands), bounded
    by its own timeout, never by the machine's speed."""
    async def body() -> None:
        sb = await started(tmp_path, network=NetworkMode.NONE)
        try:
            for delay in (0.0, 0.0005, 0.5):  # where the cancel lands: varied, not synchronised on
                task = asyncio.create_task(sb.exec(f"exec sleep {300 + int(delay * 1000)}", timeout=60))
                await asyncio.sleep(delay)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            # `slee[p]`: the pattern does not match this check's own command line
            res = await sb.exec("while pgrep -f 'slee[p] 3[0-9][0-9]' > /dev/null; do sleep 0.05; done; echo gone",
                                timeout=60)
            assert res.stdout == "gone\n", res
            assert (await sb.exec("echo still", timeout=10)).stdout == "still\n"
        finally:
            await sb.close()

    asyncio.run(body())


@needs_bwrap
def test_large_payloads_and_overlapping_requests_cross_the_helper_whole(tmp_path: Path) -> None:
    """Both ends read the channel 64 KiB at a time: a payload of several MiB arrives in many reads
    and is reassembled byte for byte, and requests in flight together each get their own reply."""
    big = bytes(range(256)) * (5 * 4096) + b"tail"  # 5 MiB and a bit: ~80 reads at either end
    small = [f"file {i}\n".encode() * (i + 1) for i in range(12)]

    async def body() -> None:
        sb = await started(tmp_path, network=NetworkMode.NONE)
        try:
            await sb.write_file("big.bin", big)
            assert await sb.read_file("big.bin") == big
            res = await sb.exec("wc -c < big.bin; sha256sum big.bin", timeout=20)
            assert res.stdout.split()[:2] == [str(len(big)), hashlib.sha256(big).hexdigest()], res
            await asyncio.gather(*(sb.write_file(f"s{i}", data) for i, data in enumerate(small)))
            got = await asyncio.gather(sb.read_file("big.bin"), *(sb.read_file(f"s{i}") for i in range(12)))
            assert got == [big, *small]
        finally:
            await sb.close()

    asyncio.run(body())
