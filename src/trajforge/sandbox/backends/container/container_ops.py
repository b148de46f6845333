"""What task environments need of a started container beyond the Sandbox interface.

Hidden tests run in the agent's container after the agent (trajforge.tasks.verify), which needs
operations no tool may have, each through the engine CLI on a started ContainerSandbox:
- `make_container`: a sample's container with limits of its own (a task's cpus, memory, storage,
  network), where container.make takes the run's;
- `pids` / `stop_all`: the processes running now, and SIGSTOP then SIGKILL of every process but a
  given set (the container's init and `sleep infinity`), pass after pass until one finds none;
- `exec_as`: a command as another user with an environment and a working directory, its process
  group killed inside at the timeout (container_argv's wrappers);
- `copy_in` / `read_file_out`: a host directory into the container, and one regular file out (as
  the engine's tar stream: a symbolic link is never followed, whatever the sample made of the path).
These are the engine's own operations, not the sample's: paths are the container's, unrestricted.
"""

from __future__ import annotations

import asyncio
import io
import os
import secrets
import tarfile
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import IO

from trajforge.catalog.sandboxes import NetworkMode
from trajforge.sandbox.interface import ExecResult, Provider, SandboxError
from trajforge.sandbox.backends.container.container_sandbox import ContainerSandbox, _engine_failed
from trajforge.sandbox.backends.container.container_argv import EXEC_WRAP, KILL_WRAP
from trajforge.sandbox.backends.container.container_backend import backend_for
from trajforge.sandbox.backends.container.container_engine import last_line
from trajforge.sandbox.process import run_argv

ROOT = "0:0"
_STOP_PASSES = 50
# Every process of the container but those in $1 (and the script itself): SIGSTOP all of a pass
# first, so none can fork while its siblings die, then SIGKILL them; zombies are skipped (their
# parent or the init reaps them). Exit 0 once a pass found nothing left, 1 if they kept coming.
_STOP_ALL = (
    'keep=" 1 $$ $1 "; n=0; while [ $n -lt ' + str(_STOP_PASSES) + ' ]; do n=$((n+1)); found=""; '
    'for d in /proc/[0-9]*; do p=${d#/proc/}; case "$keep" in *" $p "*) continue;; esac; '
    'read -r st 2>/dev/null < "$d/stat" || continue; st=${st##*) }; [ "${st%% *}" = Z ] && continue; '
    'kill -STOP "$p" 2>/dev/null && found="$found $p"; done; [ -z "$found" ] && exit 0; '
    'for p in $found; do kill -KILL "$p" 2>/dev/null; done; done; exit 1'
)


async def make_container(provider: Provider, *, image: str, cwd: str, root: Path, memory: int | None = None,
                         cpus: float | None = None, disk: int | None = None,
                         network_none: bool = False) -> ContainerSandbox:
    """An unstarted container sandbox like container.make's, with these limits instead of the run's
    (None: the run's): memory in bytes, CPUs, the workspace disk in bytes, no network at all."""
    settings, run = provider.settings, provider.settings.container
    backend = await backend_for(provider)
    limits = provider.sample_limits()
    if disk is not None:
        limits = replace(limits, disk=disk)
    return ContainerSandbox(
        root, backend=backend, image=image, cwd=cwd, network=NetworkMode.NONE if network_none else await provider.network_mode(),
        allow=settings.allow, limits=limits, memory=str(memory) if memory is not None else run.memory,
        pids_limit=run.pids_limit, cpus=cpus if cpus is not None else run.cpus, run_name=run.run_name,
        keep=settings.keep_workspaces,
    )


def _name(sb: ContainerSandbox) -> str:
    if sb.name is None:
        raise SandboxError("the container of this sample is gone")
    return sb.name


async def exec_as(sb: ContainerSandbox, command: str, *, timeout: float, user: str | None = None,
                  env: tuple[tuple[str, str], ...] = (), workdir: str | None = None,
                  output_cap: int = 1 << 20) -> ExecResult:
    """`sh -c command` (bash when the image has it) as `user` (None: the image's USER) with `env`,
    in `workdir` (default: the sample's working directory). At the timeout, or when cancelled, its
    process group is killed inside the container."""
    name, exec_id = _name(sb), secrets.token_hex(6)
    flags = ["--user", user] if user else []
    for key, value in env:
        flags += ["-e", f"{key}={value}"]
    argv = sb.engine.argv("exec", *flags, "-w", workdir or sb.cwd, name, "sh", "-c", EXEC_WRAP, "sh", exec_id,
                          command)
    try:
        res = await run_argv(argv, timeout=timeout, cwd="/", env=sb.engine.env, output_cap=output_cap)
    except BaseException:
        await asyncio.shield(_kill(sb, exec_id))
        raise
    if res.timed_out:
        await _kill(sb, exec_id)
    elif _engine_failed(res):
        raise SandboxError(f"{sb.engine.kind} exec in container {name} failed: {last_line(res)}")
    return res


