"""The container's ImageSandbox for real: the runner's own steps on a sample's container, against a
hostile sample that is root there and replaces the programs those steps would once have run.

Each step is done from the host (from_host.py) or through the engine: a sample that replaced
`sh`, `bash` and `dash` with scripts leaving a mark sees none of them run, its setsid loop and
its fork bomb are stopped, a link where /logs was is removed without its target being touched,
and a container the sample stopped is the sample's doing (SandboxSpoiled). The mutation checks
at the end take each guard out and expect its test to fail.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.images import podman  # noqa: F401 (fixture)
from tests.support.tasks import task_base  # noqa: F401 (fixture)
from trajforge.config import RunConfig
from trajforge.sandbox.backends.container import from_host
from trajforge.sandbox.factory import SandboxProvider
from trajforge.sandbox.interface import ImageSandbox, SampleResources, SandboxError, SandboxSpoiled

FRESH = {"/tests": 0o755, "/logs": 0o755, "/logs/agent": 0o755, "/logs/verifier": 0o777}
MARK = "/app/ran-inside"  # what the replaced shells write when anything runs them
# Replaces every shell of the image with one that leaves a mark and exits 0 (the real bash kept
# aside to interpret it), after starting an orphaned loop (the container's init its parent) that
# keeps planting a reward; a background job (an `exec` of its own: the engine's child) loops too.
# The reward is written beside and renamed into place, so that a read never meets it truncated.
LOOP = "while :; do mkdir -p /logs/verifier; echo 1 > /logs/verifier/.r; mv -f /logs/verifier/.r /logs/verifier/reward.txt; done"
HOSTILE = (
    "cp /usr/bin/bash /usr/bin/.b && "
    f"(/usr/bin/.b -c '{LOOP}' >/dev/null 2>&1 < /dev/null &) && until [ -s /logs/verifier/reward.txt ]; do :; done && "
    f"for s in sh bash dash; do printf '#!/usr/bin/.b\\necho \"$0 $*\" >> {MARK}\\nexit 0\\n' > /usr/bin/$s.new && "
    "chmod 755 /usr/bin/$s.new && mv -f /usr/bin/$s.new /usr/bin/$s; done; echo replaced"
)


def alive(sb: ImageSandbox) -> set[tuple[int, str]]:
    """(host pid, command) of every live process in the container's pid namespace, read here, not by from_host."""
    init = sb._init  # type: ignore[attr-defined]
    ns = os.readlink(f"/proc/{init}/ns/pid")
    found = set()
    for entry in os.scandir("/proc"):
        try:
            if entry.name.isdigit() and os.readlink(f"/proc/{entry.name}/ns/pid") == ns:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    if f.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                        with open(f"/proc/{entry.name}/cmdline", "rb") as c:
                            found.add((int(entry.name), c.read().replace(b"\0", b" ").decode().strip()))
        except OSError:
            continue
    return found


def run(body: Any, tmp_path: Path, **config: Any) -> Any:
    """`body(sb)` with a started ImageSandbox of the example base image, closed after."""
    settings = RunConfig(container_engine="podman", sandbox_network="none",  # type: ignore[arg-type]
                         run_name=f"isb-{os.getpid()}", **config).sandbox_settings()

    async def main() -> Any:
        async with SandboxProvider(settings) as provider:
            sb = await provider.create(cwd="/app", image="localhost/trajforge-example-base:latest", root=tmp_path,
                                       resources=SampleResources())
            assert isinstance(sb, ImageSandbox)
            try:
                return await body(sb)
            finally:
                await sb.close()

    return asyncio.run(main())


def test_the_runners_steps_run_nothing_of_a_container_whose_shells_were_replaced(tmp_path: Path, podman: object,
                                                                                 task_base: str) -> None:
    async def body(sb: ImageSandbox) -> None:
        await sb.spawn(LOOP.replace("/logs", "/tmp/logs"))
        res = await sb.exec("until [ -s /tmp/logs/verifier/reward.txt ]; do :; done; " + HOSTILE, timeout=60)
        assert res.stdout.strip() == "replaced", res
        assert await sb.download("/logs/verifier/reward.txt", 100) == b"1\n"  # the loop runs
        stopped = await sb.stop_processes()
        assert stopped.killed >= 1 and stopped.note is None
        left = sorted(cmd for _, cmd in alive(sb))  # the container's init and its command, nothing else
        assert len(left) == 2 and left[0].endswith("sleep infinity") and left[1] == "sleep infinity", left
        await sb.fresh_dirs(FRESH)
        assert await sb.download("/logs/verifier/reward.txt", 100) is None  # the loop is gone, and what it wrote
        await sb.remove("/tmp/logs")
        assert await sb.download("/tmp/logs/verifier/reward.txt", 100) is None  # the job's loop is gone too
        (tmp_path / "tests-src").mkdir()
        (tmp_path / "tests-src" / "test.sh").write_text("echo real\n")
        await sb.upload(tmp_path / "tests-src", "/tests")
        assert await sb.download("/tests/test.sh", 100) == b"echo real\n"
        assert sb.workspace is not None and not (sb.workspace / "ran-inside").exists(), (sb.workspace / "ran-inside").read_text()  # nothing ran inside
        changed = await sb.changes(lambda p: p.startswith("/usr/bin/"))
        assert changed is not None and {("C", "/usr/bin/bash"), ("C", "/usr/bin/sh"), ("A", "/usr/bin/.b")} <= \
            {(c.kind, c.path) for c in changed}, changed
        # The replaced shell is what the next command of the sandbox runs: the mark proves the test saw it.
        await sb.exec("true", timeout=30)
        assert (sb.workspace / "ran-inside").exists()

    run(body, tmp_path)


