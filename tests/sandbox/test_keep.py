"""`keep_workspaces`: what a hostile sample leaves for later cannot act with its owner's rights.

The sample plants a setuid and a setgid copy of the shell (as root under `local`, as its own uid
under bwrap, as the container's root), a device node where it may make one, a FIFO and a link to
/root. The kept workspace holds its data, links and FIFOs as they were, but no setuid or setgid
bit and no device node, whichever backend ran it.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from tests.support.images import busybox_image, podman  # noqa: F401 (fixtures)
from tests.support.sandboxes import create_sandbox
from trajforge.config import RunConfig
from trajforge.sandbox.backends.bwrap.bwrap_backend import probe

BWRAP = asyncio.run(probe())
PLANT = ("echo data > data.txt && cp /bin/sh suid && chmod 6755 suid && mkdir -p d && cp /bin/sh d/sgid && "
         "chmod 2755 d/sgid && mkfifo fifo && ln -s /root to-root && { mknod dev c 1 3 2>/dev/null; true; }")


@pytest.mark.parametrize("backend", ["local", "bwrap", "container"])
def test_a_kept_workspace_has_no_setuid_file_and_no_device(tmp_path: Path, backend: str,
                                                           request: pytest.FixtureRequest) -> None:
    if backend == "bwrap" and not BWRAP.usable:
        pytest.skip(f"bwrap not usable here: {BWRAP.detail}")
    extra = {} if backend == "local" else {"sandbox_network": "none"}
    if backend == "container":
        extra |= {"container_image": request.getfixturevalue("busybox_image"), "container_engine": "podman"}
    config = RunConfig(sandbox=backend, keep_workspaces=True, **extra)

    async def main() -> tuple[Path, dict[str, int]]:
        sb = await create_sandbox(config, cwd=None, image=None, root=tmp_path / "root")
        try:
            res = await sb.exec(PLANT, timeout=60)
            assert res.exit_code == 0, res
            ws = Path(sb.workspace)  # type: ignore[attr-defined]
            before = {p.relative_to(ws).as_posix(): p.lstat().st_mode for p in ws.rglob("*")}
        finally:
            await sb.close()
        return Path(sb.workspace), before  # type: ignore[attr-defined]

    kept, before = asyncio.run(main())
    # the plant worked (the test is not vacuous): the bits were set while the sample ran
    assert before["suid"] & stat.S_ISUID and before["suid"] & stat.S_ISGID and before["d/sgid"] & stat.S_ISGID
    after = {p.relative_to(kept).as_posix(): p.lstat().st_mode for p in kept.rglob("*")}
    assert (kept / "data.txt").read_text() == "data\n"
    for name in ("suid", "d/sgid"):
        assert stat.S_ISREG(after[name]) and not after[name] & (stat.S_ISUID | stat.S_ISGID), (name, oct(after[name]))
        assert after[name] & 0o111  # still the sample's executable, only without the bits
    assert stat.S_ISFIFO(after["fifo"]) and os.readlink(kept / "to-root") == "/root"
    if "dev" in before:  # made only where the sample may (local as root)
        assert stat.S_ISCHR(before["dev"]) and "dev" not in after
    assert not [n for n, m in after.items() if stat.S_ISCHR(m) or stat.S_ISBLK(m)]
