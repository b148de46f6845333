"""`trajforge scheduler` / `trajforge worker` as a new user meets them (issue #21, item 4).

Ray 2.60 writes ~/.ray/auth_token on any `ray.init()` (an earlier `--executor ray` run), after
which `ray start --head` turns token authentication on while a driver given an explicit address
does not: the scheduler then died on its own head with an InvalidAuthToken traceback. Here every
Ray piece must agree, a mismatched worker gets one clear line, a worker leaves when its head is
gone, and SIGTERM leaves no Ray process behind. HOME is a temporary directory, so the user's own
~/.ray is never read or written; every process a test starts is stopped by its pid.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import cli
from tests.support.policies import echo_policy
from tests.support.scripted_server import ScriptedServer
from tests.executors.test_ray_executor import STORE, _free_port, _stop_group, write_dataset

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason="ray is not installed (pip install trajforge[ray])")


@pytest.fixture
def ray_home(clean_env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    """An environment whose ~/.ray holds a token, as any earlier `ray.init()` leaves it, and no
    RAY_AUTH_MODE: what a user has after one `--executor ray` run."""
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # Ray's unix sockets need a short path
    env = {k: v for k, v in clean_env.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0", RAY_TMPDIR=tmp)
    try:
        yield env
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def processes_with_env(marker: str) -> list[int]:
    """Pids of processes whose environment holds `marker` (every process of a Ray node inherits it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def processes_of_node(worker_id: str, temp_dir: str) -> list[int]:
    """Pids of the processes of a worker's Ray node: its environment says so, or it has a file open
    under the node's --temp_dir (every Ray process keeps its logs there). The second witness does
    not read /proc/<pid>/environ, which Ray's process titles wipe in part unless SPT_NOENV is set:
    a leftover must be seen whatever the worker did to keep its own tag readable."""
    prefix = os.path.join(os.path.realpath(temp_dir), "")
    found = set(processes_with_env(f"TRAJFORGE_WORKER_ID={worker_id}"))
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and any(f.startswith(prefix) for f in _open_files(entry)):
            found.add(int(entry.name))
    return sorted(found)


def _open_files(proc_dir: Path) -> list[str]:
    files = []
    with contextlib.suppress(OSError):  # the process is gone
        for fd in (proc_dir / "fd").iterdir():
            with contextlib.suppress(OSError):  # that descriptor was closed meanwhile
                files.append(os.readlink(fd))
    return files


def worker_argv(port: int, worker_id: str, temp_dir: str, *extra: str) -> list[str]:
    return cli("worker", f"--address=127.0.0.1:{port}", "--pool_size=2", "--num_cpus=1",
               f"--object_store_memory={STORE}", f"--temp_dir={temp_dir}", "--node_ip_address=127.0.0.1",
               f"--worker_id={worker_id}", "--head_timeout=10", *extra)


def test_scheduler_and_workers_agree_on_auth_and_workers_leave_with_their_head(
        tmp_path: Path, server: ScriptedServer, ray_home: dict[str, str]) -> None:
    server.handler = echo_policy(turns=1)
    port = _free_port()
    head_tmp, w_tmp = tempfile.mkdtemp(prefix="rh", dir="/tmp"), tempfile.mkdtemp(prefix="rw", dir="/tmp")
    cfg = tmp_path / "distributed.yaml"
    cfg.write_text(json.dumps({
        "dataset_file": str(write_dataset(tmp_path / "ds.jsonl", 6)), "batch_size": 10, "run_name": "cluster",
        "base_url": server.url, "model": "scripted-model", "distribution": "terminal_only", "sandbox": "local",
        "num_workers": 2, "ray": {"port": port, "node_ip_address": "127.0.0.1", "min_workers": 1, "num_cpus": 1,
                                  "object_store_memory": STORE, "temp_dir": head_tmp, "wait_timeout": 240}}))
    sched = subprocess.Popen(cli("scheduler", "--config", str(cfg)), cwd=tmp_path, env=ray_home, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    procs: list[subprocess.Popen[str]] = [sched]
    err: list[str] = []
    try:
        assert sched.stderr is not None
        for line in sched.stderr:
            err.append(line)
            if "join workers with" in line:
                break
        drain = threading.Thread(target=lambda: err.extend(sched.stderr), daemon=True)  # type: ignore[arg-type]
        drain.start()
        assert "Ray authentication: token" in "".join(err), "".join(err)

        # A worker told to run without authentication is refused by the head: one clear line.
        bad = subprocess.run(worker_argv(port, "w-bad", w_tmp), cwd=tmp_path, capture_output=True, text=True,
                             env={**ray_home, "RAY_AUTH_MODE": "disabled"}, timeout=180)
        assert bad.returncode == 1, bad.stderr
        assert "RAY_AUTH_MODE" in bad.stderr and "same token" in bad.stderr and "Traceback" not in bad.stderr
        assert bad.stderr.count("\n") <= 3, bad.stderr

        # One with the same token joins; the job runs; when the scheduler stops its head, it leaves.
        worker_id = f"w-{secrets.token_hex(4)}"
        worker = subprocess.Popen(worker_argv(port, worker_id, w_tmp), cwd=tmp_path, env=ray_home, text=True,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        procs.append(worker)
        assert sched.wait(240) == 0, "".join(err)
        _, werr = worker.communicate(timeout=120)  # a worker that stayed after its head: this timeout
        assert worker.returncode == 0, werr
        assert "joined the cluster" in werr and "went away" in werr and "Traceback" not in werr
        assert processes_of_node(worker_id, w_tmp) == []
        drain.join(10)
        stderr = "".join(err)
        assert "Traceback" not in stderr and "InvalidAuthToken" not in stderr, stderr
        stats = json.loads((tmp_path / "data" / "cluster" / "statistics.json").read_text())
        assert stats["run"]["samples"]["finished"] == 6
        assert stats["last_invocation"]["per_worker"] == {worker_id: 6}
    finally:
        for p in procs:
            _stop_group(p, 60)
        shutil.rmtree(head_tmp, ignore_errors=True)
        shutil.rmtree(w_tmp, ignore_errors=True)


def test_sigterm_stops_the_worker_and_every_ray_process_of_its_node(tmp_path: Path,
                                                                     ray_home: dict[str, str]) -> None:
    port = _free_port()
    head_tmp, w_tmp = tempfile.mkdtemp(prefix="rh", dir="/tmp"), tempfile.mkdtemp(prefix="rw", dir="/tmp")
    head = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
                             f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=1",
                             f"--object-store-memory={STORE}", f"--temp-dir={head_tmp}", "--include-dashboard=false",
                             "--disable-usage-stats"], env=ray_home, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    worker: subprocess.Popen[str] | None = None
    try:
        assert head.stdout is not None
        for line in head.stdout:
            if "Ray runtime started" in line:
                break
        threading.Thread(target=head.stdout.read, daemon=True).start()
        worker_id = f"w-{secrets.token_hex(4)}"
        worker = subprocess.Popen(worker_argv(port, worker_id, w_tmp), cwd=tmp_path, env=ray_home, text=True,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        assert worker.stderr is not None
        lines = []
        for line in worker.stderr:
            lines.append(line)
            if "joined the cluster" in line:
                break
        assert "joined the cluster" in "".join(lines), "".join(lines)
        assert processes_with_env(f"TRAJFORGE_WORKER_ID={worker_id}")  # raylet and its agents
        os.kill(worker.pid, signal.SIGTERM)
        rest = worker.stderr.read()
        assert worker.wait(60) == 130, rest
        assert "no Ray process of this node is left" in rest and "Traceback" not in rest
        assert processes_of_node(worker_id, w_tmp) == []
    finally:
        if worker is not None:
            _stop_group(worker, 60)
        _stop_group(head, 60)
        shutil.rmtree(head_tmp, ignore_errors=True)
        shutil.rmtree(w_tmp, ignore_errors=True)
