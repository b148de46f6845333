"""The run-scoped sandbox provider: choosing, creating and closing every sample's sandbox.

One SandboxProvider per executor process (SampleWorker.start creates it, aclose closes it). It
holds what samples of a run share: the bwrap probe, the container engine and image cache, the
local backend's cgroup directory, the limits from the config (limits_for, sample_limits) and the
run's concrete network mode (network_mode, resolved once; sandbox/network.py), all from the
run's SandboxSettings (settings.py), never from RunConfig. Nothing of it
lives in module globals, so two runs in one process (tests, Ray actors) never share or leak state.

Backends are registered in BACKENDS: name -> "module:function", the function being
`async def make(provider, *, cwd, image, root) -> Sandbox` (not yet started). A backend keeps
its run-level state in `provider.state(key, factory)`, closed with the provider. `--sandbox`
picks by name; a row with an image (or `--sandbox container`) runs in a container; "auto"
means bwrap when a probe sandbox works on this machine, else local; asking for an unusable
backend explicitly is a clear SandboxError rather than a silent downgrade.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from trajforge.sandbox.base import Sandbox, SandboxError
from trajforge.sandbox.cwd_policy import problem as cwd_problem
from trajforge.sandbox.lazy import LazySandbox
from trajforge.sandbox.process import DEFAULT_LIMITS, Limits
from trajforge.sandbox.settings import SampleLimits, SandboxSettings

BACKENDS = {
    "local": "trajforge.sandbox.backends.local.local_sandbox:make",
    "bwrap": "trajforge.sandbox.backends.bwrap.bwrap_backend:make",
    "container": "trajforge.sandbox.backends.container.container_sandbox:make",
}
T = TypeVar("T")
# Open providers by event loop, so the runner's image prefetch reaches the executor's provider.
_open: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SandboxProvider] = weakref.WeakKeyDictionary()


def limits_for(settings: SandboxSettings, *, memory_cgroup: bool = False) -> Limits:
    """Per-process rlimits of sandboxed commands: CPU seconds, and the memory limit as an
    address-space limit where no memory cgroup holds the whole sample (sandbox/resources.py)."""
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
        # Sandboxes handed out to be made on first use and not made yet: the demand a backend
        # that makes sandboxes ahead of time sizes its pool to (bwrap as root: sandbox_pool.py).
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

    def sample_limits(self) -> SampleLimits:
        return self.settings.limits

    async def network_mode(self) -> str:
        return await network_mode(self)

    async def backend_name(self, image: str | None) -> str:
        kind = self.settings.backend
        if image is not None or kind == "container":
            return "container"
        if kind == "auto":
            from trajforge.sandbox.backends.bwrap.bwrap_backend import probe_status

            return "bwrap" if (await probe_status(self)).usable else "local"
        return kind

    async def _backend(self, image: str | None) -> tuple[Any, str]:
        name = await self.backend_name(image)
        target = BACKENDS.get(name)
        if target is None:
            raise SandboxError(f"sandbox backend {name!r} is not available; use one of {', '.join(BACKENDS)}")
        module, _, func = target.partition(":")
        return importlib.import_module(module), func

    async def made_on_first_use(self, image: str | None) -> bool:
        """Whether a sample's sandbox of this backend should be made at its first tool call
        (sandbox/lazy.py): a backend module says so with MAKE_ON_FIRST_USE = True."""
        module, _ = await self._backend(image)
        return bool(getattr(module, "MAKE_ON_FIRST_USE", False))

    def lazy(self, create: Callable[[], Awaitable[Sandbox]], *, image: str | None = None,
             root: Path | None = None) -> LazySandbox:
        """A sample's sandbox made by `create` at its first use (lazy.py), counted in `waiting`
        until then; a backend with a `prepare(provider, root)` starts its run-level work now, in
        the background (bwrap as root makes sandboxes ahead of time)."""
        self.waiting += 1
        if root is not None:
            self._prepare(image, root)
        self._demand_changed()
        return LazySandbox(create, on_settled=self._settled)

    def _prepare(self, image: str | None, root: Path) -> None:
        key = (image or "", root)
        if key not in self._prepared:
            self._prepared[key] = asyncio.ensure_future(self._prepare_backend(image, root))

    async def _prepare_backend(self, image: str | None, root: Path) -> None:
        with contextlib.suppress(SandboxError):  # the sample's own creation says what is wrong
            module, _ = await self._backend(image)
            prepare = getattr(module, "prepare", None)
            if prepare is not None:
                await prepare(self, root)

    def on_demand(self, hook: Callable[[], None]) -> None:
        """Run `hook` whenever `waiting` changes."""
        self._on_demand.append(hook)

    def _demand_changed(self) -> None:
        for hook in self._on_demand:
            hook()

    def _settled(self) -> None:
        self.waiting -= 1
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

    async def create(self, *, cwd: str | None, image: str | None, root: Path) -> Sandbox:
        """A started sandbox for one sample, its workspace created under `root`. Raises SandboxError."""
        name = await self.backend_name(image)
        why = None if cwd is None else cwd_problem(cwd, host=name != "container")
        if why is not None:  # the dataset refuses these rows already; a row from elsewhere is refused here
            raise SandboxError(f"the row's cwd {cwd[:200]!r} {why}")
        module, func = await self._backend(image)
        make: Callable[..., Awaitable[Sandbox]] = getattr(module, func)
        sandbox = await make(self, cwd=cwd, image=image, root=root)
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


async def network_mode(provider: SandboxProvider) -> str:
    """The run's concrete network mode, once per provider (runner/preflight.py resolves `auto` at
    start; callers that skip that, such as tests and Ray workers, resolve it here)."""
    from trajforge.errors import UsageError
    from trajforge.sandbox.network import resolve_mode

    async def resolve() -> str:
        try:
            return (await resolve_mode(provider.settings))[0]
        except UsageError as e:
            raise SandboxError(str(e)) from None

    return await provider.state("network.mode", resolve)


async def resolve_backend(settings: SandboxSettings) -> tuple[str, str | None]:
    """The backend `--sandbox` means on this machine for rows without an image, and, when `auto`
    fell back to `local` (no isolation), why bwrap could not be used."""
    if settings.backend != "auto":
        return settings.backend, None
    from trajforge.sandbox.backends.bwrap.bwrap_backend import probe

    status = await probe()
    return ("bwrap", None) if status.usable else ("local", status.detail)


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
    from trajforge.sandbox.backends.container.container_backend import backend_for

    try:
        backend = await backend_for(provider)
    except SandboxError:
        return  # no engine: every sample with an image will say so
    backend.images.prefetch(sorted(images))
