"""Whether the container backend works here, as `--sandbox auto`, egress and `doctor` ask it
(its spec's `status` and `egress_probe`, trajforge.catalog.sandboxes).

Every check is real: Podman answers `podman info`, the Docker CLI must reach a daemon. The
status also says who a container sample is to this host, for users deciding how far to trust
the boundary, and the runtime configuration trajforge applies to Podman (a generated
CONTAINERS_CONF when the host needs one).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from trajforge.sandbox.backends.container.backend import DROPPED_CAPS, ID_LOW
from trajforge.sandbox.backends.container.engine import detect
from trajforge.sandbox.backends.container.seccomp import PROFILE, applies
from trajforge.sandbox.backends.container.storage import StorageReport, storage_report
from trajforge.sandbox.network import EgressSupport
from trajforge.sandbox.sandbox_settings import SandboxSettings

ENGINES = ("podman", "docker")  # what `container_engine: auto` tries, in this order
# What to do about an engine found on PATH that does not work (its own check says why).
REPAIR = {"podman": "run `podman info` to see why and fix Podman's setup (storage, runtime, /etc/containers)",
          "docker": "start its daemon, or point DOCKER_HOST at one"}


@dataclass(frozen=True, slots=True)
class ContainerStatus:
    usable: bool
    detail: str
    engine: str | None  # the engine samples use here
    engines: dict[str, dict[str, Any]]  # each engine checked: usable, detail, binary, conf
    storage: StorageReport | None = None  # Podman's storage, wedged or not (storage.py)

    @property
    def uses(self) -> str:
        return self.engine or ""

    def isolation(self) -> str:
        """Who a container sample is to this host."""
        if self.engine is None:
            return ""
        if self.engine == "podman":
            who = ("rootful Podman (the runner is root) in a user namespace per run: the image's root is an "
                   f"unused host uid (from {ID_LOW:,} up), never this host's root"
                   if os.geteuid() == 0 else "rootless Podman: the image's users map into your uid's user namespace")
            seccomp = PROFILE if applies("podman") else "Podman's default profile"
        else:
            who = "as the Docker daemon maps it (a rootful daemon: the image's root is this host's uid 0)"
            seccomp = "Docker's default profile"
        return f"runs as the image's user, {who}; seccomp: {seccomp}; capabilities dropped: {', '.join(DROPPED_CAPS)}"

    def doctor_row(self) -> dict[str, Any]:
        return {"usable": self.usable, "engine": self.engine, "engines": self.engines, "isolation": self.isolation(),
                "storage": self.storage.row() if self.storage is not None else None}

    def fix(self) -> str | None:
        """What to repair in each engine that is installed but does not work (installing another
        is not the way)."""
        if self.usable:
            return None
        broken = [f"{kind} is installed ({e['binary']}) but does not work ({e['detail']}): {REPAIR[kind]}"
                  for kind, e in self.engines.items() if e.get("binary")]
        return "; ".join(broken) or None

    def doctor_lines(self) -> list[str]:
        lines = [f"engine: {self.engine or 'none'}"]
        for kind, e in self.engines.items():
            lines.append(f"  {kind:<8} {'usable    ' if e['usable'] else 'NOT usable'}  {e['detail']}")
            if kind == "podman" and self.storage is not None:
                lines += [f"  {line}" for line in self.storage.lines()]
        if self.engine is not None:
            lines.append(f"  {self.engine} samples: {self.isolation()}")
        conf = next((e.get("conf") for e in self.engines.values() if e.get("conf")), None)
        if conf:
            lines.append(f"{self.engine} runs with CONTAINERS_CONF={conf}:")
            try:
                with open(conf, encoding="utf-8") as f:
                    lines += ["    " + line for line in f.read().splitlines()]
            except OSError as e:
                lines.append(f"    (cannot read it: {e})")
        return lines


async def status(settings: SandboxSettings) -> ContainerStatus:
    """Each engine `container_engine` allows, checked on its own; the first usable one is used."""
    choice = settings.container.engine
    engines: dict[str, dict[str, Any]] = {}
    chosen = None
    for kind in ENGINES if choice == "auto" else (choice,):
        found = await detect(kind)
        engines[kind] = {"usable": found.engine is not None, "detail": found.reasons.get(kind, "")}
        if kind in found.binaries:  # installed, usable or not
            engines[kind]["binary"] = found.binaries[kind]
        if found.engine is not None:
            engines[kind]["conf"] = found.engine.env.get("CONTAINERS_CONF")
            chosen = chosen or kind
    detail = f"engine: {chosen}" if chosen else "; ".join(f"{k}: {e['detail']}" for k, e in engines.items())
    storage = await storage_report() if "podman" in engines else None
    if storage is not None and not storage.healthy:
        detail += "; podman's storage is wedged (see trajforge doctor)"
    return ContainerStatus(chosen is not None, detail, chosen, engines, storage)


async def egress_probe() -> EgressSupport:
    """Egress in a container is the engine's network plus the firewall entered into it: nothing
    to prove beyond the host's own needs, which network.egress_support checked."""
    return EgressSupport(True, "engine network + the same firewall inside each container")
