"""Copying a directory out of an image as a tar stream (`<engine> cp CTR:/app/. -`) into a host seed
directory, keeping each entry's numeric owner and mode (see images.ImageChecker.seed).

Why a stream: `podman cp`/`docker cp` into a host directory give every file to the user running
the command, so an image whose USER is not root could read but not change what it shipped at its
cwd. The archive's headers carry owners instead, and `tarfile` run as root applies them
(`numeric_owner`); container.ContainerSandbox._copy_in keeps them with `cp -a` and shifts them into
the run's user namespace. What the headers say depends on the engine: Docker's archive has each
file's own owner; Podman's (4.x, copyToArchive) gives every entry the container's USER (root for
an image without one), so with Podman the seeded files are all the image user's, which is what
SWE-style images need. A runner that is not root (rootless Podman) cannot chown: tarfile then
leaves the files the runner's, as before.

The archive is untrusted input to a root process (the image comes from the user's dataset, not the
model, and seeding happens before any sample runs, but an image must not reach the host through
it). Checks, per entry, before tarfile touches the disk (`_Guard`, the extraction filter):
regular files, directories, symbolic and hard links only (devices and FIFOs are skipped, never made
on the host); plain relative names (no absolute path, no `..`); each name once; no entry at or
beneath a symbolic link made by an earlier entry (nothing is ever written, chowned or chmodded
through a link: the check is on names, so it cannot be fooled by how the kernel resolves them);
a hard link only to a regular file extracted before. Symbolic links themselves are kept as they
are, also when they point outside (a venv's bin/python -> /usr/bin/python3): they are resolved
inside the container. The standard library's `tar` filter runs too (its path checks), but its mode
changes are not applied: setuid bits and group/other write are the image's. The total read is capped
while reading (`limit`, headers included), not after the fact. The seed directory is the caller's
0700 one and keeps its own owner and mode (an entry for `.` is skipped).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from trajforge.sandbox.interface import Copied, SandboxError


class _Guard:
    """The extraction filter: refuses (SandboxError) what could reach outside `dest`, skips devices."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit, self.what = limit, what
        self.kinds: dict[str, str] = {}  # name -> "directory" | "file" | "symbolic link", as extracted

    def _refuse(self, member: tarfile.TarInfo, why: str) -> SandboxError:
        return SandboxError(f"cannot read {self.what}: its archive entry {member.name!r} {why}")

    def _plain(self, member: tarfile.TarInfo, name: str) -> str:
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if name.startswith("/") or ".." in parts:
            raise self._refuse(member, f"names {name!r}, not a path beneath the directory")
        return "/".join(parts)

    def __call__(self, member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        read = member.offset_data + max(member.size, 0)
        if read > self.limit:
            raise SandboxError(f"{self.what} holds at least {read >> 20} MiB; the workspace mounted there would "
                               f"need a copy per sample (limit {self.limit >> 20} MiB): use another cwd")
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            return None  # a device, FIFO or unknown type: not made on the host
        name = self._plain(member, member.name)
        if not name:
            return None  # the directory itself: the seed directory keeps its owner and mode
        parts = name.split("/")
        for i in range(1, len(parts)):
            kind = self.kinds.setdefault("/".join(parts[:i]), "directory")
            if kind != "directory":
                raise self._refuse(member, f"is beneath a {kind} ({'/'.join(parts[:i])})")
        kind = "directory" if member.isdir() else "symbolic link" if member.issym() else "file"
        if name in self.kinds and not (kind == self.kinds[name] == "directory"):
            raise self._refuse(member, f"comes again (a {self.kinds[name]} before)")
        linkname = member.linkname
        if member.islnk():
            linkname = self._plain(member, member.linkname)
            if self.kinds.get(linkname) != "file":
                raise self._refuse(member, f"is a hard link to {member.linkname!r}, not a file before it")
        tarfile.tar_filter(member, dest)  # the standard checks as well; its changed modes are not used
        self.kinds[name] = kind
        return member.replace(name=name, linkname=linkname, deep=False)


def unpack(stream: IO[bytes], dest: Path, *, limit: int, what: str) -> int:
    """Extract the tar archive read from `stream` into `dest` (an existing directory); the number of
    entries read. Raises SandboxError when an entry is refused or the total passes `limit` bytes,
    tarfile.TarError for a broken archive. `what` names the directory in messages."""
    guard = _Guard(limit, what)
    with tarfile.open(fileobj=stream, mode="r|*") as tar:
        try:
            tar.extractall(dest, numeric_owner=True, filter=guard)
        except tarfile.FilterError as e:
            raise SandboxError(f"cannot read {what}: {e}") from e
        return len(tar.members)


def _drain(proc: subprocess.Popen[bytes], unpacker: Callable[[IO[bytes]], object]) -> BaseException | None:
    """In a thread: unpack the process's output with `unpacker`; the error that stopped it, if any."""
    assert proc.stdout is not None
    try:
        if proc.stdout.peek(1):  # no output at all: the engine failed (no such directory)
            unpacker(proc.stdout)
            while proc.stdout.read(1 << 16):  # the archive's padding: the engine exits 0 having written it
                pass
        return None
    except BaseException as e:  # noqa: BLE001 (handed to the caller, who also has the exit status)
        if proc.poll() is None:
            proc.kill()
        return e
    finally:
        proc.stdout.close()
        proc.wait()


async def _stream(argv: list[str], env: dict[str, str], unpacker: Callable[[IO[bytes]], object], *, what: str,
                  timeout: float, dest: Path | None = None) -> tuple[BaseException | None, int, str]:
    """Run `argv` and unpack its output in a thread: (the error that stopped the unpacking, the exit
    status, the last of its stderr). On a timeout or cancellation the process is killed, which ends
    the thread's read (and `dest`, when given, is removed once it has)."""
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=env,
                                    cwd="/")
        except OSError as e:
            raise SandboxError(f"cannot read {what}: {e}") from e
        work = asyncio.ensure_future(asyncio.to_thread(_drain, proc, unpacker))
        try:
            error = await asyncio.wait_for(asyncio.shield(work), timeout)
        except BaseException as e:
            if proc.poll() is None:
                proc.kill()
            if dest is not None:
                work.add_done_callback(lambda _: shutil.rmtree(dest, ignore_errors=True))
            if isinstance(e, TimeoutError):
                raise SandboxError(f"cannot read {what}: copying it out took over {timeout:g}s") from None
            raise
        err.seek(0)
        said = err.read(100_000).decode(errors="replace").strip()
    return error, proc.returncode, said


