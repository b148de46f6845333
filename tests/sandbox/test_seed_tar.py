"""Unpacking an image directory's tar stream into a seed directory (sandbox/seed_tar.py), on hand-made
archives: owners and modes kept (as root), hostile entries refused with nothing made outside the
destination, devices and FIFOs skipped, the size cap applied while reading; and the engine process
around it (a real `sh`/`cat` in the engine's place): no output, a timeout, a cancellation."""

from __future__ import annotations

import asyncio
import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from trajforge.sandbox.interface import SandboxError
from trajforge.sandbox.backends.container.seed_tar import copy_out, unpack

MIB = 1 << 20


def entry(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", *, mode: int = 0o644, uid: int = 0,
          gid: int = 0, link: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.uid, info.gid, info.linkname, info.mtime = kind, mode, uid, gid, link, 1_700_000_000
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data


def archive(*entries: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buf.getvalue()


class Counting(io.RawIOBase):
    """A stream that counts what was read from it (the cap must stop reading, not check afterwards)."""

    def __init__(self, data: bytes) -> None:
        self.inner, self.read_bytes = io.BytesIO(data), 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray) -> int:  # type: ignore[override]
        n = self.inner.readinto(b)
        self.read_bytes += n
        return n


@pytest.fixture
def places(tmp_path: Path) -> tuple[Path, Path]:
    """(dest, outside): the destination and a sibling directory with a file a hostile archive aims at."""
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir(mode=0o700)
    outside.mkdir()
    (outside / "secret").write_text("host\n")
    return dest, outside


def untouched(tmp_path: Path, outside: Path) -> None:
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "outside"]
    assert [p.name for p in outside.iterdir()] == ["secret"]
    st = os.stat(outside / "secret")
    assert (outside / "secret").read_text() == "host\n" and st.st_nlink == 1 and st.st_uid == os.geteuid()


def unpack_bytes(data: bytes, dest: Path, limit: int = MIB) -> int:
    return unpack(io.BytesIO(data), dest, limit=limit, what="/app in image 'test'")


def test_owners_modes_and_links_are_kept(places: tuple[Path, Path]) -> None:
    if os.geteuid() != 0:
        pytest.skip("keeping other users' owners needs root (a non-root runner's files stay its own)")
    dest, _ = places
    count = unpack_bytes(archive(
        entry(".", tarfile.DIRTYPE, mode=0o755, uid=1000, gid=1000),
        entry("repo", tarfile.DIRTYPE, mode=0o2775, uid=1000, gid=1001),
        entry("repo/readme.txt", data=b"hi\n", mode=0o664, uid=1000, gid=1001),
        entry("repo/tool", data=b"#!/bin/sh\n", mode=0o4755, uid=0, gid=50),
        entry("repo/same", tarfile.LNKTYPE, link="repo/readme.txt", mode=0o664, uid=1000, gid=1001),
        entry("repo/python", tarfile.SYMTYPE, link="/usr/bin/python3", mode=0o777, uid=1000, gid=1000),
        entry("repo/up", tarfile.SYMTYPE, link="../..", mode=0o777, uid=7, gid=7),
        entry("ro", tarfile.DIRTYPE, mode=0o555, uid=1000, gid=1000),
        entry("ro/inside.txt", data=b"x", mode=0o444, uid=1000, gid=1000),
    ), dest)
    assert count == 9

    def owner(rel: str) -> tuple[int, int, int]:
        st = os.lstat(dest / rel)
        return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)

    assert owner("repo") == (1000, 1001, 0o2775)
    assert owner("repo/readme.txt") == (1000, 1001, 0o664)  # group write: the image's, not the tar filter's
    assert owner("repo/tool") == (0, 50, 0o4755)  # setuid kept: the image's file, in a root-only directory
    assert os.lstat(dest / "repo/same").st_ino == os.lstat(dest / "repo/readme.txt").st_ino
    assert owner("ro") == (1000, 1000, 0o555) and (dest / "ro/inside.txt").read_bytes() == b"x"
    # Links that point outside are kept as links (resolved inside the container), owned as given.
    assert os.readlink(dest / "repo/python") == "/usr/bin/python3" and os.lstat(dest / "repo/python").st_uid == 1000
    assert os.readlink(dest / "repo/up") == "../.." and os.lstat(dest / "repo/up").st_uid == 7
    assert owner(".") == (0, 0, 0o700)  # the entry for the directory itself is skipped
    assert os.lstat(dest / "repo/readme.txt").st_mtime == 1_700_000_000


@pytest.mark.parametrize("hostile", [
    [entry("../escape", data=b"pwned")],
    [entry("a/../../escape", data=b"pwned")],
    [entry("/escape", data=b"pwned")],
    [entry("out", tarfile.SYMTYPE, link="{outside}"), entry("out/escape", data=b"pwned")],
    [entry("out", tarfile.SYMTYPE, link="../outside"), entry("out/sub", tarfile.DIRTYPE, uid=1000)],
    [entry("m", tarfile.SYMTYPE, link="{outside}/secret"), entry("m", data=b"pwned", mode=0o777)],
    [entry("m", tarfile.SYMTYPE, link="{outside}/secret"), entry("m", tarfile.DIRTYPE, mode=0o777, uid=1000)],
    [entry("h", tarfile.LNKTYPE, link="../outside/secret"), entry("h", data=b"pwned")],
    [entry("h", tarfile.LNKTYPE, link="{outside}/secret")],
    [entry("s", tarfile.SYMTYPE, link="{outside}/secret"), entry("h", tarfile.LNKTYPE, link="s"),
     entry("h", data=b"pwned")],
    [entry("d", tarfile.SYMTYPE, link="{outside}"), entry("h", tarfile.LNKTYPE, link="d/secret")],
], ids=["dotdot", "dotdot-inside", "absolute", "through-symlink", "dir-through-symlink", "file-over-symlink",
        "dir-over-symlink", "hardlink-dotdot", "hardlink-absolute", "hardlink-to-symlink", "hardlink-via-symlink"])
