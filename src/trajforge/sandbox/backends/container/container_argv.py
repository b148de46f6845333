"""What the container engine is told for one sample: the `run` command line and the sh wrappers.

Pure strings and lists (container_sandbox.py runs them): `run_args` is the one place to add a `run`
option. Every `exec` runs its command under a small sh wrapper, because killing the engine's exec
client does not stop the process inside (container_sandbox.py's module doc): EXEC_WRAP records the
command's process group under /dev/shm (or /tmp) for KILL_WRAP; SPAWN_WRAP (background jobs) keeps
the client's stdin and kills the group when it closes. Each picks bash when the image has it.
"""

from __future__ import annotations

import os
import socket

from trajforge.catalog.sandboxes import NetworkMode
from trajforge.sandbox.host.resources import ResourceLimits

ID_RANGE = 65536  # ids of a container's user namespace: 0 to 65535 inside

WORKSPACE = "/workspace"
JOB_LOG_BYTES = 64 << 20  # a background job's log, kept on the host (the model reads 50 KB a poll)
_SHELL_PICK = 'if command -v bash >/dev/null 2>&1; then bash -c "$2"{r}; else sh -c "$2"{r}; fi; rc=$?; '
_PIDFILES = '"/dev/shm/.trajforge-$1" "/tmp/.trajforge-$1"'
EXEC_WRAP = ('for d in /dev/shm /tmp; do [ -d "$d" ] && [ -w "$d" ] && { echo $$ > "$d/.trajforge-$1"; break; }; '
             'done 2>/dev/null; ' + _SHELL_PICK.format(r="") + f'rm -f {_PIDFILES} 2>/dev/null; exit $rc')
KILL_WRAP = f'for f in {_PIDFILES}; do [ -f "$f" ] && kill -9 -"$(cat "$f")" 2>/dev/null; rm -f "$f"; done; true'
# fd 3 keeps the client's stdin: an async list in a non-interactive shell gets /dev/null otherwise.
SPAWN_WRAP = ('exec 3<&0; (cat <&3 >/dev/null 2>&1; kill -9 -$$ 2>/dev/null) & '
              + _SHELL_PICK.format(r=" </dev/null 3<&-") + 'kill $! 2>/dev/null; exit $rc')


def run_args(*, name: str, run_name: str, workspace: str, mount_at: str, cwd: str, image: list[str],
             engine_flags: list[str], network: NetworkMode, engine_kind: str, memory: str | None,
             limits: ResourceLimits, pids_limit: int | None, cpus: float | None, idmap: int | None = None) -> list[str]:
    """`run` arguments of a sample's container: labels (the sweep finds a dead runner's by owner),
    the workspace mount, the network, the limits, and `sleep infinity` as its process. `image`: the
    image's name, or what stands for it (rootfs.OwnRootfs.mount: its config, `--rootfs PATH`).
    `idmap`: the host uid and gid that the container's 0 maps to, 65,536 ids from there (a user
    namespace)."""
    args = ["run", "-d", "--name", name, "--label", "trajforge=1", "--label", f"trajforge.run={run_name}",
            "--label", f"trajforge.owner={socket.gethostname()}:{os.getpid()}",
            "-v", f"{workspace}:{mount_at}", "-w", cwd, *engine_flags]
    args += network_args(network, engine_kind)
    if idmap is not None:
        args += ["--uidmap", f"0:{idmap}:{ID_RANGE}", "--gidmap", f"0:{idmap}:{ID_RANGE}"]
    if memory:  # --memory-swap equal to --memory: no swap on top
        args += ["--memory", memory, "--memory-swap", memory]
    if limits.tmp_size:
        args += ["--tmpfs", f"/tmp:rw,nosuid,nodev,size={limits.tmp_size},mode=1777"]
    if limits.shm_size:
        args += ["--shm-size", str(limits.shm_size)]
    # CPU time is set per command (cpu_prefix): any --ulimit flag would replace the engine's
    # default ulimits, and with them the nofile cap a generated containers.conf sets.
    if pids_limit:
        args += ["--pids-limit", str(pids_limit)]
    if cpus:
        args += ["--cpus", f"{cpus:g}"]
    return args + ["--entrypoint", "sleep", *image, "infinity"]


def network_args(network: NetworkMode, engine_kind: str) -> list[str]:
    """The host network is the engine's default network, as before egress existed."""
    if network == NetworkMode.NONE:
        return ["--network", "none"]
    if network == NetworkMode.EGRESS and engine_kind == "podman":
        return ["--network", "slirp4netns:allow_host_loopback=false"]
    return []


def cpu_prefix(command: str, cpu_seconds: int | None) -> str:
    return f"ulimit -t {cpu_seconds} 2>/dev/null; {command}" if cpu_seconds else command
