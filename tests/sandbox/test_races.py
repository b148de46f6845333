"""Races a hostile sample runs against the file operations, on every backend, with the runner as root.

While thousands of file operations run (reads of files and images, writes in place, atomic
replaces, never-replacing `new` writes as image_generate does, searches, and the file tools on
top), an attacker process swaps, as fast as it can, what those paths name:
- a directory for a symlink to a host directory outside the workspace (atomically, with
  renameat2(RENAME_EXCHANGE) through ctypes, and non-atomically: rename away, symlink, restore),
- a regular file for a FIFO (renameat2 exchange), which would hang any blocking open,
- the `images/` directory for a symlink to the outside directory.
It acts on the workspace's host directory, which is what the sample's own background job does
through the bind mount (and is strictly stronger than what a sandboxed process could do).

Asserted: no operation returns a byte of the outside files or creates/changes anything there;
every failure is one the model is told about (PathEscapeError/FileOpError), never a hang
(each call is bounded) or a broken sandbox.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import cli
from tests.support.images import busybox_image, podman  # noqa: F401 (fixtures)
from tests.support.policies import tool_messages
from tests.support.scripted_server import Recorded, Reply, ScriptedServer, chat, tool_call
from tests.support.web_fixture import make_png
from tests.support.run_state import read_records
from trajforge.config import RunConfig
from trajforge.sandbox.interface import FileOpError, PathEscapeError, Sandbox
from trajforge.sandbox.backends.bwrap.bwrap_backend import probe
from trajforge.sandbox.backends.container.sandbox import ContainerSandbox
from trajforge.sandbox.factory import SandboxProvider
from trajforge.tools import files, image_gen, vision
from trajforge.tools.tool import ToolContext, Toolset

SECRET = b"OUTSIDE-SECRET-7d1e"
PNG = make_png(2, 2, (0, 200, 0))
REAL_PNG = make_png(2, 2, (0, 0, 255))
CALLS = 2000
ATTACKER = textwrap.dedent("""
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    AT_FDCWD, RENAME_EXCHANGE = -100, 2

    def exchange(a, b):
        libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), RENAME_EXCHANGE)

    os.chdir(sys.argv[1])
    outside = sys.argv[2]
    print("ready", flush=True)
    i = 0
    while True:
        i += 1
        exchange("d", "dl")            # d/ <-> d -> outside, atomically
        exchange("p.txt", "p.fifo")    # a file <-> a FIFO
        exchange("images", "il")       # images/ <-> images -> outside
        if i % 7 == 0:                 # the non-atomic way too
            try:
                os.rename("e", "e.away")
                os.symlink(outside, "e")
                os.sched_yield()
                os.unlink("e")
                os.rename("e.away", "e")
            except OSError:
                pass
        os.sched_yield()
""")


def plant(ws: Path, outside: Path) -> None:
    for name in ("d", "e"):
        (ws / name / "sub").mkdir(parents=True)
        (ws / name / "f.txt").write_text("inside\n")
        (ws / name / "img.png").write_bytes(PNG)
    (ws / "dl").symlink_to(outside)
    (ws / "p.txt").write_text("plain\n")
    os.mkfifo(ws / "p.fifo")
    (ws / "images").mkdir()
    (ws / "il").symlink_to(outside)
    for path in ws.rglob("*"):  # the sample (a uid of its own under bwrap) owns its files
        os.chown(path, ws.stat().st_uid, ws.stat().st_gid, follow_symlinks=False)


def settle(ws: Path) -> None:
    """Once the attacker is dead: every swapped pair back the way plant() left it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for a, b in (("d", "dl"), ("p.txt", "p.fifo"), ("images", "il")):
        if (ws / a).is_symlink() or (ws / a).is_fifo():
            libc.renameat2(-100, str(ws / a).encode(), -100, str(ws / b).encode(), 2)  # RENAME_EXCHANGE
    if (ws / "e.away").exists():  # (a write may have made a new e/ while the real one was away)
        if (ws / "e").is_symlink():
            (ws / "e").unlink()
        elif (ws / "e").exists():
            shutil.rmtree(ws / "e")
        os.rename(ws / "e.away", ws / "e")


def snapshot(outside: Path) -> dict[str, tuple[int, int, bytes]]:
    return {str(p.relative_to(outside)): (p.stat().st_mode, p.stat().st_mtime_ns,
                                          p.read_bytes() if p.is_file() else b"")
            for p in sorted(outside.rglob("*"))}


