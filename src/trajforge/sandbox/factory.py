"""The run-scoped sandbox provider: choosing, creating and closing every sample's sandbox.

One SandboxProvider per executor process (SampleWorker.start creates it, aclose closes it). It
holds what samples of a run share: the backends' probes, the container engine and image cache,
the local backend's cgroup directory, the limits from the config (limits_for, sample_limits) and
the run's concrete network mode (network_mode: a NetworkMode, resolved once; sandbox/network.py),
all from the run's SandboxSettings (sandbox_settings.py), never from RunConfig. The provider's own state
is never in module globals, so two runs in one process (tests, Ray actors) never share or leak
it; what modules do keep globally is per host, not per run (the egress probe's answer,
network.py; the sweep of dead runners' leftovers, host/resources.py) or the open provider of an
event loop (`_open`, below).

Backends are declared in trajforge.catalog.sandboxes (SANDBOXES): a spec's target is
`async def make(provider, *, cwd, image, root) -> Sandbox` (not yet started) and its
capabilities say what else the provider may ask of it (its status, the network modes it gives,
`prepare`, made on first use). A backend keeps its run-level state in `provider.state(key,
factory)`, closed with the provider. `--sandbox` picks by name; a row with an image runs in the
backend that runs images (the container); "auto" means the usable backend of lowest
`auto_rank` (bwrap where a probe sandbox works, else local); asking for an unusable backend
explicitly is a clear SandboxError rather than a silent downgrade.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from trajforge.catalog.sandboxes import (
    AUTO, SANDBOXES, BackendSpec, NetworkMode, auto_order, image_backend, network_refusal,
)
from trajforge.registry import load
from trajforge.sandbox.interface import BackendStatus, ImageStore, SampleResources, Sandbox, SandboxError
from trajforge.sandbox.cwd_policy import problem as cwd_problem
from trajforge.sandbox.lazy import LazySandbox
from trajforge.sandbox.process import DEFAULT_LIMITS, Limits
from trajforge.sandbox.sandbox_settings import ResourceLimits, SandboxSettings

T = TypeVar("T")
# Open providers by event loop, so the runner's image prefetch reaches the executor's provider.
_open: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SandboxProvider] = weakref.WeakKeyDictionary()


def limits_for(settings: SandboxSettings, *, memory_cgroup: bool = False) -> Limits:
    """Per-process rlimits of sandboxed commands: CPU seconds, and the memory limit as an
    address-space limit where no memory cgroup holds the whole sample (sandbox/host/resources.py)."""
    return replace(DEFAULT_LIMITS, cpu_seconds=settings.limits.cpu_seconds,
                   address_space_bytes=None if memory_cgroup else settings.limits.memory)


class SandboxProvider:
    def __init__(self, settings: SandboxSettings) -> None:
        self.settings = settings
        # CPU seconds and memory as an address-space limit; bwrap swaps the latter for a memory cgroup
        # where it can have one (bwrap.make), sandbox_nproc is bwrap's.
        self.limits: Limits = limits_for(settings)
        self._state: dict[str, Any] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._closing = contextlib.AsyncExitStack()
        # Sandboxes handed out to be made on first use and not made yet, whose samples are not
        # parked: the demand a backend that makes sandboxes ahead of time sizes its pool to
        # (bwrap as root: sandbox_pool.py).
        self.waiting = 0
        self.draining = False
        self._on_drain: list[Callable[[], None]] = []
        self._on_demand: list[Callable[[], None]] = []
        self._prepared: dict[tuple[str, Path], asyncio.Task[None]] = {}

    async def start(self) -> SandboxProvider:
        _open[asyncio.get_running_loop()] = self
        return self

    async def state(self, key: str, factory: Callable[[], Awaitable[T]], close: Callable[[T], Any] | None = None) -> T:
        """Run-level state of a backend, made once by `factory`; `close` runs at aclose."""
        if key not in self._state:
            async with self._locks.setdefault(key, asyncio.Lock()):
                if key not in self._state:
                    value = await factory()
                    if close is not None:
                        self._closing.push_async_callback(_as_async(close), value)
                    self._state[key] = value
        return self._state[key]  # type: ignore[no-any-return]

    def command_limits(self, *, memory_cgroup: bool = False) -> Limits:
        return limits_for(self.settings, memory_cgroup=memory_cgroup)

    def sample_limits(self) -> ResourceLimits:
        return self.settings.limits

    async def network_mode(self) -> NetworkMode:
        """The run's network mode, resolved once (runner/preflight.py resolves `auto` at start;
        callers that skip that, such as tests, have it resolved here)."""
        return await network_mode(self)

    async def status(self, name: str) -> BackendStatus:
        """Backend `name`'s status here, probed once per provider."""
        return await self.state(f"{name}.status", lambda: backend_status(SANDBOXES[name], self.settings))

    async def backend_name(self, image: str | None) -> str:
        kind = self.settings.backend
        runs_images = image_backend(kind)
        if image is not None or kind == runs_images.name:
            return runs_images.name
        if kind == AUTO:
            return (await choose_auto(lambda spec: self.status(spec.name)))[0]
        return kind

    async def _backend(self, image: str | None) -> BackendSpec:
        name = await self.backend_name(image)
        spec = SANDBOXES.get(name)
        if spec is None:
            raise SandboxError(f"sandbox backend {name!r} is not available; use one of {', '.join(SANDBOXES)}")
        return spec

    async def made_on_first_use(self, image: str | None) -> bool:
        """Whether a sample's sandbox of this backend should be made at its first tool call
        (sandbox/lazy.py): the backend's spec says so."""
        return (await self._backend(image)).capabilities.made_on_first_use

    def lazy(self, create: Callable[[], Awaitable[Sandbox]], *, image: str | None = None,
             root: Path | None = None) -> LazySandbox:
        """A sample's sandbox made by `create` at its first use (lazy.py), counted in `waiting`
        until then, except while its sample is parked (LazySandbox.park); a backend with a
        `prepare(provider, root)` starts its run-level work now, in the background (bwrap as root
        makes sandboxes ahead of time)."""
        self.waiting += 1
        if root is not None:
            self._prepare(image, root)
        self._demand_changed()
        return LazySandbox(create, demand=self._demand)

    def _prepare(self, image: str | None, root: Path) -> None:
        key = (image or "", root)
        if key not in self._prepared:
            self._prepared[key] = asyncio.ensure_future(self._prepare_backend(image, root))

    async def _prepare_backend(self, image: str | None, root: Path) -> None:
        with contextlib.suppress(SandboxError):  # the sample's own creation says what is wrong
            target = (await self._backend(image)).capabilities.prepare
            if target is not None:
                await load(target)(self, root)

    def on_demand(self, hook: Callable[[], None]) -> None:
        """Run `hook` whenever `waiting` changes."""
        self._on_demand.append(hook)

    def _demand_changed(self) -> None:
        for hook in self._on_demand:
            hook()

    def _demand(self, delta: int) -> None:
        self.waiting += delta
        self._demand_changed()

    def drain(self) -> None:
        """No new sample will start (in-flight ones may still retry): backends may let go of what
        only new samples would use, such as bwrap's sandboxes made ahead beyond the `waiting`
        ones, while the last samples run instead of all at once at aclose."""
        if not self.draining:
            self.draining = True
            for hook in self._on_drain:
                hook()

    def on_drain(self, hook: Callable[[], None]) -> None:
        """Run `hook` at drain (now, if the provider drains already)."""
        self._on_drain.append(hook)
        if self.draining:
            hook()

    async def image_store(self) -> ImageStore:
        """The image store of the backend that runs images (its spec's `image_store`), made once per run."""
        spec = image_backend(self.settings.backend)
        if spec.capabilities.image_store is None:
            raise SandboxError(f"the {spec.name} sandbox cannot build or inspect images")
        make: Callable[[SandboxProvider], Awaitable[ImageStore]] = load(spec.capabilities.image_store)
        return await make(self)

    async def create(self, *, cwd: str | None, image: str | None, root: Path,
                     resources: SampleResources | None = None) -> Sandbox:
        """A started sandbox for one sample, its workspace created under `root`; with `resources`
        (a task's), an ImageSandbox of the backend that runs images. Raises SandboxError."""
        spec = await self._backend(image)
        why = None if cwd is None else cwd_problem(cwd, host=not spec.capabilities.images)
        if why is not None:  # the dataset refuses these rows already; a row from elsewhere is refused here
            raise SandboxError(f"the row's cwd {cwd[:200]!r} {why}")
        refused = network_refusal(spec.name, await self.network_mode())
        if refused is not None:  # refusing beats silently giving the sample another network
            raise SandboxError(refused)
        make: Callable[..., Awaitable[Sandbox]] = spec.load()
        sandbox = await (make(self, cwd=cwd, image=image, root=root) if resources is None
                         else make(self, cwd=cwd, image=image, root=root, resources=resources))
        try:
            await sandbox.start()
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    async def __aenter__(self) -> SandboxProvider:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        if _open.get(loop) is self:
            del _open[loop]
        for task in self._prepared.values():
            task.cancel()
        await asyncio.gather(*self._prepared.values(), return_exceptions=True)
        await self._closing.aclose()
        self._state.clear()