async def _kill(sb: ContainerSandbox, exec_id: str) -> None:
    if sb.name is not None:
        await sb.engine.run("exec", "--user", ROOT, sb.name, "sh", "-c", KILL_WRAP, "sh", exec_id, timeout=30)


async def root_sh(sb: ContainerSandbox, script: str, *args: str, timeout: float = 60) -> ExecResult:
    """A sh script as the container's root, outside any wrapper (short administrative steps)."""
    res = await sb.engine.run("exec", "--user", ROOT, "-w", "/", _name(sb), "sh", "-c", script, "sh", *args,
                              timeout=timeout)
    if res.timed_out or _engine_failed(res):
        raise SandboxError(f"{sb.engine.kind} exec in container {sb.name} failed: {last_line(res)}")
    return res


async def pids(sb: ContainerSandbox) -> set[int]:
    """The processes of the container now (the listing shell itself left out)."""
    res = await root_sh(sb, 'for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = $$ ] || echo "$p"; done')
    return {int(p) for p in res.stdout.split() if p.isdigit()}


async def stop_all(sb: ContainerSandbox, keep: set[int]) -> None:
    """Kill every process of the container but `keep`; SandboxError when some keep coming back."""
    res = await root_sh(sb, _STOP_ALL, " ".join(map(str, sorted(keep))), timeout=120)
    if res.exit_code != 0:
        raise SandboxError(f"could not stop every process of container {sb.name} in {_STOP_PASSES} passes")


async def copy_in(sb: ContainerSandbox, source: Path, dest: str) -> None:
    """The contents of host directory `source` into the container's directory `dest` (which must exist),
    owned by the container's user (as `podman cp` does). On trajforge's root filesystem (rootfs.py)
    Podman writes an archive's ids as host ids: a tar stream then carries that user's host ids."""
    if sb.cp_owner is None:
        res = await sb.engine.run("cp", f"{source}/.", f"{_name(sb)}:{dest}", timeout=300)
        failed = last_line(res) if res.exit_code != 0 else ""
    else:
        with tempfile.TemporaryFile() as archive:
            await asyncio.to_thread(_tar_owned, source, archive, sb.cp_owner)
            proc = await asyncio.create_subprocess_exec(
                *sb.engine.argv("cp", "--archive=false", "-", f"{_name(sb)}:{dest}"), stdin=archive,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=sb.engine.env, cwd="/")
            try:
                async with asyncio.timeout(300):
                    _, err = await proc.communicate()
            except TimeoutError:
                err = b"timed out"
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        failed = last_line(ExecResult(proc.returncode, "", err.decode(errors="replace"))) if proc.returncode else ""
    if failed:
        raise SandboxError(f"cannot copy {source} into {dest} of container {sb.name}: {failed}")


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


async def read_file_out(sb: ContainerSandbox, path: str, limit: int) -> bytes | None:
    """The bytes of the container's regular file `path` (at most `limit`); None when there is none.
    ValueError when it is something else (a link, a directory) or larger than `limit`."""
    argv = sb.engine.argv("cp", f"{_name(sb)}:{path}", "-")
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                env=sb.engine.env, cwd="/")
    assert proc.stdout is not None and proc.stderr is not None
    try:
        async with asyncio.timeout(60):
            chunks, size, too_big = [], 0, False
            while chunk := await proc.stdout.read(1 << 16):
                size += len(chunk)
                if size > limit + (64 << 10):  # the tar stream's headers and padding aside
                    too_big = True
                    proc.kill()
                    break
                chunks.append(chunk)
            data = b"".join(chunks)
            err = await proc.stderr.read()
            code = await proc.wait()
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    if too_big:
        raise ValueError(f"larger than {limit} bytes")
    if code != 0:
        text = err.decode(errors="replace").lower()
        if "no such file" in text or "could not find" in text or "does not exist" in text:
            return None
        raise SandboxError(f"cannot read {path} from container {sb.name}: {err.decode(errors='replace')[-300:]}")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        member = next(iter(tar), None)
        if member is None or not member.isfile():
            raise ValueError("not a regular file" if member is not None else "empty archive")
        if member.size > limit:
            raise ValueError(f"larger than {limit} bytes")
        f = tar.extractfile(member)
        return f.read() if f is not None else b""