async def one_call(sb: Sandbox, ctx: ToolContext, i: int, tools: dict[str, Toolset] | None = None) -> bytes:
    """The i-th operation; returns everything it gave back (bytes or the tool's JSON). With
    `tools`, every other call goes through the real vision_analyze / image_generate tools."""
    if tools and i % 2:
        if i % 4 == 1:
            path = ("e/img.png", "d/img.png", "p.txt")[i % 3]  # dir->link swaps, file->FIFO swaps
            return (await tools["vision"].tools[0].run({"image_url": path, "question": "?"}, ctx)).encode()
        return (await tools["image_gen"].tools[0].run({"prompt": "race"}, ctx)).encode()
    kind = i % 12
    if kind == 0:
        return await sb.read_file("d/f.txt")
    if kind == 1:
        return await sb.read_file("p.txt")
    if kind == 2:
        return await sb.read_file("e/img.png", max_bytes=1 << 20)  # vision_analyze's read
    if kind == 3:
        return (await sb.write_file(f"d/w{i}.txt", b"written")).encode()
    if kind == 4:
        return (await sb.write_file("e/f.txt", b"inside\n", how="replace")).encode()
    if kind == 5:
        return (await sb.write_file(f"{sb.workdir}/images/gen.png", PNG, how="new")).encode()  # image_generate
    if kind == 6:
        return json.dumps(await sb.search("d", "SECRET|inside")).encode()
    if kind == 7:
        return (await sb.write_file(f"e/sub/n{i}/deep.txt", b"deep")).encode()
    if kind == 8:
        return (await files.ReadFileTool().run({"path": "d/f.txt"}, ctx)).encode()
    if kind == 9:
        return (await files.PatchTool().run({"path": "p.txt", "old_string": "plain", "new_string": "plain"}, ctx)
                ).encode()
    if kind == 10:
        return (await files.SearchFilesTool().run({"pattern": "SECRET", "path": "."}, ctx)).encode()
    return (await sb.write_file("p.txt", b"plain\n")).encode()


async def hammer(config: RunConfig, image: str | None, root: Path, outside: Path, calls: int,
                 concurrency: int, with_tools: bool = False, exec_files: bool = False) -> dict[str, Any]:
    settings = config.tool_settings()
    tools = {"vision": await vision.build(settings), "image_gen": await image_gen.build(settings)} if with_tools else None
    assert tools is None or all(isinstance(t, Toolset) for t in tools.values()), tools
    async with SandboxProvider(config.sandbox_settings()) as provider:
        sb = await provider.create(cwd=None, image=image, root=root)
        assert sb.workspace is not None
        if exec_files:  # a container without its file helper: the exec-based path (non-root runners)
            assert isinstance(sb, ContainerSandbox) and sb.helper is not None
            sb.helper.close()
            sb.helper = None
        plant(sb.workspace, outside)
        attacker = subprocess.Popen([sys.executable, "-c", ATTACKER, str(sb.workspace), str(outside)],
                                    stdout=subprocess.PIPE, text=True)
        ctx = ToolContext(sandbox=sb, settings=settings)
        stats: dict[str, Any] = {"ok": 0, "refused": 0, "leaks": [], "unexpected": []}
        try:
            assert attacker.stdout is not None and attacker.stdout.readline().strip() == "ready"
            sem = asyncio.Semaphore(concurrency)

            async def run(i: int) -> None:
                async with sem:
                    try:
                        async with asyncio.timeout(30):  # a blocked open would end here
                            out = await one_call(sb, ctx, i, tools)
                    except (PathEscapeError, FileOpError):
                        stats["refused"] += 1
                        return
                    except Exception as e:  # noqa: BLE001 (collected and asserted on)
                        stats["unexpected"].append(f"{i}: {type(e).__name__}: {e}")
                        return
                    stats["ok"] += 1
                    if SECRET in out:
                        stats["leaks"].append((i, out[:200]))

            await asyncio.gather(*(run(i) for i in range(calls)))
            attacker.kill()
            attacker.wait()
            # Then every kind of call once more with nothing swapping: each must work (the tools
            # really ran, whatever races the attacker won) and still show nothing from outside.
            settle(sb.workspace)
            stats["calm"] = []
            for i in range(48 if tools else 12):
                out = await one_call(sb, ctx, i, tools)
                stats["calm"].append(i)
                if SECRET in out:
                    stats["leaks"].append((i, out[:200]))
            stats["alive"] = (await sb.exec("echo alive", timeout=30)).stdout
        finally:
            if attacker.poll() is None:
                attacker.kill()
                attacker.wait()
            await sb.close()
            for toolset in (tools or {}).values():
                await toolset.aclose()
        if tools:  # the vision model never saw a byte from outside either
            stats["leaks"] += [i for i, body in enumerate(VISION_SEEN) if SECRET in body]
        return stats


