"""The container backend's ImageSandbox: a sample's container with the runner's own operations.

Task environments (trajforge.tasks) run the solution and the hidden tests in a sample's
container after the agent, which needs operations no tool may have (sandbox/interface.py's
ImageSandbox), each through the engine CLI on a started ContainerSandbox:
- `make`: a sample's container, with a task's own limits (SampleResources: cpus, memory, storage,
  network) where given, else the run's;
- `run`: a program of the image (`bash /tests/test.sh`) through the engine's `exec`, no shell of
  the container in between, everything of the sample stopped from the host at its timeout;
- `stop_processes`: SIGSTOP then SIGKILL of every process but the container's own (its init and
  `sleep infinity`, there before the sample's first command), pass after pass until one finds
  none, from the host (from_host.py: nothing of the container runs, whatever it replaced);
- `fresh_dirs` / `remove`: directories removed and made anew (the tests', the logs'), from the host;
- `upload` / `download` / `download_tree`: a host directory into the container (the engine's
  `cp`), one regular file out (read from the host, no link followed) and a tree out (the engine's
  tar stream, links kept as links, checked entry by entry: seed_tar.py);
- `changes`: what the container changed of its own filesystem against its image: on trajforge's
  root filesystem its overlay's upper directory read from the host (overlay_diff.py), else the
  engine's diff.
These are the engine's own operations, not the sample's: paths are the container's, unrestricted.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import posixpath
import tarfile
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO

from trajforge.catalog.sandboxes import NetworkMode
from trajforge.sandbox.interface import (
    Change, Copied, ExecResult, ImageSandbox, Provider, SampleResources, SandboxError, SandboxSpoiled, Stopped,
)
from trajforge.sandbox.backends.container import from_host
from trajforge.sandbox.backends.container.sandbox import ContainerSandbox, _engine_failed
from trajforge.sandbox.backends.container.argv import pid_files
from trajforge.sandbox.backends.container.backend import backend_for
from trajforge.sandbox.backends.container.engine import last_line
from trajforge.sandbox.backends.container.overlay_diff import overlay_changes
from trajforge.sandbox.backends.container.seed_tar import copy_tree_out
from trajforge.sandbox.process import run_argv

RUN_OUTPUT_CAP = 1 << 20  # bytes kept per stream of a runner's own program (the tests')


async def make(provider: Provider, *, cwd: str | None, image: str | None, root: Path,
               resources: SampleResources | None = None) -> ContainerTaskSandbox:
    """An unstarted container sandbox (the spec's `make`): a row's image, or the run's
    `container_image`; with `resources`, those limits instead of the run's (None: the run's)."""
    settings, run = provider.settings, provider.settings.container
    image = image or run.image
    if image is None:
        raise SandboxError("--sandbox container needs an image: give the row an `image` field or set "
                           "`container_image` in the config file")
    r = resources or SampleResources()
    backend = await backend_for(provider)
    limits = provider.sample_limits()
    if r.disk is not None:
        limits = replace(limits, disk=r.disk)
    sb = ContainerTaskSandbox(
        root, backend=backend, image=image, cwd=cwd, allow=settings.allow, limits=limits,
        network=NetworkMode.NONE if r.network_none else await provider.network_mode(),
        memory=str(r.memory) if r.memory is not None else run.memory, pids_limit=run.pids_limit,
        cpus=r.cpus if r.cpus is not None else run.cpus, run_name=run.run_name, keep=settings.keep_workspaces,
    )
    sb.seeded = sb.seeded and r.seed
    return sb


def _stopped() -> SandboxSpoiled:
    return SandboxSpoiled("the sample's container stopped before the runner's next step: only its own processes "
                          "could stop it (its main process was killed, or it ran out of memory)",
                          kind="container_stopped")


def _full_or(e: OSError, kind: str) -> str:
    """disk_full when the sample's disk is full, else `kind`."""
    return "disk_full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else kind


