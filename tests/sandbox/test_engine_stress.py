"""trajforge never wedges the container engine, with everything that once did it happening at once.

In a Podman storage of the test's own (tests/support/private_store.py: the runners it kills must
leave nothing in the machine's, and what other programs do to the machine's must not decide it):
- other podman commands in a loop (`ps`, `images`, `info`, `create` and `rm` of containers of the
  test's, now and then a `run --rm`), every one of which must succeed;
- Podman's bind of `overlay/` onto itself removed while samples' containers run: Podman makes it at
  each command and removes it when none of its layers is mounted, so with trajforge's containers on
  root filesystems of their own it comes and goes all the time (the test checks samples ran both
  with it and without it). The test does not unmount it itself: Podman races that between making
  the bind and making it private, and its command fails, whoever's it is (seen with the old
  mechanism's code as `Error: remount .../overlay, flags: 0x40000: invalid argument`);
- two trajforge runs of container samples at once, each several samples at a time, whose
  commands write to the container's own filesystem;
- meanwhile, a runner SIGKILLed at each step of making and removing a container
  (tests/support/crash_container.py holds it there), each next runner sweeping what the last left.
Afterwards `podman info` works, nothing beneath the engine's storage is hidden or a mount of
trajforge's, no mount or container of any of these runners is left anywhere, and the runs' samples
all succeeded.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, cli
from tests.support.crash_container import POINTS
from tests.support.images import podman  # noqa: F401 (fixture)
from tests.support.policies import prompt_command_policy
from tests.support.private_store import CONF, Store, private_store
from tests.support.private_store import podman as run_podman
from tests.support.scripted_server import ScriptedServer
from trajforge.sandbox.backends.container import storage
from trajforge.sandbox.backends.container.container_engine import Engine
from trajforge.sandbox.host.disk import disk_usable

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or disk_usable() is not None,
                                reason=f"needs a root runner with loop devices ({disk_usable()})")
# A sample's commands write outside the workspace (the container's own filesystem) and in it.
PROMPT = ("echo {n} > /root/mine && mkdir -p /opt/x && dd if=/dev/zero of=/opt/x/fill bs=1M count=4 2>/dev/null "
          "&& cat /root/mine && ls /opt/x")


class Churn:
    """Other users of the engine: podman commands in a loop; and a watch on Podman's `overlay/` bind
    while samples' containers run."""

    def __init__(self, store: Store) -> None:
        self.store, self.stop, self.quiet = store, threading.Event(), threading.Lock()  # held: no command
        self.commands, self.failures = 0, []
        self.seen: dict[str, int] = {"absent": 0, "present": 0}  # the bind, while a sample's container ran
        self.threads = [threading.Thread(target=self._commands, daemon=True),
                        threading.Thread(target=self._watch, daemon=True)]

    def _commands(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            name = f"churn-{n}"
            steps = [("ps", "-a"), ("images",), ("info",), ("create", "--name", name, "--entrypoint", "true",
                                                             self.store.image), ("rm", "-f", name)]
            if n % 4 == 0:
                steps.append(("run", "--rm", "--entrypoint", "true", self.store.image))
            for step in steps:
                with self.quiet:
                    res = run_podman(self.store.engine, *step, check=False)
                self.commands += 1
                if res.returncode != 0:
                    self.failures.append(f"podman {' '.join(step)}: {res.stderr.strip()[-300:]}")

    def _watch(self) -> None:
        overlay = str(self.store.graph / "overlay")
        while not self.stop.wait(0.02):  # pacing only: nothing waits on this loop
            table = Path("/proc/self/mountinfo").read_text()
            if "trajforge-rootfs-" in table:  # a sample's container runs (on its root filesystem)
                self.seen["present" if f" {overlay} {overlay} " in table else "absent"] += 1

    def __enter__(self) -> Churn:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)


@contextlib.contextmanager
def store_for(tmp_path: Path, engine: Engine) -> Iterator[Store]:
    (tmp_path / "store").mkdir()
    with private_store(tmp_path / "store", engine) as made:
        yield made


def dataset(path: Path, image: str, n: int, tag: str) -> Path:
    path.write_text("".join(json.dumps({"prompt": PROMPT.format(n=f"{tag}{i}"), "image": image}) + "\n"
                            for i in range(n)))
    return path


def run_args(server: ScriptedServer, ds: Path, name: str, *more: str) -> list[str]:
    return ["run", f"--dataset_file={ds}", f"--run_name={name}", f"--base_url={server.url}", "--model=scripted",
            "--distribution=terminal_only", "--container_engine=podman", "--sandbox_network=none", *more]