def check(tmp_path: Path, config: RunConfig, image: str | None = None, calls: int = CALLS,
          concurrency: int = 8, with_tools: bool = False, exec_files: bool = False) -> dict[str, Any]:
    assert os.geteuid() == 0, "the races matter when the runner is root"
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "f.txt").write_bytes(SECRET)
    (outside / "img.png").write_bytes(PNG + SECRET)
    (outside / "p.txt").write_bytes(SECRET)
    (outside / "sub" / "f.txt").write_bytes(SECRET)
    before = snapshot(outside)
    t0 = time.monotonic()
    stats = asyncio.run(hammer(config, image, tmp_path / "ws", outside, calls, concurrency, with_tools, exec_files))
    stats["seconds"] = time.monotonic() - t0
    assert stats["leaks"] == [] and stats["unexpected"] == [], stats
    assert stats["ok"] + stats["refused"] == calls, stats
    assert len(stats["calm"]) in (12, 48), stats  # every kind of call worked once nothing raced it
    assert snapshot(outside) == before  # nothing written, created or changed outside
    assert stats["alive"] == "alive\n"
    print(f"{config.sandbox}: {calls} calls in {stats['seconds']:.1f}s, {stats['refused']} refused")
    return stats


def test_races_local(tmp_path: Path) -> None:
    check(tmp_path, RunConfig(sandbox="local"))


VISION_SEEN: list[bytes] = []


def models(req: Recorded) -> Reply:
    """The vision model (remembers every request body) and the image API of the tool tests."""
    if req.path.endswith("/images/generations"):
        return Reply(body={"created": 0, "data": [{"b64_json": base64.b64encode(REAL_PNG).decode()}]})
    url = req.body["messages"][-1]["content"][1]["image_url"]["url"]
    VISION_SEEN.append(base64.b64decode(url.split("base64,", 1)[1]))
    return chat("an image")


@pytest.mark.parametrize("sandbox", ["local", "bwrap"])
def test_races_through_vision_and_image_generate(tmp_path: Path, server: ScriptedServer, sandbox: str,
                                                 clean_env: dict[str, str]) -> None:
    """The issue's own scenarios through the real tools: vision_analyze on a workspace image whose
    directory is swapped for a link to the host, or which is swapped for a FIFO; image_generate
    while images/ is swapped for a link."""
    if sandbox == "bwrap" and (not BWRAP.usable or BWRAP.mode != "root"):
        pytest.skip(f"needs bwrap as root: {BWRAP.detail}")
    server.handler = models
    VISION_SEEN.clear()
    cfg = RunConfig.model_validate({"sandbox": sandbox, "model": "m", "base_url": server.url,
                                    "sandbox_network": "none" if sandbox == "bwrap" else "on"})
    check(tmp_path, cfg, calls=1200, with_tools=True)
    # The boundary is `leaks == []` (checked in `check`); the calls after the race show the tools
    # really ran: 12 vision reads of files inside, whatever the race left to chance.
    assert len(VISION_SEEN) >= 12


BWRAP = asyncio.run(probe())


@pytest.mark.skipif(not BWRAP.usable or BWRAP.mode != "root", reason=f"needs bwrap as root: {BWRAP.detail}")
def test_races_bwrap(tmp_path: Path) -> None:
    check(tmp_path, RunConfig(sandbox="bwrap", sandbox_network="none"))


# As root, container file operations go through the file helper in the container's mount namespace
# (container.py), as fast as bwrap's; the exec-based path (one `podman exec` each, ~0.1-0.5 s) is
# raced with fewer calls below.
CONTAINER_CALLS = int(os.environ.get("TRAJFORGE_RACE_CONTAINER_CALLS", str(CALLS)))


CONTAINER_EXEC_CALLS = int(os.environ.get("TRAJFORGE_RACE_CONTAINER_EXEC_CALLS", "240"))


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("exec_files", [False, True], ids=["file-helper", "exec"])
def test_races_container(tmp_path: Path, busybox_image: str, exec_files: bool) -> None:  # noqa: F811
    check(tmp_path, RunConfig(sandbox="container", container_engine="podman", sandbox_network="none",
                              run_name=f"races-{os.getpid()}"), image=busybox_image,
          calls=CONTAINER_EXEC_CALLS if exec_files else CONTAINER_CALLS, concurrency=16, exec_files=exec_files)


SWAPPER = ("printf '\\211PNG\\r\\n\\032\\n0000' > a.png; mkfifo f; "
           "while :; do mv a.png t; mv f a.png; mv a.png f; mv t a.png; done")
VISION_CALLS = 25


