"""Podman containers' seccomp profile: the sample's filter of bwrap samples (seccomp.py), as OCI JSON.

Podman's default profile (containers-common) allows `clone`, `clone3`, `unshare`, `setns`,
`mount`, `keyctl`, `ptrace`'s relatives and more whatever the container's capabilities, relying on
the capabilities to refuse them; a container's sample could then make a user namespace of its
own, root there with mounts and the kernel's root-only code in reach. So the run gives Podman a
profile of its own, written once into the trajforge cache beside a generated containers.conf and
named by its content: seccomp.py's SYSCALLS_ALLOWED (the names of the 32-bit entries included:
an image may hold 32-bit programs), chroot with CAP_SYS_CHROOT (which containers keep, as in
Docker), the same argument checks (`clone` without a namespace flag, `clone3` ENOSYS so the C
library falls back to clone, `personality`'s execution domains, `socket` but AF_ALG and
AF_VSOCK), and everything else EPERM: io_uring, the keyrings, namespaces, mounts... Docker's
built-in profile refuses the same but for the few calls seccomp.py refuses beyond it
(`profile_flags` gives Docker nothing: its daemon's profile stands). On a machine without a
seccomp table the engine's own profile stands too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from trajforge.sandbox.backends.container.container_engine import cache_dir
from trajforge.sandbox.host import seccomp

PROFILE = "trajforge's (as strict as Docker's default, io_uring, user namespaces and keyrings refused)"
_ARCHES = {"x86_64": ("SCMP_ARCH_X86_64", ["SCMP_ARCH_X86", "SCMP_ARCH_X32"]),
           "aarch64": ("SCMP_ARCH_AARCH64", ["SCMP_ARCH_ARM"])}


def _checked(name: str, action: tuple[str, Any]) -> list[dict[str, Any]]:
    """The rules of one of seccomp.SYSCALLS_CHECKED: what it allows (the default refuses the rest)."""
    kind, arg = action

    def allow(op: str, value: int) -> dict[str, Any]:
        return {"names": [name], "action": "SCMP_ACT_ALLOW",
                "args": [{"index": 0, "value": value, "valueTwo": 0, "op": op}]}

    if kind == "ret":
        return [{"names": [name], "action": "SCMP_ACT_ERRNO", "errnoRet": arg & 0xFFFF}]
    if kind == "flags":
        return [allow("SCMP_CMP_MASKED_EQ", arg)]  # (argument & value) == valueTwo: no flag of the mask
    if kind == "only":
        return [allow("SCMP_CMP_EQ", value) for value in arg]
    # "not": one comparison of an argument per rule, so the values around the refused ones in rules of their own
    low, high = min(arg), max(arg)
    return [allow("SCMP_CMP_LT", low), allow("SCMP_CMP_GT", high),
            *(allow("SCMP_CMP_EQ", v) for v in range(low + 1, high) if v not in arg)]


def container_profile() -> dict[str, Any]:
    """The profile (module doc; pure)."""
    rules: list[dict[str, Any]] = [
        {"names": sorted(seccomp.SYSCALLS_ALLOWED), "action": "SCMP_ACT_ALLOW"},
        {"names": ["chroot"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_CHROOT"]}}]
    for name, action in seccomp.SYSCALLS_CHECKED.items():
        rules += _checked(name, action)
    return {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": seccomp.REFUSED_ERRNO,
            "archMap": [{"architecture": a, "subArchitectures": subs} for a, subs in _ARCHES.values()],
            "syscalls": rules}


def write_profile(directory: Path) -> Path:
    """The profile as a file in `directory` named by its content (so runs share it and a killed one
    leaves nothing new)."""
    data = json.dumps(container_profile(), sort_keys=True).encode()
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


def applies(engine_kind: str) -> bool:
    """Whether containers of this engine get the profile here: Podman's, on a machine with a table."""
    return engine_kind == "podman" and os.uname().machine in _ARCHES


def profile_flags(engine_kind: str, directory: Path | None = None) -> list[str]:
    """The `run` flags that apply the profile, written under `directory` (the trajforge cache by
    default), where it `applies`."""
    if not applies(engine_kind):
        return []
    return ["--security-opt", f"seccomp={write_profile(directory or cache_dir())}"]