def test_hostile_entries_are_refused_and_nothing_is_made_outside(
        hostile: list[tuple[tarfile.TarInfo, bytes]], places: tuple[Path, Path], tmp_path: Path) -> None:
    dest, outside = places
    aimed = [(info.replace(linkname=info.linkname.replace("{outside}", str(outside))), data) for info, data in hostile]
    with pytest.raises(SandboxError, match=r"cannot read /app in image 'test': "):
        unpack_bytes(archive(entry("before.txt", data=b"ok"), *aimed), dest)
    untouched(tmp_path, outside)
    assert not (tmp_path / "escape").exists() and not Path("/escape").exists()


def test_devices_and_fifos_are_skipped(places: tuple[Path, Path]) -> None:
    dest, _ = places
    fifo, _ = entry("fifo", tarfile.FIFOTYPE)
    mem, _ = entry("mem", tarfile.CHRTYPE, mode=0o666)
    mem.devmajor, mem.devminor = 1, 1  # /dev/mem
    disk, _ = entry("disk", tarfile.BLKTYPE, mode=0o666)
    disk.devmajor, disk.devminor = 8, 0
    unpack_bytes(archive((fifo, b""), (mem, b""), (disk, b""), entry("after.txt", data=b"ok")), dest)
    assert sorted(os.listdir(dest)) == ["after.txt"]


def test_the_size_cap_stops_reading(places: tuple[Path, Path]) -> None:
    dest, _ = places
    data = archive(entry("small.txt", data=b"s"), *(entry(f"big{i}", data=b"\0" * MIB) for i in range(4)))
    stream = Counting(data)
    with pytest.raises(SandboxError, match=r"^/app in image 'test' holds at least 2 MiB; .* \(limit 1 MiB\): use "
                                           r"another cwd$"):
        unpack(io.BufferedReader(stream, 4096), dest, limit=MIB + MIB // 2, what="/app in image 'test'")
    assert stream.read_bytes < 2 * MIB < len(data)  # stopped at the entry that passed the cap
    assert sorted(os.listdir(dest)) == ["big0", "small.txt"]


def test_copy_out_runs_the_engine_and_keeps_its_rules(places: tuple[Path, Path], tmp_path: Path) -> None:
    """The engine's place taken by real processes: an archive on stdout; a failure that writes nothing
    (no such directory: False, as before); an empty directory; a failure partway; a timeout and a
    cancellation that kill the process. `dest` goes away whenever no seed comes of it."""
    dest, _ = places
    good = tmp_path / "good.tar"
    good.write_bytes(archive(entry("readme.txt", data=b"hi\n")))
    empty = tmp_path / "empty.tar"
    empty.write_bytes(archive())
    pidfile = tmp_path / "pid"

    def run(argv: list[str], target: Path, timeout: float = 30) -> bool:
        target.mkdir(exist_ok=True)
        return asyncio.run(copy_out(argv, {"PATH": "/usr/bin:/bin"}, target, limit=MIB, what="/app in image 't'",
                                    timeout=timeout))

    assert run(["cat", str(good)], dest) and (dest / "readme.txt").read_text() == "hi\n"
    for argv in (["sh", "-c", "echo 'Error: no such file or directory' >&2; exit 125"], ["cat", str(empty)]):
        assert run(argv, tmp_path / "d2") is False and not (tmp_path / "d2").exists()
    with pytest.raises(SandboxError, match="cannot read /app in image 't': broke"):
        run(["sh", "-c", f"cat {good}; echo broke >&2; exit 1"], tmp_path / "d3")
    assert not (tmp_path / "d3").exists()
    with pytest.raises(SandboxError, match="took over 0.5s"):
        run(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 30"], tmp_path / "d4", timeout=0.5)
    assert gone(int(pidfile.read_text()))

    async def cancelled() -> None:
        (tmp_path / "d5").mkdir()
        argv = ["sh", "-c", f"echo $$ > {pidfile}.2; exec sleep 30"]
        task = asyncio.ensure_future(copy_out(argv, {}, tmp_path / "d5", limit=MIB, what="x", timeout=60))
        while not Path(f"{pidfile}.2").exists():
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        pid = int(Path(f"{pidfile}.2").read_text())
        for _ in range(100):
            if gone(pid):
                break
            await asyncio.sleep(0.05)
        assert gone(pid)

    asyncio.run(cancelled())


def gone(pid: int) -> bool:
    """The process has exited and been reaped (the reading thread waits for it)."""
    return not os.path.exists(f"/proc/{pid}")
