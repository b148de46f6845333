"""Podman's default seccomp profile with user namespaces refused, as bwrap's samples are (seccomp.py).

Podman's default profile (containers-common) allows `clone`, `clone3` and `unshare` whatever
their flags, so a container's sample could make a user namespace of its own: root there, with
mounts and the kernel's root-only code in reach. Docker's built-in profile refuses that already
(without CAP_SYS_ADMIN, which containers here never get). So for Podman the run writes a copy of
the host's default profile (into the trajforge cache, beside a generated containers.conf) where
those three calls are allowed only as seccomp.py allows them:
`clone` and `unshare` without CLONE_NEWUSER (EPERM with it), `clone3` never (ENOSYS: the C
library falls back to `clone`), and the kernel keyrings refused too (`add_key`, `request_key`,
`keyctl`: EPERM, as in Docker's profile); every other rule stays as the host has it. A host without a
readable default profile keeps the engine's own choice (`profile_flags` returns nothing).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from trajforge.sandbox.cache_dir import cache_dir

# Where Podman looks for its default profile: the administrator's first.
DEFAULT_PROFILES = ("/etc/containers/seccomp.json", "/usr/share/containers/seccomp.json")
_NEWUSER = 0x10000000
_GUARDED = ("clone", "clone3", "unshare", "add_key", "request_key", "keyctl")


def without_user_namespaces(profile: dict[str, Any]) -> dict[str, Any]:
    """The profile with `clone`, `clone3` and `unshare` taken out of every rule that allows them,
    and allowed again only without CLONE_NEWUSER (pure)."""
    rules = []
    for rule in profile.get("syscalls", []):
        names = rule.get("names", [])
        if rule.get("action") == "SCMP_ACT_ALLOW" and any(n in _GUARDED for n in names):
            rule = {**rule, "names": [n for n in names if n not in _GUARDED]}
            if not rule["names"]:
                continue
        rules.append(rule)

    def pair(names: list[str], index: int, **where: Any) -> list[dict[str, Any]]:
        """Allowed without CLONE_NEWUSER in argument `index`, EPERM with it."""
        def flags(value: int) -> list[dict[str, Any]]:
            return [{"index": index, "value": _NEWUSER, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}]
        return [{"names": names, "action": "SCMP_ACT_ALLOW", "args": flags(0), **where},
                {"names": names, "action": "SCMP_ACT_ERRNO", "errnoRet": 1, "args": flags(_NEWUSER), **where}]

    s390 = {"arches": ["s390", "s390x"]}  # whose clone takes its flags second
    rules += [*pair(["unshare"], 0), *pair(["clone"], 0, excludes=s390), *pair(["clone"], 1, includes=s390),
              {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
              {"names": ["add_key", "request_key", "keyctl"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}]
    return {**profile, "syscalls": rules}


def write_profile(directory: Path, sources: tuple[str, ...] = DEFAULT_PROFILES) -> Path | None:
    """The host's default profile, guarded, as a file in `directory` named by its content (so runs
    share it and a killed one leaves nothing new); None when no default profile is readable."""
    for source in sources:
        try:
            with open(source, encoding="utf-8") as f:
                profile = json.load(f)
        except (OSError, ValueError):
            continue
        if not isinstance(profile, dict) or not isinstance(profile.get("syscalls"), list):
            continue
        data = json.dumps(without_user_namespaces(profile), sort_keys=True).encode()
        target = directory / f"seccomp-{hashlib.sha256(data).hexdigest()[:16]}.json"
        with contextlib.suppress(OSError):
            if target.read_bytes() == data:
                return target
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".seccomp-", suffix=".json")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
        return target
    return None


def profile_flags(engine_kind: str, directory: Path | None = None) -> list[str]:
    """The `run` flags that apply the guarded profile, written under `directory` (the trajforge
    cache by default): Podman only (Docker's built-in profile refuses user namespaces already)."""
    if engine_kind != "podman":
        return []
    path = write_profile(directory or cache_dir())
    return ["--security-opt", f"seccomp={path}"] if path is not None else []
