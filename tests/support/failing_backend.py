"""A test-only sandbox backend that cannot start a sandbox whose cwd is named `broken-sandbox`
(every other sample gets the local sandbox): an infrastructure failure on demand, named on the
command line as `--sandbox tests.support.failing_backend:SPEC` (no registration needed)."""

from __future__ import annotations

from pathlib import Path

from trajforge.catalog.sandboxes import BackendCaps, NetworkMode
from trajforge.registry import Spec
from trajforge.sandbox.backends.local.local_sandbox import LocalSandbox
from trajforge.sandbox.interface import Provider, SandboxError

BROKEN = "broken-sandbox"
SPEC = Spec("failing", "tests.support.failing_backend:make", "a sandbox that fails to start on demand",
            BackendCaps(networks=frozenset({NetworkMode.HOST})))


async def make(provider: Provider, *, cwd: str | None, image: str | None, root: Path) -> LocalSandbox:
    if cwd is not None and Path(cwd).name == BROKEN:
        raise SandboxError(f"cannot start a sandbox in {cwd} (the test's injected failure)")
    return LocalSandbox(root, keep=provider.settings.keep_workspaces, cwd=cwd, limits=provider.limits)
