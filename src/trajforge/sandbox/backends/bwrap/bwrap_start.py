"""Starting bwrap processes: the helper of a user-mode sample, and the holder of a namespace.

User mode (`start_user`): the helper is bwrap's command, started with a host interpreter visible
inside (helper_python), its source on stdin. Root mode runs one bwrap per run, the holder of the
template namespace (bwrap_runtime.py): `cat`, which echoes one line once bwrap has set everything
up (`holder_ready`). Both hand the mount setup to bwrap through `--args` (a pipe), so
/proc/1/cmdline inside shows no host path. A user-mode helper also gets the sample's seccomp
filter (seccomp.py), through bwrap's `--seccomp` (a pipe).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from pathlib import Path

from trajforge.sandbox.inside import helper
from trajforge.sandbox.interface import SandboxError
from trajforge.sandbox.channel import HelperChannel
from trajforge.sandbox.process import SAFE_PATH, kill_group
from trajforge.sandbox.host.seccomp import sample_program

START_TIMEOUT = 10.0
_BOOT = "import os;exec(compile(os.read(0,1<<17),'helper','exec'))"
_SOURCE: dict[bool, bytes] = {}  # the same for every sample: made once per process

Started = tuple[asyncio.subprocess.Process, HelperChannel]


def args_pipe(args: list[str]) -> int:
    """A pipe holding bwrap's NUL-separated arguments (a few KB: fits the pipe); its read end."""
    return pipe_of(b"".join(a.encode() + b"\0" for a in args))


def pipe_of(data: bytes) -> int:
    """A pipe holding `data`, its read end. The write never blocks: `data` must fit the pipe's
    64 KiB buffer (bwrap's arguments, the seccomp filter, the helper's source all do)."""
    assert len(data) < 60_000
    r, w = os.pipe()
    try:
        os.write(w, data)
    finally:
        os.close(w)
    return r


async def holder_ready(holder: asyncio.subprocess.Process) -> int:
    """Wait for `cat` to echo (the sandbox is set up); the pid of the namespaces' init."""
    assert holder.stdin is not None and holder.stdout is not None and holder.stderr is not None
    try:
        async with asyncio.timeout(START_TIMEOUT):
            holder.stdin.write(b"up\n")
            line = await holder.stdout.readline()
    except TimeoutError:
        raise SandboxError(f"bwrap did not start within {START_TIMEOUT:g}s") from None
    except (OSError, ConnectionError):
        line = b""
    if line != b"up\n":
        err = (await holder.stderr.read()).decode(errors="replace").strip()
        raise SandboxError(f"bwrap failed to start: {err[-300:] or 'no output'}")
    # `cat` answered, so the namespaces are set up; bwrap's only child is their init.
    try:
        with open(f"/proc/{holder.pid}/task/{holder.pid}/children", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError) as e:
        raise SandboxError(f"cannot find the sandbox's init process: {e}") from None


async def start_user(argv: list[str], python: str, *, output_cap: int) -> Started:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # --as-pid-1: the helper is the pid namespace's init, which the kernel shields from every
    # signal sent inside without a handler (`kill -9 -1` spares it).
    # bwrap installs the sample's filter (seccomp.py) on the helper, whose every command inherits
    # it: among others, no sample makes a user namespace of its own inside the one bwrap made for it.
    program = sample_program(os.uname().machine)
    filters = [pipe_of(program)] if program is not None else []
    args_r = args_pipe([*argv[1:], "--as-pid-1", *(a for fd in filters for a in ("--seccomp", str(fd)))])
    src_r = pipe_of(helper_source())  # the source comes on stdin, not argv: `ps` inside shows a one-liner
    try:
        holder = await asyncio.create_subprocess_exec(
            argv[0], "--args", str(args_r), python, "-S", "-I", "-c", _BOOT, str(theirs.fileno()),
            stdin=src_r, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            env={"PATH": SAFE_PATH}, pass_fds=(args_r, theirs.fileno(), *filters), start_new_session=True,
        )
    except OSError as e:
        ours.close()
        raise SandboxError(f"cannot start bwrap: {e}") from e
    finally:
        for fd in (args_r, src_r, *filters):
            os.close(fd)
        theirs.close()
    return holder, HelperChannel(ours, output_cap)


async def configure(channel: HelperChannel, holder: asyncio.subprocess.Process, cfg: dict[str, object]) -> None:
    """User mode: the helper's first frame is its configuration; SandboxError with bwrap's own
    words if it never answers."""
    try:
        async with asyncio.timeout(START_TIMEOUT):
            await channel.call({"id": 0, **cfg})
    except (TimeoutError, SandboxError) as e:
        why = "did not start within %gs" % START_TIMEOUT if isinstance(e, TimeoutError) else "failed to start"
        err = b""
        if holder.stderr is not None:
            holder.kill()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2):
                    err = await holder.stderr.read()
        raise SandboxError(f"bwrap {why}: {err.decode(errors='replace').strip()[-300:] or 'no output'}") from None


async def stop_holder(holder: asyncio.subprocess.Process) -> None:
    """User mode, once the channel is closed: bwrap reaps the helper and exits; killing bwrap
    first would leave the helper a zombie of whatever reaps orphans on this host."""
    for grace in (2.0, 5.0):
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await asyncio.shield(holder.wait())
        if holder.returncode is not None:
            return
        kill_group(holder)  # a helper stuck in the kernel: --die-with-parent ends it


def helper_source(zygote: bool = False) -> bytes:
    """The helper script (helper.source), with the zygote's code when `zygote`."""
    if zygote not in _SOURCE:
        _SOURCE[zygote] = helper.source(zygote).encode()
    return _SOURCE[zygote]


def helper_python(visible: tuple[str, ...]) -> tuple[str, list[str]]:
    """The interpreter of the helper and what must be bound read-only for it to run inside:
    a python3 under /usr (already visible) if the host has one, else the runner's own."""
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        real = os.path.realpath(cand)
        if os.access(real, os.X_OK) and real.split("/")[1] in visible:
            return real, []
    base = os.path.realpath(sys.base_prefix)
    exe = os.path.join(base, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    return exe, [base]


def chown_beneath(root: Path, parts: tuple[str, ...], uid: int) -> None:
    """chown root and each component of root/parts to uid, never following a symlink.

    Components are opened one by one relative to the previous one with O_NOFOLLOW, so a
    sandboxed process swapping a directory for a symlink meanwhile cannot make the runner
    (root) chown anything outside the workspace."""
    with contextlib.suppress(OSError):
        fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            if os.fstat(fd).st_uid != uid:
                os.chown(root, uid, uid, follow_symlinks=False)  # the workspace: the runner's own path
            for i, part in enumerate(parts):
                if os.stat(part, dir_fd=fd, follow_symlinks=False).st_uid != uid:
                    os.chown(part, uid, uid, dir_fd=fd, follow_symlinks=False)
                if i + 1 < len(parts):
                    nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                    os.close(fd)
                    fd = nxt
        finally:
            os.close(fd)