def test_a_fork_bomb_is_stopped_from_the_host_and_said_so(tmp_path: Path, podman: object, task_base: str) -> None:
    async def body(sb: ImageSandbox) -> None:
        # The bomb in the background; the foreground ends when one of its forks fails: the container is full.
        res = await sb.exec("f(){ f & f & wait; }; (f &); while /usr/bin/true; do :; done; echo full", timeout=300)
        assert "fork: Resource temporarily unavailable" in res.stderr, res
        init = await sb._init_pid()  # type: ignore[attr-defined]
        async with asyncio.timeout(60):  # in seconds, where an exec into the container could not even start
            stopped = await sb.stop_processes()
        assert stopped.killed > 0 and stopped.note is not None and "limit of 64" in stopped.note, stopped
        assert [p.pid for p in from_host.members(init) if p.state != "Z"] == sorted(
            from_host.own(init, from_host.members(init), True))
        assert (await sb.exec("echo alive", timeout=30)).stdout == "alive\n"  # the container itself lives on
        # A bomb in the foreground: at its timeout its process group is killed from the host, where an
        # `exec` of a kill into the full container would need a fork of its own.
        res = await sb.exec("f(){ f & f & wait; }; f", timeout=5)
        assert res.timed_out
        assert len(alive(sb)) == 2, alive(sb)  # the init and its command: the bomb is gone

    run(body, tmp_path, container_pids_limit=64)


def test_a_link_where_logs_was_is_removed_and_its_target_untouched(tmp_path: Path, podman: object,
                                                                    task_base: str) -> None:
    async def body(sb: ImageSandbox) -> None:
        await sb.exec("mkdir -p /app/fake/verifier && echo 1 > /app/fake/verifier/reward.txt && rm -rf /logs /tests"
                      " && ln -s /app/fake /logs && ln -s /etc /tests", timeout=60)
        await sb.stop_processes()
        await sb.fresh_dirs(FRESH)
        assert sb.workspace is not None and (sb.workspace / "fake" / "verifier" / "reward.txt").read_text() == "1\n"
        assert await sb.download("/logs/verifier/reward.txt", 100) is None
        assert await sb.download("/etc/passwd", 1 << 20) is not None  # /tests was a link to it: /etc is intact
        with pytest.raises(ValueError, match="not a regular file"):
            await sb.download("/app/fake", 100)
        await sb.exec("ln -s /etc/passwd /logs/verifier/reward.json; head -c 5000 /dev/zero > /logs/verifier/big",
                      timeout=30)
        with pytest.raises(ValueError, match="not a regular file"):
            await sb.download("/logs/verifier/reward.json", 100)
        with pytest.raises(ValueError, match="larger than 100 bytes"):
            await sb.download("/logs/verifier/big", 100)

    run(body, tmp_path)


def test_a_tree_comes_out_capped_with_what_was_left_out_counted(tmp_path: Path, podman: object,
                                                                 task_base: str) -> None:
    async def body(sb: ImageSandbox) -> None:
        await sb.exec("mkdir -p /out/sub && head -c 1000 /dev/zero > /out/a && head -c 1000 /dev/zero > /out/sub/b"
                      " && head -c 1000 /dev/zero > /out/c && ln -s /etc/shadow /out/link", timeout=30)
        dest = tmp_path / "out"
        dest.mkdir()
        copied = await sb.download_tree("/out", dest, 1500)
        assert copied is not None and (copied.kept, copied.left_out, copied.left_out_bytes) == (1000, 2, 2000)
        assert os.readlink(dest / "link") == "/etc/shadow"  # kept as a link, never followed
        assert sum(1 for p in dest.rglob("*") if p.is_file() and not p.is_symlink()) == 1
        assert await sb.download_tree("/no/such/dir", dest, 1500) is None

    run(body, tmp_path)


