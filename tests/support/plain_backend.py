"""A test-only sandbox backend: one module; tests/test_architecture.py registers it with one line.

The local sandbox's behaviour under a name of its own, so a test can see a sample made by it.
"""

from __future__ import annotations

from pathlib import Path

from trajforge.sandbox.backends.local.local_sandbox import LocalSandbox
from trajforge.sandbox.interface import Provider


class PlainSandbox(LocalSandbox):
    pass


async def make(provider: Provider, *, cwd: str | None, image: str | None, root: Path) -> PlainSandbox:
    return PlainSandbox(root, keep=provider.settings.keep_workspaces, cwd=cwd, limits=provider.limits)
