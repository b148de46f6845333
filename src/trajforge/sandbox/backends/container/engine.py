"""Finding a container engine and running its CLI: Podman, or the Docker CLI with a reachable daemon.

Owns engine detection (`--container_engine auto|podman|docker`), the environment every engine
command runs with (the runner's API keys never reach the engine CLI, let alone a container),
and the Podman host fix-up: Podman's default ulimits (nofile 1048576) exceed the hard limits
of many CI hosts and containers then fail with "error setting rlimits", and crun fails on
hybrid cgroup v1 hosts. When that applies and the user has not set CONTAINERS_CONF, a
containers.conf capping the ulimits (and choosing runc) is written under the trajforge cache
directory and passed to every podman command. `trajforge doctor` prints what was decided.
"""

from __future__ import annotations

import hashlib
import os
import re
import resource
import secrets
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path

from trajforge.sandbox.cache_dir import cache_dir
from trajforge.sandbox.interface import ExecResult
from trajforge.sandbox.process import SAFE_PATH, run_argv

PODMAN_NOFILE = 1 << 20  # Podman's default container nofile limit (rootful)
_PASS_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TMPDIR", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME",
             "XDG_DATA_HOME", "XDG_CACHE_HOME", "DBUS_SESSION_BUS_ADDRESS", "REGISTRY_AUTH_FILE",
             "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
_PASS_PREFIX = ("CONTAINERS_", "DOCKER_", "CONTAINER_HOST", "CONTAINER_CONNECTION")
_HOST = hashlib.blake2b(socket.gethostname().encode(), digest_size=4).hexdigest()


@dataclass(frozen=True, slots=True)
class Engine:
    kind: str  # "podman" or "docker"
    binary: str
    env: dict[str, str] = field(repr=False)
    version: str = ""
    notes: tuple[str, ...] = ()

    async def run(self, *args: str, timeout: float = 60.0) -> ExecResult:
        return await run_argv([self.binary, *args], timeout=timeout, cwd="/", env=self.env, output_cap=100_000)

    def argv(self, *args: str) -> list[str]:
        return [self.binary, *args]

    def rm_args(self, *names: str) -> list[str]:
        # Podman waits 10 s for a stop signal unless told not to, and removes nothing when one
        # name is unknown unless --ignore; docker rm -f kills at once and goes name by name.
        return ["rm", "-f", "-t", "0", "--ignore", *names] if self.kind == "podman" else ["rm", "-f", *names]


@dataclass(frozen=True, slots=True)
class EngineStatus:
    engine: Engine | None
    reasons: dict[str, str]  # engine kind -> why it is not usable (or how it is set up)
    binaries: dict[str, str] = field(default_factory=dict)  # engine kind -> its program, when found


def engine_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in _PASS_ENV or k.startswith(_PASS_PREFIX)}
    env.setdefault("PATH", SAFE_PATH)
    env.update(extra or {})
    return env


def podman_conf_text(nofile: int, nproc: int, runtime: str | None) -> str:
    lines = ["# Written by trajforge: Podman's defaults do not work on this host (see `trajforge doctor`).",
             "[containers]", f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]']
    if runtime:
        lines += ["", "[engine]", f'runtime = "{runtime}"']
    return "\n".join(lines) + "\n"


def _hard(res: int, cap: int) -> int:
    hard = resource.getrlimit(res)[1]
    return cap if hard == resource.RLIM_INFINITY else min(hard, cap)


def _cgroup_v2_only() -> bool:
    return Path("/sys/fs/cgroup/cgroup.controllers").exists()