def test_a_container_its_sample_stopped_is_the_samples_doing(tmp_path: Path, podman: object, task_base: str) -> None:
    async def body(sb: ImageSandbox) -> None:
        init = await sb._init_pid()  # type: ignore[attr-defined]
        main = from_host.own(init, from_host.members(init), True) - {init}
        assert len(main) == 1
        # `sleep infinity` killed: its init then exits, and the container with it.
        res = await sb.exec("for p in /proc/[0-9]*; do [ \"$(tr '\\0' ' ' < $p/cmdline)\" = 'sleep infinity ' ] && "
                            "kill -9 ${p#/proc/} && echo killed; done", timeout=30)
        assert "killed" in res.stdout, res
        await sb.engine.run("wait", sb.name, timeout=60)  # type: ignore[attr-defined]
        with pytest.raises(SandboxSpoiled, match="container stopped"):
            await sb.stop_processes()

    run(body, tmp_path)


def test_commands_as_another_user_with_their_own_variables(tmp_path: Path, podman: object, task_base: str) -> None:
    """exec(user=, env=): the variables given and the image's, not the tools' (TERM=dumb, PAGER); run()
    the same without a shell of trajforge's between."""
    async def body(sb: ImageSandbox) -> None:
        res = await sb.exec('id -u; echo "$GREETING ${PAGER-no pager} $TERM"', timeout=30, user="1000",
                            env={"GREETING": "hi there"})
        assert res.stdout.startswith("1000\nhi there no pager ") and "dumb" not in res.stdout, res
        assert (await sb.exec("echo $PAGER $TERM", timeout=30)).stdout == "cat dumb\n"  # a tool's command
        res = await sb.run(["id", "-un"], timeout=30, user="tester")
        assert (res.exit_code, res.stdout) == (0, "tester\n"), res
        res = await sb.run(["sleep", "30"], timeout=1)
        assert res.timed_out and len(alive(sb)) == 2  # past its timeout, everything of the sample is stopped

    run(body, tmp_path)


def test_only_the_containers_own_init_is_acted_on(tmp_path: Path, podman: object, task_base: str) -> None:
    """The engine's pid is used only when it is the container's: in a pid namespace of its own,
    in a cgroup named after the container (a remote engine's pid may be anything here)."""
    async def body(sb: ImageSandbox) -> None:
        init = await sb._init_pid()  # type: ignore[attr-defined]
        res = await sb.engine.run("inspect", "--format", "{{.Id}}", sb.name)  # type: ignore[attr-defined]
        cid = res.stdout.strip()
        assert from_host.is_init_of(init, cid)
        assert not from_host.is_init_of(init, "0" * 64)  # another container's id
        assert not from_host.is_init_of(os.getpid(), cid)  # the runner's own namespace: never
        assert not from_host.is_init_of(1, cid)

    run(body, tmp_path)


# ---- mutation checks: each guard taken out, its test must fail ----

def test_taking_the_inits_children_for_the_containers_processes_lets_the_loop_live(
        tmp_path: Path, podman: object, task_base: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A background job is an `exec` of its own, the engine's monitor's child, outside the
    container: only its pid namespace says it is the container's."""
    real = from_host.members
    monkeypatch.setattr(from_host, "members", lambda init: [p for p in real(init) if p.pid == init or p.ppid == init])
    with pytest.raises(AssertionError):
        test_the_runners_steps_run_nothing_of_a_container_whose_shells_were_replaced(tmp_path, podman, task_base)


def test_keeping_only_the_init_is_caught(tmp_path: Path, podman: object, task_base: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(from_host, "own", lambda init, procs, has_init: {init})
    with pytest.raises((AssertionError, SandboxError)):  # its command killed, the container ends
        test_the_runners_steps_run_nothing_of_a_container_whose_shells_were_replaced(tmp_path, podman, task_base)


def test_reading_a_file_through_a_link_is_caught(tmp_path: Path, podman: object, task_base: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(from_host.os, "O_NOFOLLOW", 0)
    with pytest.raises((AssertionError, pytest.fail.Exception)):  # the link was followed
        test_a_link_where_logs_was_is_removed_and_its_target_untouched(tmp_path, podman, task_base)


def test_following_a_link_where_logs_was_is_caught(tmp_path: Path, podman: object, task_base: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    real_stat = os.stat
    monkeypatch.setattr(from_host.os, "stat", lambda p, *, dir_fd=None, follow_symlinks=True:
                        real_stat(p, dir_fd=dir_fd, follow_symlinks=True))
    with pytest.raises((AssertionError, SandboxSpoiled)):
        test_a_link_where_logs_was_is_removed_and_its_target_untouched(tmp_path, podman, task_base)
