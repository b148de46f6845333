"""`trajforge doctor` finds a wedged Podman storage and `doctor --repair` frees it (storage.py).

The wedge is made on purpose, as trajforge's old container mechanism made it, in a storage of the
test's own (tests/support/private_store.py): the machine's is never touched.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import cli
from tests.support.images import podman  # noqa: F401 (fixture)
from tests.support.private_store import CONF, Store, mounts_beneath, private_store, wedge
from tests.support.private_store import podman as run_podman
from trajforge.sandbox.backends.container import storage
from trajforge.sandbox.backends.container.container_engine import Engine, detect, last_line
from trajforge.sandbox.interface import ExecResult

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounts need root")

# The kernel's table on a wedged host (issue 45): a trajforge disk bound on a layer directory (145),
# Podman's bind of overlay/ onto itself made after it (150), a live container's overlay inside it (151).
WEDGED = """\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
145 27 7:4 /layer /var/lib/containers/storage/overlay/1563 rw,relatime - ext4 /dev/loop4 rw
150 27 254:0 /var/lib/containers/storage/overlay /var/lib/containers/storage/overlay rw,relatime - ext4 /dev/vda rw
151 150 0:52 / /var/lib/containers/storage/overlay/7481/merged rw,nodev - overlay overlay rw,lowerdir=l/X
152 27 0:53 / /var/lib/containers/storage/overlay-containers/215b/userdata/shm rw - tmpfs shm rw
160 27 0:60 / /tmp/trajforge-rootfs-9-ab/s.trajforge-9.rootfs rw,nodev - overlay overlay rw
"""
STORAGE = ("/var/lib/containers/storage", "/run/containers/storage")


def test_a_mount_hidden_under_the_engine_s_later_bind_is_found() -> None:
    mounts = storage.parse_mountinfo(WEDGED)
    found = storage.hidden(mounts, STORAGE)
    assert [(m.id, cover.id) for m, cover in found] == [(145, 150)]
    assert storage.is_self_bind(found[0][1]) and not storage.is_self_bind(found[0][0])


def test_a_healthy_storage_has_nothing_hidden() -> None:
    healthy = "\n".join(line for line in WEDGED.splitlines() if not line.startswith("145 "))
    assert storage.hidden(storage.parse_mountinfo(healthy), STORAGE) == []
    # A mount made inside the engine's bind (the old mechanism while a container ran) is not hidden.
    inside = healthy + "\n170 150 7:5 /layer /var/lib/containers/storage/overlay/99 rw - ext4 /dev/loop5 rw"
    assert storage.hidden(storage.parse_mountinfo(inside), STORAGE) == []
    # Nor is anything outside the storage, whatever covers it.
    assert storage.hidden(storage.parse_mountinfo(WEDGED), ("/srv",)) == []


def test_repair_leaves_alone_what_is_not_the_engine_s_own_bind() -> None:
    """Conservative: a hidden mount under a mount that is not a self-bind is explained, not touched."""
    text = WEDGED.replace("150 27 254:0 /var/lib/containers/storage/overlay /var/lib/containers/storage/overlay "
                          "rw,relatime - ext4 /dev/vda rw",
                          "150 27 0:70 / /var/lib/containers/storage/overlay rw - tmpfs tmpfs rw")
    mounts = storage.parse_mountinfo(text)
    (m, cover), = storage.hidden(mounts, STORAGE)
    done: list[str] = []
    assert asyncio.run(storage._free(m, cover, mounts, done)) is False  # no command ran: it would fail here
    assert len(done) == 1 and done[0].startswith(f"left {m.point} alone") and "tmpfs" in done[0]


def test_a_failed_engine_command_is_quoted_by_its_error_not_a_warning() -> None:
    """Podman prints warnings around its error, after it too: the error is what a message quotes."""
    after = ('Error: removing container 7c04 root filesystem: 1 error occurred:\n'
             '\t* unlinkat /var/lib/containers/storage/overlay/dd3e: device or resource busy\n\n\n'
             'time="2026-12-06T05:05:45Z" level=warning msg="Found incomplete layer \\"dd3e\\", deleting it"\n')
    assert last_line(ExecResult(125, "", after)) == (
        "Error: removing container 7c04 root filesystem: 1 error occurred: "
        "* unlinkat /var/lib/containers/storage/overlay/dd3e: device or resource busy")
    before = ('time="x" level=warning msg="Found incomplete layer \\"dd3e\\", deleting it"\n'
              'Error: getting store info: unlinkat /s/overlay/dd3e: device or resource busy\n')
    assert last_line(ExecResult(125, "", before)) == "Error: getting store info: unlinkat /s/overlay/dd3e: device or " \
                                                     "resource busy"
    logged = ('time="x" level=error msg="Image x exists in local storage but may be corrupted"\n'
              'time="y" level=warning msg="Failed, retrying in 1s ... (1/3)"\n')
    assert last_line(ExecResult(125, "", logged)) == "Image x exists in local storage but may be corrupted"
    assert last_line(ExecResult(1, "", 'time="y" level=warning msg="w"\nplain failure\n')) == "plain failure"
    assert last_line(ExecResult(None, "", "", timed_out=True)) == "timed out"


@pytest.fixture
def store(tmp_path: Path, podman: Engine) -> Iterator[Store]:  # noqa: F811 (the fixture imported above)
    if os.geteuid() != 0:
        pytest.skip("mounts need root")
    (tmp_path / "store").mkdir()
    with private_store(tmp_path / "store", podman) as made:
        yield made


def _doctor(store: Store, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, CONF: store.engine.env[CONF]}
    return subprocess.run(cli("doctor", "--container_engine", "podman", *flags), env=env, capture_output=True,
                          text=True, timeout=300)


@needs_root
@pytest.mark.parametrize("keep_running", [False, True], ids=["idle", "with-a-running-container"])
def test_doctor_explains_a_wedged_storage_and_repair_frees_it(store: Store, tmp_path: Path, keep_running: bool,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    layer = wedge(store, tmp_path, keep_running=keep_running)
    if not keep_running:  # what a run says then: the engine's error, not the warning printed before it
        monkeypatch.setenv(CONF, store.engine.env[CONF])
        said = asyncio.run(detect("podman", refresh=True)).reasons["podman"]
        monkeypatch.undo()
        asyncio.run(detect("podman", refresh=True))  # the process's cached engine is the machine's again
        assert said.startswith("`podman info` failed: Error: getting store info: unlinkat") and \
            said.endswith(": device or resource busy") and "level=warning" not in said, said
    told = _doctor(store)  # its two podman commands leave the storage as wedged as they found it
    assert told.returncode == 0, told.stderr
    assert "storage WEDGED" in told.stdout and f"{layer} holds a mount" in told.stdout, told.stdout
    assert f"hidden under a later mount of {store.graph}/overlay" in told.stdout
    assert "trajforge doctor --repair" in told.stdout

    fixed = _doctor(store, "--repair", "--json")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    steps = json.loads(fixed.stdout)["repair"]["steps"]
    if keep_running:  # the engine's bind held a live container's mounts: moved aside and back
        assert any(f"moved {store.graph}/overlay" in s for s in steps), steps
    else:
        assert f"container: unmounted {store.graph}/overlay (the engine's bind of it onto itself; it makes it " \
               "again when needed)" in steps, steps
    assert any(s.startswith(f"container: unmounted {layer} (") for s in steps), steps
    assert steps[-1] == "container: podman info works again (the engine deleted what it had flagged incomplete)"
    assert json.loads(fixed.stdout)["container"]["storage"]["healthy"] is True
    # Freed for real: the engine works, nothing of the wedge is left mounted, its layer is gone.
    run_podman(store.engine, "info")
    assert layer not in mounts_beneath(store.graph)
    assert not Path(layer).exists()
    if keep_running:  # the engine's own container ran on through the repair
        out = run_podman(store.engine, "exec", "wedge-bystander", "cat", "/image-marker.txt").stdout
        assert out.startswith("trajforge test image marker")
    again = _doctor(store, "--repair")
    assert again.returncode == 0 and "repair: nothing to mend" in again.stdout, again.stdout