async def network_mode(provider: SandboxProvider) -> NetworkMode:
    """The run's concrete network mode, once per provider."""
    from trajforge.errors import UsageError
    from trajforge.sandbox.network import resolve_mode

    async def resolve() -> NetworkMode:
        try:
            return (await resolve_mode(provider.settings))[0]
        except UsageError as e:
            raise SandboxError(str(e)) from None

    return await provider.state("network.mode", resolve)


@dataclass(frozen=True, slots=True)
class PlainStatus:
    """The status of a backend whose spec names no probe: usable, as its help says."""

    usable: bool
    detail: str
    uses: str = ""

    def doctor_row(self) -> dict[str, Any]:
        return {"usable": self.usable, "detail": self.detail}

    def doctor_lines(self) -> list[str]:
        return [self.detail]

    def fix(self) -> str | None:
        return None


async def backend_status(spec: BackendSpec, settings: SandboxSettings) -> BackendStatus:
    """Whether backend `spec` works here, by its own probe (`status` capability)."""
    if spec.capabilities.status is None:
        return PlainStatus(True, spec.help, spec.name)
    probe: Callable[[SandboxSettings], Awaitable[BackendStatus]] = load(spec.capabilities.status)
    return await probe(settings)


async def choose_auto(status: Callable[[BackendSpec], Awaitable[BackendStatus]]
                      ) -> tuple[str, list[tuple[str, str]]]:
    """What `--sandbox auto` means here, the one decision of it: the usable backend of lowest rank
    (the last of the order when none before it is usable), and each backend it passed over with
    why it could not be used. `status` probes a backend (cached by the caller as it sees fit)."""
    passed: list[tuple[str, str]] = []
    order = auto_order()
    for spec in order[:-1]:
        found = await status(spec)
        if found.usable:
            return spec.name, passed
        passed.append((spec.name, found.detail))
    return order[-1].name, passed


async def resolve_backend(settings: SandboxSettings) -> tuple[str, list[tuple[str, str]]]:
    """The backend `--sandbox` means on this machine for rows without an image, and, when `auto`
    passed over backends it prefers, each of them with why it could not be used."""
    if settings.backend != AUTO:
        return settings.backend, []
    return await choose_auto(lambda spec: backend_status(spec, settings))


def _as_async(fn: Callable[[Any], Any]) -> Callable[[Any], Awaitable[None]]:
    async def call(value: Any) -> None:
        result = fn(value)
        if asyncio.iscoroutine(result):
            await result

    return call


async def prefetch_images(images: set[str]) -> None:
    """Start checking (and pulling) the run's distinct images in the background, before the first
    sample needs them; a problem surfaces later as that image's samples' `sandbox` failure."""
    provider = _open.get(asyncio.get_running_loop())
    if not images or provider is None:
        return
    prefetch = image_backend(provider.settings.backend).capabilities.prefetch
    if prefetch is not None:
        await load(prefetch)(provider, sorted(images))