def kill_at(point: str, tmp_path: Path, env: dict[str, str], args: list[str]) -> int:
    """Run until `point`, SIGKILL the runner there; its pid."""
    child = subprocess.Popen([sys.executable, str(REPO / "tests" / "support" / "crash_container.py"), point, *args],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], 300)
    line = child.stdout.readline() if ready else ""
    os.killpg(child.pid, signal.SIGKILL)
    _, err = child.communicate(timeout=60)
    assert line == f"at {point}\n", f"the runner never reached {point}: {err[-2000:]}"
    return child.pid


def traces_of(pids: list[int]) -> list[str]:
    """Mounts, loop disks and root-filesystem directories named with one of these runners' pids."""
    tags = re.compile(r"(?:\.trajforge-|trajforge-rootfs-|trajforge-ws-)(" + "|".join(map(str, pids)) + r")\b")
    found = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if tags.search(line)]
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            if tags.search(text := backing.read_text()):
                found.append(f"{backing}: {text.strip()}")
    import tempfile

    found += [str(p) for p in Path(tempfile.gettempdir()).iterdir() if tags.search(p.name)]
    return found


def test_no_run_kill_or_churn_wedges_the_engine(tmp_path: Path, podman: Engine,  # noqa: F811 (fixture)
                                                clean_env: dict[str, str]) -> None:
    with store_for(tmp_path, podman) as store:
        # Its own rootfs cache too, so that a runner is killed while making it.
        env = {**clean_env, CONF: store.engine.env[CONF], "XDG_CACHE_HOME": str(tmp_path / "cache")}
        pids: list[int] = []
        with ScriptedServer() as server, Churn(store) as churn:
            server.handler = prompt_command_policy
            for point in POINTS[:1]:  # before any run made the cache
                pids.append(kill_at(point, tmp_path, env, run_args(server, dataset(tmp_path / "k.jsonl", store.image,
                                                                                   1, "k"), "killed-0")))
            # A sample alone on the engine (the loop paused): Podman makes its bind only as the container
            # starts, on top of whatever was mounted beneath it before (the old mechanism's disk).
            with churn.quiet:
                quiet = subprocess.run(cli(*run_args(server, dataset(tmp_path / "q.jsonl", store.image, 1, "q"),
                                                     "quiet")), cwd=tmp_path, env=env, capture_output=True, text=True,
                                       timeout=600)
            assert quiet.returncode == 0, quiet.stderr[-3000:]
            runs = [subprocess.Popen(cli(*run_args(server, dataset(tmp_path / f"r{i}.jsonl", store.image, 6, f"r{i}-"),
                                                   f"run-{i}", "--num_workers=3")),
                                     cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                    for i in range(2)]
            pids += [r.pid for r in runs]
            for i, point in enumerate(POINTS[1:], 1):
                pids.append(kill_at(point, tmp_path, env, run_args(server, dataset(tmp_path / "k.jsonl", store.image,
                                                                                   1, "k"), f"killed-{i}")))
            for r in runs:
                out, err = r.communicate(timeout=900)
                assert r.returncode == 0, err[-3000:]
            # The last runner's leftovers go with the next runner's start, as every other's did.
            final = subprocess.run(cli(*run_args(server, dataset(tmp_path / "f.jsonl", store.image, 1, "f"), "final")),
                                   cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
            assert final.returncode == 0, final.stderr[-3000:]
        assert churn.failures == [], churn.failures[:5]
        # Samples' containers ran both with Podman's bind there and with it removed.
        assert churn.commands > 20 and churn.seen["absent"] > 0 and churn.seen["present"] > 0, \
            (churn.commands, churn.seen)

        run_podman(store.engine, "info")
        dirs = (str(store.graph), str(store.run))
        mounts = storage.parse_mountinfo(Path("/proc/self/mountinfo").read_text())
        assert storage.hidden(mounts, dirs) == []
        beneath = [m for m in mounts if any(m.point == d or m.point.startswith(d + "/") for d in dirs)]
        assert not [m for m in beneath if m.source.startswith("/dev/loop") or "trajforge" in m.point
                    or m.fstype not in ("overlay", "tmpfs", "ext4", "xfs", "btrfs")], beneath
        assert traces_of([p for p in pids if p > 0]) == []
        names = run_podman(store.engine, "ps", "-a", "--external", "--format", "{{.Names}}").stdout.split()
        assert not [n for n in names if n.startswith("trajforge-")], names
        for i in range(2):
            records = (tmp_path / "data" / f"run-{i}" / "trajectories.jsonl").read_text().splitlines()
            answers = [json.loads(r)["conversations"][-1]["value"] for r in records]
            assert len(answers) == 6 and all(f"r{i}-" in a and "fill" in a for a in answers), answers