async def _podman(binary: str) -> tuple[Engine | None, str]:
    env = engine_env()
    info = await run_argv([binary, "info", "--format", "{{.Host.OCIRuntime.Name}} {{.Version.Version}}"],
                          timeout=30, cwd="/", env=env)
    if info.exit_code != 0:
        return None, f"`podman info` failed: {last_line(info)}"
    runtime, _, version = info.stdout.strip().partition(" ")
    notes = [f"podman {version}, runtime {runtime}"]
    nofile, nproc = _hard(resource.RLIMIT_NOFILE, PODMAN_NOFILE), _hard(resource.RLIMIT_NPROC, 32768)
    switch = "runc" if runtime == "crun" and not _cgroup_v2_only() and shutil.which("runc", path=SAFE_PATH) else None
    if "CONTAINERS_CONF" in env:
        notes.append(f"using CONTAINERS_CONF={env['CONTAINERS_CONF']} from the environment")
    elif nofile < PODMAN_NOFILE or switch:
        path = cache_dir() / "containers.conf"
        text = podman_conf_text(nofile, nproc, switch)
        try:
            if not path.exists() or path.read_text() != text:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(text)
                os.replace(tmp, path)
        except OSError as e:
            return None, f"cannot write {path}: {e}"
        why = (f"hard nofile limit {nofile} < Podman's default {PODMAN_NOFILE}" if nofile < PODMAN_NOFILE else "")
        why += ("; " if why and switch else "") + ("crun needs pure cgroup v2, using runc" if switch else "")
        notes.append(f"CONTAINERS_CONF={path} (generated: {why})")
        env["CONTAINERS_CONF"] = str(path)
    return Engine("podman", binary, env, version, tuple(notes)), "; ".join(notes)


async def _docker(binary: str) -> tuple[Engine | None, str]:
    env = engine_env()
    res = await run_argv([binary, "version", "--format", "{{.Server.Version}}"], timeout=15, cwd="/", env=env)
    host = env.get("DOCKER_HOST", "the default socket")
    if res.exit_code != 0 or not res.stdout.strip():
        return None, f"docker CLI found but no daemon reachable at {host}: {last_line(res)} (set DOCKER_HOST)"
    note = f"docker daemon {res.stdout.strip()} at {host}"
    return Engine("docker", binary, env, res.stdout.strip(), (note,)), note


_LOG_LINE = re.compile(r'(?:time="[^"]*" )?level=(\w+) msg="((?:[^"\\]|\\.)*)"')


def last_line(res: ExecResult) -> str:
    """The line of an engine command's output that says what failed: its last `Error...` line (with
    the `* ...` lines listing its causes), else its last error log entry, else its last line that
    is not a log entry of a lesser level. Podman prints warnings around its error, before or after
    it (`level=warning msg="Found incomplete layer..."`): quoting one of those hides the cause."""
    text = res.stderr.strip() or res.stdout.strip()
    if not text:
        return "timed out" if res.timed_out else f"exit {res.exit_code}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].lower().startswith(("error", "docker: error")):
            causes = [line for line in lines[i + 1:] if line.startswith("* ")]
            return " ".join([lines[i], *causes])[:500]
    logged = [(m.group(1), m.group(2)) for m in map(_LOG_LINE.match, lines) if m is not None]
    errors = [msg for level, msg in logged if level in ("error", "fatal", "panic")]
    if errors:
        return errors[-1].replace('\\"', '"')[:500]
    plain = [line for line in lines if _LOG_LINE.match(line) is None]
    return (plain or lines)[-1][:500]


_cache: dict[str, EngineStatus] = {}


async def detect(choice: str = "auto", refresh: bool = False) -> EngineStatus:
    """The engine to use for `choice` ("auto": Podman, else a reachable Docker), cached per process."""
    if choice in _cache and not refresh:
        return _cache[choice]
    reasons: dict[str, str] = {}
    binaries: dict[str, str] = {}
    chosen: Engine | None = None
    for kind in (("podman", "docker") if choice == "auto" else (choice,)):
        binary = shutil.which(kind, path=os.environ.get("PATH", SAFE_PATH) + os.pathsep + SAFE_PATH)
        if binary is None:
            reasons[kind] = f"{kind} not found on PATH"
            continue
        binaries[kind] = binary
        engine, reasons[kind] = await (_podman(binary) if kind == "podman" else _docker(binary))
        if engine is not None:
            chosen = engine
            break
    _cache[choice] = EngineStatus(chosen, reasons, binaries)
    return _cache[choice]


def container_name(token: str | None = None) -> str:
    """trajforge-<host hash>-<runner pid>-<token>: the owner is readable from the name alone."""
    return f"trajforge-{_HOST}-{os.getpid()}-{token or secrets.token_hex(5)}"


def owner_dead(name: str) -> bool:
    """A container of ours from this host whose runner process no longer exists."""
    parts = name.split("-")
    if len(parts) != 4 or parts[0] != "trajforge" or parts[1] != _HOST or not parts[2].isdigit():
        return False
    try:
        os.kill(int(parts[2]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
