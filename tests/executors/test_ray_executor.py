"""Distributed runs on Ray (SPEC section 11) against the scripted model server.

A local Ray instance must give the same trajectories and statistics as the local executor; a
killed actor or a killed worker node must lose no sample; the scheduler/worker commands must form
a real two-node cluster on loopback. Ray's temp dirs live under short /tmp paths because its unix
sockets have a ~107-character path limit. Every Ray process a test starts is stopped by its pid.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import cli
from tests.support.heap import IN_HEAP
from tests.support.policies import echo_policy
from tests.support.scripted_server import Recorded, Reply, ScriptedServer, with_usage
from tests.support.run_state import statuses

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="ray is not installed (pip install trajforge[ray])")
STORE = 100 * 1024 * 1024


def write_dataset(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"say token{i}"}) + "\n" for i in range(n)))
    return path


def run_args(server: ScriptedServer, dataset: Path, run_name: str, *extra: str) -> list[str]:
    return [f"--dataset_file={dataset}", "--batch_size=10", f"--run_name={run_name}", f"--base_url={server.url}",
            "--model=scripted-model", "--distribution=terminal_only", "--sandbox=local", *extra]


def normalised_records(run: Path) -> dict[str, dict]:
    """sample_id -> record, without what legitimately differs between runs (time, server call ids)."""
    out = {}
    for line in (run / "trajectories.jsonl").read_text().splitlines():
        rec = json.loads(re.sub(r"call_\d+", "call_X", line))
        rec["metadata"].pop("timestamp")
        rec.pop("timing")  # seconds: no two runs take the same
        out[rec["sample_id"]] = rec
    return out


def comparable_stats(run: Path) -> dict:
    stats = json.loads((run / "statistics.json").read_text())
    for part in ("run", "last_invocation"):
        for key in ("duration_seconds", "throughput_samples_per_minute", "per_worker"):
            stats[part].pop(key, None)
    stats.pop("run_name")
    stats.pop("concurrency", None)  # the local gate's traffic; Ray actors each have their own
    return stats


@pytest.fixture
def ray_env(clean_env: dict[str, str]) -> Iterator[dict[str, str]]:
    tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")
    env = {**clean_env, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": tmp}
    try:
        yield env
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_local_run_never_imports_ray(tmp_path: Path, server: ScriptedServer, clean_env: dict[str, str]) -> None:
    server.handler = echo_policy(turns=1)
    ds = write_dataset(tmp_path / "ds.jsonl", 2)
    script = ("import sys\nfrom trajforge.cli import main\n"
              f"rc = main(['run', *{run_args(server, ds, 'r')!r}])\n"
              "print('rc', rc, 'ray-loaded', any(m == 'ray' or m.startswith('ray.') for m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=clean_env, capture_output=True,
                          text=True, timeout=120)
    assert "rc 0 ray-loaded False" in proc.stdout, proc.stdout + proc.stderr


@needs_ray
def test_plan_prefers_nodes_offering_slots_and_splits_otherwise() -> None:
    from trajforge.executors.ray_actor import plan_actors

    head = {"NodeID": "h" * 8, "Alive": True, "Resources": {"CPU": 2.0}, "Labels": {}}
    w1 = {"NodeID": "a" * 8, "Alive": True, "Resources": {"trajforge_slots": 130.0},
          "Labels": {"trajforge-worker-id": "w1"}}
    gone = {"NodeID": "b" * 8, "Alive": False, "Resources": {"trajforge_slots": 4.0}, "Labels": {}}
    assert plan_actors([head, w1, gone], 8, set()) == {"a" * 8: ("w1", [64, 64, 2])}
    assert plan_actors([head, w1, gone], 8, {"a" * 8}) == {"h" * 8: ("", [8])}  # fallback: the head works
    two = [head, {**head, "NodeID": "c" * 8}]
    assert plan_actors(two, 5, set()) == {"h" * 8: ("", [3]), "c" * 8: ("", [2])}
    assert plan_actors([gone], 5, set()) == {}


@needs_ray
def test_scheduler_config_errors_name_the_users_file(tmp_path: Path) -> None:
    from trajforge.errors import UsageError
    from trajforge.cli.cluster import load_scheduler_config, worker_main

    cfg = tmp_path / "distributed.yaml"
    cfg.write_text("dataset_file: ds.jsonl\nray: {port: 0}\n")
    with pytest.raises(UsageError, match=r"distributed.yaml: key 'ray.port'"):
        load_scheduler_config(cfg, [])
    cfg.write_text("dataset_file: ds.jsonl\nnum_workerz: 3\nray: {port: 7000, head_slots: 2}\n")
    with pytest.raises(UsageError, match=rf"{re.escape(str(cfg))}: unknown key 'num_workerz'.*num_workers"):
        load_scheduler_config(cfg, [])
    cfg.write_text("dataset_file: ds.jsonl\nnum_workers: 3\nray: {port: 7000, head_slots: 2}\n")
    settings, config = load_scheduler_config(cfg, ["--num_workers=9"])
    assert (settings.port, settings.head_slots, settings.address) == (7000, 2, "127.0.0.1:7000")
    assert config.num_workers == 9 and config.dataset_file == Path("ds.jsonl")
    example = Path(__file__).resolve().parents[2] / "examples" / "distributed.yaml"
    settings, config = load_scheduler_config(example, [])
    assert settings.port == 6379 and settings.min_workers == 1 and config.num_workers == 16
    with pytest.raises(UsageError, match="--worker_id"):
        worker_main(["--address=127.0.0.1:1", "--worker_id=bad id"])


@needs_ray
def test_ray_executor_gives_the_same_trajectories_and_statistics(tmp_path: Path, server: ScriptedServer,
                                                                  ray_env: dict[str, str]) -> None:
    server.handler = echo_policy(turns=1)
    ds = write_dataset(tmp_path / "ds.jsonl", 40)
    local = subprocess.run(cli("run", *run_args(server, ds, "local", "--num_workers=4")), cwd=tmp_path,
                           env=ray_env, capture_output=True, text=True, timeout=180)
    assert local.returncode == 0, local.stderr
    dist = subprocess.run(cli("run", *run_args(server, ds, "ray", "--num_workers=4", "--executor=ray")),
                          cwd=tmp_path, env=ray_env, capture_output=True, text=True, timeout=300)
    assert dist.returncode == 0, dist.stderr
    a, b = tmp_path / "data" / "local", tmp_path / "data" / "ray"
    assert len(normalised_records(a)) == 40
    assert normalised_records(a) == normalised_records(b)
    assert comparable_stats(a) == comparable_stats(b)
    per_worker = json.loads((b / "statistics.json").read_text())["last_invocation"]["per_worker"]
    assert sum(per_worker.values()) == 40 and all(w.startswith("ray-") for w in per_worker), per_worker
    assert sorted(p.name for p in a.glob("batch_*.jsonl")) == sorted(p.name for p in b.glob("batch_*.jsonl"))
    assert {k for k, v in statuses(b).items() if v == "done"} == set(normalised_records(a))


@needs_ray
def test_config_and_statistics_name_the_sandbox_the_nodes_chose(tmp_path: Path, server: ScriptedServer,
                                                                ray_env: dict[str, str]) -> None:
    # `--sandbox auto` is decided on each node; config.json and statistics.json said "auto".
    from trajforge.sandbox.factory import resolve_backend
    from trajforge.sandbox.sandbox_settings import SandboxSettings

    server.handler = echo_policy(turns=1)
    ds = write_dataset(tmp_path / "ds.jsonl", 4)
    args = [a for a in run_args(server, ds, "ray", "--num_workers=2", "--executor=ray") if a != "--sandbox=local"]
    proc = subprocess.run(cli("run", *args), cwd=tmp_path, env=ray_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    chosen, _ = asyncio.run(resolve_backend(SandboxSettings()))  # what auto is on this machine, the only node
    run = tmp_path / "data" / "ray"
    assert json.loads((run / "statistics.json").read_text())["sandbox"] == chosen != "auto"
    assert json.loads((run / "config.json").read_text())["sandbox"] == chosen
    assert f"sandbox {chosen} (chosen on each node) -> " in proc.stderr, proc.stderr


@needs_ray
def test_budget_holds_at_the_driver_with_costs_reported_by_the_actors(tmp_path: Path, server: ScriptedServer,
                                                                       ray_env: dict[str, str]) -> None:
    server.handler = with_usage(echo_policy(turns=1, delay=0.05), 100, 20, cost=0.01)  # $0.02 a sample
    ds = write_dataset(tmp_path / "ds.jsonl", 20)
    (tmp_path / "c.yaml").write_text("pricing: {scripted-model: {prompt: 1, completion: 1}}\n")
    proc = subprocess.run(cli("run", *run_args(server, ds, "ray", "--num_workers=2", "--executor=ray",
                                               f"--config={tmp_path / 'c.yaml'}", "--max_cost=0.2")),
                          cwd=tmp_path, env=ray_env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert "budget reached" in proc.stderr
    spent = len(server.chat_requests()) * 0.01
    stats = json.loads((tmp_path / "data" / "ray" / "statistics.json").read_text())
    assert stats["spend"]["spent"] == pytest.approx(spent)  # every actor-side call reached the driver's budget
    assert 0.18 <= spent <= 0.2 + 2 * 0.02


@needs_ray
def test_killed_actor_mid_run_loses_nothing(tmp_path: Path, server: ScriptedServer,
                                            ray_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    from trajforge.config import RunConfig
    from trajforge.dataset import load_dataset
    from trajforge.executors.ray import RayExecutor
    from trajforge.runner.scheduling.engine import run_engine
    from trajforge.sample.outcome import Outcome

    for key in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED", "RAY_TMPDIR"):
        monkeypatch.setenv(key, ray_env[key])
    samples = load_dataset(write_dataset(tmp_path / "ds.jsonl", 16)).samples
    config = RunConfig(dataset_file=tmp_path / "ds.jsonl", batch_size=4, run_name="k", base_url=server.url,
                       model="scripted-model", distribution="terminal_only", sandbox="local", num_workers=4)
    ray.init(num_cpus=2, object_store_memory=STORE, include_dashboard=False, log_to_driver=False)
    executor = RayExecutor(config)
    policy, seen = echo_policy(turns=1, delay=0.3), [0]

    def handler(req: Recorded) -> Reply:
        seen[0] += 1
        if seen[0] == 10:  # mid-run, with this request's session (and three more) in flight on the only actor
            ray.kill(executor.actor_handles[0])
        return policy(req)

    server.handler = handler
    outcomes: list[Outcome] = []

    async def main() -> None:
        assert await executor.start() == []
        # The actor's process reads its sessions' model replies: its allocator is tuned too.
        assert await executor.actor_handles[0].__ray_call__.remote(
            lambda actor, src=IN_HEAP: (ns := {}, exec(src, ns), ns["tuned"]())[2]) is True
        try:
            await run_engine(samples, executor, outcomes.append, lambda s: 1, asyncio.Event())
        finally:
            await executor.aclose()

    try:
        asyncio.run(main())
    finally:
        ray.shutdown()
    assert executor.lost == 1
    assert sorted(o.identity for o in outcomes) == sorted(s.identity for s in samples)
    assert {o.status for o in outcomes} == {"done"} and {o.attempts for o in outcomes} == {1}
    assert len(server.chat_requests()) > 2 * len(samples)  # the killed sessions really ran, and ran again
    for o in outcomes:
        assert o.record is not None and f"token{o.index}" in json.dumps(o.record) and o.worker.startswith("ray-")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_group(proc: subprocess.Popen[str], grace: float) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def cluster_run(tmp_path: Path, server: ScriptedServer, env: dict[str, str], n: int, kill_after: int,
                delay: float) -> tuple[Path, str]:
    """`trajforge scheduler` + `trajforge worker` (w2) on loopback; kill w2's node after `kill_after` requests."""
    policy, seen, reached = echo_policy(turns=1, delay=delay), [0], threading.Event()

    def handler(req: Recorded) -> Reply:
        seen[0] += 1
        if seen[0] >= kill_after:
            reached.set()
        return policy(req)

    server.handler = handler
    port, head_tmp, worker_tmp = _free_port(), tempfile.mkdtemp(prefix="rh", dir="/tmp"), \
        tempfile.mkdtemp(prefix="rw", dir="/tmp")
    cfg = tmp_path / "distributed.yaml"
    cfg.write_text(json.dumps({
        "dataset_file": str(write_dataset(tmp_path / "ds.jsonl", n)), "batch_size": 50, "run_name": "cluster",
        "base_url": server.url, "model": "scripted-model", "distribution": "terminal_only", "sandbox": "local",
        "num_workers": 4, "ray": {"port": port, "node_ip_address": "127.0.0.1", "min_workers": 1, "num_cpus": 1,
                                  "object_store_memory": STORE, "temp_dir": head_tmp, "wait_timeout": 120}}))
    sched = subprocess.Popen(cli("scheduler", "--config", str(cfg)), cwd=tmp_path, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    worker: subprocess.Popen[str] | None = None
    err: list[str] = []
    try:
        assert sched.stderr is not None
        for line in sched.stderr:
            err.append(line)
            if "join workers with" in line:
                break
        drain = threading.Thread(target=lambda: err.extend(sched.stderr), daemon=True)  # type: ignore[arg-type]
        drain.start()
        worker = subprocess.Popen(
            cli("worker", f"--address=127.0.0.1:{port}", "--pool_size=4", "--num_cpus=1",
                f"--object_store_memory={STORE}", f"--temp_dir={worker_tmp}", "--node_ip_address=127.0.0.1"),
            cwd=tmp_path, env={**env, "TRAJFORGE_WORKER_ID": "w2"}, text=True, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        assert reached.wait(180), "".join(err)
        os.killpg(worker.pid, signal.SIGKILL)  # the whole worker node: raylet, object store, actors
        worker.wait()
        sched.wait(300)
        drain.join(10)
        assert sched.returncode == 0, "".join(err)
        return tmp_path / "data" / "cluster", "".join(err)
    finally:
        if worker is not None:
            _stop_group(worker, 5)
        _stop_group(sched, 60)
        shutil.rmtree(head_tmp, ignore_errors=True)
        shutil.rmtree(worker_tmp, ignore_errors=True)


@needs_ray
def test_two_node_cluster_survives_losing_the_worker_node(tmp_path: Path, server: ScriptedServer,
                                                          ray_env: dict[str, str]) -> None:
    # SPEC 11's done-when: 500 samples, the worker process killed mid-run, all 500 end up once.
    n = int(os.environ.get("TRAJFORGE_RAY_TEST_SAMPLES", "500"))
    key = "sk-driver-only-3141"  # only the scheduler's environment has it: the worker node gets it from the driver
    run, stderr = cluster_run(tmp_path, server, {**ray_env, "OPENROUTER_API_KEY": key}, n,
                              # killed at 40% with enough latency left that the head must take over: an
                              # actor may keep answering for a moment after its node is killed
                              kill_after=max(4, 2 * n * 2 // 5), delay=0.05)
    records = normalised_records(run)
    expected = {json.loads(line)["prompt"] for line in (tmp_path / "ds.jsonl").read_text().splitlines()}
    assert len(records) == n and {r["conversations"][1]["value"] for r in records.values()} == expected
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["run"]["samples"]["finished"] == n and stats["run"]["samples"]["failed"] == 0
    assert stats["merge"]["duplicates_ignored"] == 0 and stats["run"]["tokens"]["prompt"] == n * 20
    per_worker = stats["last_invocation"]["per_worker"]
    assert per_worker.get("w2", 0) > 0 and sum(per_worker.values()) == n, per_worker
    assert len(per_worker) == 2, per_worker  # the rest ran on the head once w2 was gone
    assert "Ray worker on node" in stderr and "retried elsewhere" in stderr
    assert len(server.chat_requests()) > 2 * n  # samples in flight on w2 when it died ran again on the head
    assert {r.headers.get("Authorization") for r in server.requests} == {f"Bearer {key}"}
    assert key not in stderr and not any(key.encode() in p.read_bytes() for p in run.iterdir() if p.is_file())