class ContainerTaskSandbox(ContainerSandbox, ImageSandbox):
    """A sample's container with the runner's own operations (the module doc)."""

    _init: int | None = None  # host pid of the container's init, once asked
    _refused: int | None = 0  # forks its process limit refused, at the last stop_processes

    def _name(self) -> str:
        if self.name is None:
            raise SandboxError("the container of this sample is gone")
        return self.name

    async def _init_pid(self) -> int:
        """The host pid of the container's init; SandboxSpoiled when the container no longer runs
        (only its own processes can stop it: the runner has not)."""
        if self._init is not None and from_host.pid_ns(self._init) is not None:
            return self._init
        for last in (False, True):
            res = await self.engine.run("inspect", "--format", "{{.State.Pid}} {{.State.Running}} {{.Id}}",
                                        self._name(), timeout=60)
            pid, running, cid = (res.stdout.split() + ["", "", ""])[:3]
            if res.exit_code != 0:
                raise SandboxError(f"cannot inspect container {self.name} ({self.engine.kind}): {last_line(res)}")
            if running != "true" or not pid.isdigit() or pid == "0":
                raise _stopped()
            if from_host.is_init_of(pid, cid):
                self._init = int(pid)
                return self._init
            if not last and not os.path.exists(f"/proc/{pid}"):  # its init exiting as we looked
                await self.engine.run("wait", self._name(), timeout=10)
        raise SandboxError(f"the processes of container {self.name} are not on this host ({self.engine.kind} "
                           "elsewhere): the runner cannot act on them from outside")

    @contextlib.asynccontextmanager
    async def _from_host(self) -> AsyncIterator[int]:
        """The init's host pid for a step done from the host; its init ending meanwhile is the container stopping."""
        init = await self._init_pid()
        try:
            yield init
        except from_host.Gone:
            if await from_host.ended(init):  # exiting as we looked: its command was killed from inside
                raise _stopped() from None
            raise

    async def stop_processes(self) -> Stopped:
        async with self._from_host() as init:
            killed = await from_host.stop_all(init, has_init=bool(self.backend.init_flag))
        refused = from_host.forks_refused(init)
        note = None
        if refused and self._refused is not None and refused > self._refused:
            note = (f"the sample's processes had reached the container's limit of {self.pids_limit} ({refused} forks "
                    f"refused: a fork bomb?); the {killed} left were stopped from the host")
        self._refused = refused
        return Stopped(killed, note)

    async def _kill_inside(self, exec_id: str) -> None:
        """A command's process group, at its timeout or cancellation: from the host (the group id the
        command's wrapper wrote is read there, never followed through a link); where the container's
        processes are not on this host, with a command inside as before."""
        try:
            init = await self._init_pid()
        except SandboxSpoiled:
            return  # the container has stopped: nothing of it runs
        except SandboxError:
            await super()._kill_inside(exec_id)
            return
        for path in pid_files(exec_id):
            try:
                data = await asyncio.to_thread(from_host.read_file, init, path, 64)
            except (ValueError, SandboxError):
                continue
            if data is not None and data.strip().isdigit():
                with contextlib.suppress(OSError, SandboxError):  # SandboxError: the container stopped meanwhile
                    await from_host.kill_group(init, int(data))
                    await asyncio.to_thread(from_host.remove, init, path)

    async def run(self, argv: Sequence[str], *, timeout: float, user: str | None = None,
                  env: Mapping[str, str] | None = None) -> ExecResult:
        flags = ["--user", user] if user else []
        for key, value in (env or {}).items():
            flags += ["-e", f"{key}={value}"]
        cmd = self.engine.argv("exec", *flags, "-w", self.cwd, self._name(), *argv)
        try:
            res = await run_argv(cmd, timeout=timeout, cwd="/", env=self.engine.env, output_cap=RUN_OUTPUT_CAP)
        except BaseException:  # cancelled: nothing it started may outlive the call
            await asyncio.shield(self.stop_processes())
            raise
        if res.timed_out:
            await self.stop_processes()
        elif _engine_failed(res):
            raise SandboxError(f"{self.engine.kind} exec in container {self.name} failed: {last_line(res)}")
        return res

    async def fresh_dirs(self, dirs: Mapping[str, int]) -> None:
        try:
            async with self._from_host() as init:
                await asyncio.to_thread(from_host.fresh_dirs, init, dirs)
        except OSError as e:
            raise SandboxSpoiled(f"cannot make {', '.join(dirs)} anew in the container: {e.strerror or e} "
                                 f"({os.fsdecode(e.filename) if e.filename else 'the container root'})",
                                 kind=_full_or(e, "reset_failed")) from None

    async def remove(self, path: str) -> None:
        try:
            async with self._from_host() as init:
                await asyncio.to_thread(from_host.remove, init, path)
        except OSError as e:
            raise SandboxSpoiled(f"cannot remove {path} in the container: {e.strerror or e}",
                                 kind=_full_or(e, "reset_failed")) from None

    async def upload(self, source: Path, path: str) -> None:
        inside = self._in_workspace(path)
        if inside is not None:  # a host directory: copied there as it is (owners too: the run's id map)
            await self._copy_in_workspace(source, inside)
            return
        try:  # the directory, made where missing (no link followed), the container root's
            async with self._from_host() as init:
                await asyncio.to_thread(from_host.make_dirs, init, path)
        except OSError as e:
            raise SandboxSpoiled(f"cannot make {path} in the container: {e.strerror or e}",
                                 kind=_full_or(e, "reset_failed")) from None
        failed = await self._engine_copy(source, path)
        if failed:
            why = f"cannot copy {source} into {path} of container {self.name}: {failed}"
            if "no space left" in why.lower():
                raise SandboxSpoiled(why, kind="disk_full")
            raise SandboxError(why)

    async def _engine_copy(self, source: Path, dest: str) -> str:
        """The contents of host directory `source` into the container's directory `dest` with the
        engine's `cp`, owned by the container's user as `podman cp` makes them; on trajforge's root
        filesystem (rootfs.py) Podman writes an archive's ids as host ids, so a tar stream then
        carries that user's host ids (cp_owner). The engine's error, or "" once copied."""
        if self.cp_owner is None:
            res = await self.engine.run("cp", f"{source}/.", f"{self._name()}:{dest}", timeout=600)
            return last_line(res) if res.exit_code != 0 else ""
        with tempfile.TemporaryFile() as archive:
            await asyncio.to_thread(_tar_owned, source, archive, self.cp_owner)
            proc = await asyncio.create_subprocess_exec(
                *self.engine.argv("cp", "--archive=false", "-", f"{self._name()}:{dest}"), stdin=archive,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=self.engine.env, cwd="/")
            try:
                async with asyncio.timeout(600):
                    _, err = await proc.communicate()
            except TimeoutError:
                err = b"timed out"
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        return last_line(ExecResult(proc.returncode or 0, "", err.decode(errors="replace"))) if proc.returncode else ""

    def _in_workspace(self, path: str) -> Path | None:
        """The host directory of container path `path` when it is the workspace or beneath it."""
        norm = posixpath.normpath(path)
        if self.workspace is None or not (norm == self.mount_at or norm.startswith(self.mount_at.rstrip("/") + "/")):
            return None
        return self.workspace / posixpath.relpath(norm, self.mount_at)

    async def _copy_in_workspace(self, source: Path, dest: Path) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        proc = await asyncio.create_subprocess_exec("cp", "-a", "--", f"{source}/.", str(dest),
                                                    stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        _, err = await proc.communicate()
        if proc.returncode != 0:
            why = err.decode(errors="replace").strip()[-300:]
            raise SandboxSpoiled(f"cannot copy {source} into the workspace: {why}", kind="disk_full") \
                if "No space left" in why else SandboxError(f"cannot copy {source} into the workspace: {why}")
        if self._res is not None:
            self._res.check()  # the workspace disk's limit: SandboxLimitError when it is full

    async def download(self, path: str, limit: int) -> bytes | None:
        async with self._from_host() as init:
            return await asyncio.to_thread(from_host.read_file, init, path, limit)

    async def download_tree(self, path: str, dest: Path, limit: int) -> Copied | None:
        return await copy_tree_out(self.engine.argv("cp", f"{self._name()}:{path.rstrip('/')}/.", "-"),
                                   self.engine.env, dest, limit=limit, what=f"{path} of container {self.name}",
                                   timeout=600)

    async def changes(self, wanted: Callable[[str], bool]) -> list[Change] | None:
        """On trajforge's root filesystem, its upper directory read from the host (overlay_diff.py);
        else the engine's diff, read line by line (it may list every file of a large install)."""
        disk = self._res.disk if self._res is not None else None
        if disk is not None and disk.layers is not None:
            return await asyncio.to_thread(overlay_changes, *disk.layers, wanted)
        proc = await asyncio.create_subprocess_exec(*self.engine.argv("diff", self._name()),
                                                    stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.DEVNULL, env=self.engine.env, cwd="/")
        assert proc.stdout is not None
        found = []
        try:
            async with asyncio.timeout(300):
                async for raw in proc.stdout:
                    kind, _, path = raw.decode(errors="replace").rstrip("\n").partition(" ")
                    if kind in ("A", "C", "D") and path.startswith("/") and wanted(path):
                        found.append(Change(kind, path))
                code = await proc.wait()
        except BaseException:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
        return found if code == 0 else None


def _tar_owned(source: Path, archive: IO[bytes], owner: tuple[int, int]) -> None:
    """`source`'s contents (not itself: `dest` keeps its mode) as a tar archive, links kept as links,
    every entry owned by `owner` (uid, gid)."""
    def owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid, info.gid = owner
        info.uname = info.gname = ""
        return info

    with tarfile.open(fileobj=archive, mode="w") as tar:
        for entry in sorted(os.listdir(source)):
            tar.add(source / entry, arcname=entry, filter=owned)
    archive.seek(0)