def fifo_policy(req: Recorded) -> Reply:
    """The vision model answers; the agent starts the swapper, then asks about a.png again and again."""
    if "tools" not in req.body:
        return chat("an image")
    done = len(tool_messages(req.body))
    if done == 0:
        return chat(None, tool_calls=[tool_call("terminal", {"command": SWAPPER, "background": True})],
                    reasoning="Start it.")
    if done <= VISION_CALLS:
        return chat(None, tool_calls=[tool_call("vision_analyze", {"image_url": "a.png", "question": "?"})],
                    reasoning="Look.")
    return chat("Done.", reasoning="Finished.")


@pytest.mark.parametrize("sandbox", ["local", "bwrap"])
def test_a_run_under_fifo_swaps_exits_on_its_own(tmp_path: Path, server: ScriptedServer, sandbox: str,
                                                 clean_env: dict[str, str]) -> None:
    """The issue's hang: vision_analyze on a file the sample keeps swapping for a FIFO blocked
    executor threads forever and the run never exited. Now every call answers and the CLI exits."""
    if sandbox == "bwrap" and (not BWRAP.usable or BWRAP.mode != "root"):
        pytest.skip(f"needs bwrap as root: {BWRAP.detail}")
    server.handler = fifo_policy
    (tmp_path / "ds.jsonl").write_text("".join(json.dumps({"prompt": f"task {i}"}) + "\n" for i in range(3)))
    (tmp_path / "cfg.yaml").write_text("distributions:\n  seeing:\n    toolsets: {terminal: 100, vision: 100}\n")
    proc = subprocess.run(cli("run", "--dataset_file=ds.jsonl", "--batch_size=3", "--run_name=fifo", "--config=cfg.yaml",
                              f"--base_url={server.url}", "--model=scripted", "--distribution=seeing",
                              f"--sandbox={sandbox}", "--tool_timeout=20", "--num_workers=3", "--max_turns=40"),
                          cwd=tmp_path, env=clean_env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr  # the hang this guards against is the timeout above
    records = read_records(tmp_path / "data" / "fifo")
    assert len(records) == 3
    for record in records:
        assert record["tool_stats"]["vision_analyze"]["count"] == VISION_CALLS


@pytest.mark.parametrize("sandbox", ["local", "bwrap"])
def test_a_pattern_that_backtracks_without_end_is_stopped_and_never_stalls_the_runner(
        tmp_path: Path, sandbox: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """search_files with `(a+)+$` over a line of a's (2^100 steps for `re`): the search stops at its
    time limit with a message the model can act on, the sandbox serves the next call, and the
    runner's event loop keeps running meanwhile (in a thread of the runner, `re` held the GIL and
    froze every session, Ctrl-C included)."""
    from trajforge.sandbox.inside import fsops
    from tests.support.sandboxes import create_sandbox

    if sandbox == "bwrap" and not asyncio.run(probe()).usable:
        pytest.skip("bwrap is not usable here")
    monkeypatch.setattr(fsops, "SEARCH_SECONDS", 1.0)

    async def body() -> None:
        network = "none" if sandbox == "bwrap" else "host"  # local has no network namespace to empty
        sb = await create_sandbox(RunConfig(sandbox=sandbox, sandbox_network=network), cwd=None, image=None,
                                  root=tmp_path)
        try:
            await sb.write_file("a.txt", b"a" * 100 + b"!\n")
            stamps: list[float] = []  # when the loop ran a tick

            async def tick() -> None:
                while True:
                    await asyncio.sleep(0.05)
                    stamps.append(time.monotonic())

            ticker = asyncio.create_task(tick())
            t0 = time.monotonic()
            with pytest.raises(FileOpError) as err:
                async with asyncio.timeout(30):
                    await sb.search(".", "(a+)+$")
            end = time.monotonic()
            ticker.cancel()
            took = end - t0
            # Stopped by its own limit: the alarm's message (the runner's fallback, ten seconds later,
            # has no word of backtracking), and not before the limit (load only lengthens `took`).
            assert err.value.kind == "timeout" and "backtrack" in str(err.value), err.value
            assert took > 0.9, took
            # The loop ran all along: a loop held by the search has one gap between ticks as long as
            # the search itself; a running one only ever waits a tick and the host's scheduling. Judged
            # against the search's own length, not a fixed rate of ticks a loaded host cannot keep.
            marks = [t0, *[s for s in stamps if s < end], end]
            gap = max(b - a for a, b in zip(marks, marks[1:]))
            assert gap < took / 2, (gap, took)
            assert (await sb.search(".", "a!"))[0] == ["a.txt:1: " + "a" * 100 + "!"]  # the sandbox still serves
        finally:
            await sb.close()

    asyncio.run(body())
