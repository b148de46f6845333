"""Run-level state of the bwrap backend when the runner is root: one per run, in the provider.

- the zygote (zygote.py, zygote_client.py), which makes every sandbox's namespaces and first process;
- the template: one bwrap per run builds the read-only system view that every sandbox's own
  mount namespace is copied from (bwrap.bwrap_argv; the holder is `cat`, which ends, and the
  template with it, when the runner's end of its stdin closes or the runner dies). Its /etc is
  a tmpfs of its own holding the run's copy of the host's (etc_copy.py), never the host's files;
  each sandbox sees the template's system directories through overlays of its own (root_view.py);
- the router (router.py) in egress mode: one firewall and one slirp4netns for the whole run;
- the sandbox pools (sandbox_pool.py), one per workspace root, which make sandboxes ahead of time.

So a sandbox costs one fork of the zygote and its privileged setup, done in the background; no
process starts per sample but its own commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from trajforge.sandbox.interface import SandboxError
from trajforge.sandbox.backends.bwrap.bwrap_layout import ETC, NOT_FOUND, WORKSPACE, bwrap_argv, find_bwrap, host_layout
from trajforge.sandbox.backends.bwrap.bwrap_start import args_pipe, helper_source, holder_ready
from trajforge.sandbox.host.etc_copy import copy_etc
from trajforge.sandbox.host.zygote_client import Zygote
from trajforge.sandbox.process import SAFE_PATH, kill_group
from trajforge.sandbox.host.resources import ResourceLimits
from trajforge.catalog.sandboxes import NetworkMode
from trajforge.sandbox.backends.bwrap.sandbox_pool import SandboxPool
from trajforge.sandbox.host.router import Router, resolv_conf


class RootRuntime:
    def __init__(self, *, template_argv: Sequence[str], network: NetworkMode, allow: Sequence[str] = (),
                 limits: ResourceLimits | None = None, resolv: bytes | None = None,
                 nproc: int | None = None, demand: Callable[[], int] = lambda: 0) -> None:
        """template_argv: the bwrap command line of the template (bwrap.bwrap_argv), up to the command,
        with a tmpfs at /etc; resolv: the sandboxes' resolv.conf (None: the host's content)."""
        self.template_argv = list(template_argv)
        self.resolv = resolv
        self.network, self.allow = network, tuple(allow)
        self.limits = limits or ResourceLimits(memory=None, disk=None)
        self.nproc, self.demand = nproc, demand
        self.zygote = Zygote()
        self.router: Router | None = None
        self._holder: asyncio.subprocess.Process | None = None
        self._pools: dict[Path, SandboxPool] = {}
        self._draining = False

    async def start(self) -> RootRuntime:
        try:
            await self.zygote.start(helper_source(zygote=True))
            await self._start_template()
            if self.network == NetworkMode.EGRESS:
                self.router = await Router(self.zygote, self.allow).start()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def _start_template(self) -> None:
        args_r = args_pipe(self.template_argv[1:])
        try:
            self._holder = await asyncio.create_subprocess_exec(
                self.template_argv[0], "--args", str(args_r), "cat", stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={"PATH": SAFE_PATH},
                pass_fds=(args_r,), start_new_session=True)
        except OSError as e:
            raise SandboxError(f"cannot start bwrap: {e}") from e
        finally:
            os.close(args_r)
        init = await holder_ready(self._holder)
        # The run's /etc, written into the template's own tmpfs before any sandbox copies it.
        try:
            await asyncio.to_thread(copy_etc, Path(f"/proc/{init}/root/etc"), resolv=self.resolv)
        except OSError as e:
            raise SandboxError(f"cannot copy /etc into the sandboxes' template: {e}") from e
        await self.zygote.request("template", pid=init)

    def pool(self, root: Path) -> SandboxPool:
        pool = self._pools.get(root)  # (twice a sample: the root as given, no new Path)
        if pool is None:
            root = Path(root)
            pool = self._pools.get(root)
        if pool is None:
            pool = self._pools[root] = SandboxPool(
                root, self.zygote, network=self.network, router=self.router.ns if self.router else None,
                limits=self.limits, nproc=self.nproc, demand=self.demand)
            if self._draining:
                pool.drain()
        return pool

    def refill(self) -> None:
        """The demand changed (a sample will want a sandbox, or no longer): every pool makes or trims."""
        for pool in self._pools.values():
            pool.refill()

    def drain(self) -> None:
        """No new sample will start: every pool keeps only what the demand still wants."""
        self._draining = True
        for pool in self._pools.values():
            pool.drain()

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            with contextlib.suppress(Exception):
                await pool.aclose()
        if self.router is not None:
            await self.router.close()
            self.router = None
        holder, self._holder = self._holder, None
        if holder is not None:
            if holder.stdin is not None:
                holder.stdin.close()
            try:
                async with asyncio.timeout(5):
                    await holder.wait()
            except TimeoutError:
                kill_group(holder)
                await holder.wait()
        await self.zygote.aclose()


async def root_runtime(bwrap: str | None, network: NetworkMode, allow: Sequence[str] = (),
                       limits: ResourceLimits | None = None, nproc: int | None = None,
                       demand: Callable[[], int] = lambda: 0) -> RootRuntime:
    """The run-level state of root mode (bwrap_runtime.py): its template is the sandbox's system view."""
    bwrap = bwrap or find_bwrap()
    if bwrap is None:
        raise SandboxError(NOT_FOUND)
    layout = [(name, target) for name, target in host_layout() if name != ETC]  # the run's copy instead
    argv = bwrap_argv(bwrap, layout=layout, binds=[], chdir="/", network=False, privileged=True, mounts=False,
                      extra=["--perms", "0755", "--tmpfs", f"/{ETC}", "--dir", WORKSPACE])
    resolv = resolv_conf() if network == NetworkMode.EGRESS else None  # the run's DNS forwarder
    return await RootRuntime(template_argv=argv, network=network, allow=allow, limits=limits, resolv=resolv,
                             nproc=nproc, demand=demand).start()
