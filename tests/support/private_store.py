"""A Podman storage of a test's own, and the wedge trajforge's old container mechanism left in one.

Tests that break a storage on purpose (a wedge, Podman's `overlay/` bind removed under running
containers) do it in a storage of their own: graphRoot and runRoot in the test's directory, named
by CONTAINERS_STORAGE_CONF, which trajforge passes to the engine. The machine's storage, shared
with every other program and test suite, is never touched. The engine's tmp directory and lock
segment stay the host's (a private tmp directory would make Podman reset every lock on the
machine): sharing them costs nothing but contention.

`wedge` reproduces what trajforge did before its root filesystems (backends/container/rootfs.py):
a container's layer directory, while no other container runs, gets a mount of someone else's
(here a bind of a copy of the layer); starting the container makes Podman bind `overlay/` onto
itself on top of it; removing the container then fails (EBUSY) and leaves the layer flagged
incomplete: every podman command fails until the hidden mount is freed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.support.images import build_test_image
from trajforge.sandbox.backends.container.container_engine import Engine

CONF = "CONTAINERS_STORAGE_CONF"


def podman(engine: Engine, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([engine.binary, *args], env=engine.env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0 or not check, f"podman {' '.join(args)}: {proc.stderr}"
    return proc


def mounts_beneath(*dirs: Path) -> list[str]:
    """The mount points at or beneath `dirs`, hidden ones included (the kernel's table lists them)."""
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [p for p in points if any(p == str(d) or p.startswith(f"{d}/") for d in dirs)]


@dataclasses.dataclass
class Store:
    engine: Engine  # Podman with CONTAINERS_STORAGE_CONF naming this store
    graph: Path
    run: Path
    image: str


@contextlib.contextmanager
def private_store(where: Path, host: Engine) -> Iterator[Store]:
    """A fresh storage in `where`, the busybox test image imported into it; removed afterwards."""
    graph, run = where / "graph", where / "run"
    conf = where / "storage.conf"
    conf.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{graph}"\nrunroot = "{run}"\n')
    engine = dataclasses.replace(host, env={**host.env, CONF: str(conf)})
    store = Store(engine, graph, run, "")
    try:
        store.image = build_test_image(engine)
        yield store
    finally:
        remove(store)


def remove(store: Store) -> None:
    """Everything of the store: its containers, its mounts (lazily: the engine's own included) and files."""
    podman(store.engine, "rm", "-a", "-f", "-t", "0", check=False)
    for _ in range(5):  # a hidden mount is reached once what covers it is gone: again, until none is left
        points = mounts_beneath(store.graph, store.run)
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True)
        if not points:
            break
    shutil.rmtree(store.graph, ignore_errors=True)
    shutil.rmtree(store.run, ignore_errors=True)


def wedge(store: Store, scratch: Path, *, keep_running: bool = False) -> str:
    """Wedge the store as trajforge's old mechanism did; the layer directory left busy. With
    keep_running, a container of the engine's own runs meanwhile (its mounts are then inside the
    bind that covers the hidden one)."""
    assert not mounts_beneath(store.graph / "overlay"), "the wedge needs no container running in the store"
    name = "wedge-victim"
    podman(store.engine, "create", "--name", name, "--entrypoint", "sleep", store.image, "infinity")
    upper = podman(store.engine, "inspect", "--format", "{{.GraphDriver.Data.UpperDir}}", name).stdout.strip()
    layer = str(Path(upper).parent)
    copy = scratch / "layer-copy"
    shutil.copytree(layer, copy, symlinks=True)
    subprocess.run(["mount", "--bind", str(copy), layer], check=True)
    if keep_running:
        podman(store.engine, "run", "-d", "--name", "wedge-bystander", "--entrypoint", "sleep", store.image,
               "infinity")
    else:
        podman(store.engine, "start", name)
    removed = podman(store.engine, "rm", "-f", "-t", "0", name, check=False)
    assert removed.returncode != 0 and "device or resource busy" in removed.stderr, removed.stderr
    return layer