def _why(error: BaseException | None, said: str, code: int) -> str:
    return str(error) if error is not None else said.splitlines()[-1][:300] if said else f"exit {code}"


async def copy_out(argv: list[str], env: dict[str, str], dest: Path, *, limit: int, what: str,
                   timeout: float) -> bool:
    """Run `argv` (an engine's `cp CTR:DIR/. -`) and unpack its archive into `dest`, in a thread.
    False, as before, when the engine failed without writing anything (no such directory) or the
    directory is empty; SandboxError when it is too large, refused, broken, failed partway or not
    read within `timeout` seconds. `dest` is removed whenever no seed comes of it."""
    error, code, said = await _stream(argv, env, lambda out: unpack(out, dest, limit=limit, what=what), what=what,
                                      timeout=timeout, dest=dest)
    with os.scandir(dest) as entries:
        got = next(entries, None) is not None
    if error is not None or code != 0 or not got:
        shutil.rmtree(dest, ignore_errors=True)
    if isinstance(error, SandboxError):
        raise error
    if code != 0 and not got:
        return False  # no such directory in the image (or not one)
    if code != 0 or error is not None:
        raise SandboxError(f"cannot read {what}: {_why(error, said, code)}")
    return got  # False: an empty directory


class _Capped:
    """The guard of a copy that keeps what fits: regular files past `limit` bytes are left out
    (counted); what is kept is the runner's."""

    def __init__(self, limit: int, what: str) -> None:
        self.guard = _Guard(1 << 62, what)
        self.limit, self.kept, self.left_out, self.left_out_bytes = limit, 0, 0, 0
        self.dropped: set[str] = set()

    def __call__(self, member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        if member.islnk() and member.linkname in self.dropped:
            return None  # a hard link to a file left out
        if member.isreg() and self.kept + member.size > self.limit:
            self.left_out += 1
            self.left_out_bytes += member.size
            self.dropped.add(member.name)
            return None
        kept = self.guard(member, dest)
        if kept is not None and kept.isreg():
            self.kept += kept.size
        # The runner's own files: an owner of the container's user namespace would mean nothing on
        # the host, and the engine could not map it back on the way into another container.
        return kept.replace(uid=os.getuid(), gid=os.getgid(), uname="", gname="", deep=False) if kept else None


def _unpack_capped(stream: IO[bytes], dest: Path, cap: _Capped) -> None:
    with tarfile.open(fileobj=stream, mode="r|*") as tar:
        for member in tar:  # one by one: a file left out is read past, not kept in memory
            tar.extract(member, dest, numeric_owner=True, filter=cap)


async def copy_tree_out(argv: list[str], env: dict[str, str], dest: Path, *, limit: int, what: str,
                        timeout: float) -> Copied | None:
    """Run `argv` (an engine's `cp CTR:DIR/. -`) and unpack its archive into `dest` as `unpack`
    would, keeping files until `limit` bytes and leaving out (counting) those past it; None when
    the engine wrote nothing (no such directory). SandboxError for a refused or broken archive,
    a failure partway, or `timeout` seconds passed."""
    cap = _Capped(limit, what)
    error, code, said = await _stream(argv, env, lambda out: _unpack_capped(out, dest, cap), what=what,
                                      timeout=timeout)
    if isinstance(error, SandboxError):
        raise error
    if code != 0 and error is None and cap.kept == 0 and cap.left_out == 0:
        return None
    if code != 0 or error is not None:
        raise SandboxError(f"cannot read {what}: {_why(error, said, code)}")
    return Copied(cap.kept, cap.left_out, cap.left_out_bytes)
