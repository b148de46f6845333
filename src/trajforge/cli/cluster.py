"""`trajforge scheduler` and `trajforge worker`: the reference's cluster commands as thin Ray wrappers.

`trajforge scheduler --config distributed.yaml` starts a Ray head (`ray start --head --block`),
optionally waits for workers to join, runs the job described by the file's run keys with
`--executor ray` against that head, then stops the head. The file's `ray:` section (SchedulerRay)
configures the head; every other key is an ordinary run key, and run flags after `--config`
override them. `trajforge worker --address HEAD --pool_size N` becomes `ray start --address HEAD
--block` offering N session slots (the `trajforge_slots` resource) and labelled with the worker id
($TRAJFORGE_WORKER_ID, else the host name), which statistics show per worker; it supervises that
child (WorkerNode): it leaves when its head is gone and takes every Ray process of its node with it.
Both decide Ray's token authentication once (ray_auth) for every Ray process they start.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trajforge.cli.flags import Flag, Parser
from trajforge.config.load import load_yaml_mapping
from trajforge.errors import ConfigError, TrajforgeError, UsageError
from trajforge.executors import ray_auth
from trajforge.executors.ray_actor import SLOT_RESOURCE, WORKER_ENV, WORKER_LABEL
from trajforge.executors.ray_worker import HEAD_GONE_SECONDS, WorkerNode, _die_with_parent, stop_node

RAY_CLI = [sys.executable, "-m", "ray.scripts.scripts"]  # the `ray` command of this interpreter


class SchedulerRay(BaseModel):
    """The `ray:` section of a scheduler config file."""

    model_config = ConfigDict(extra="forbid")

    port: int = Field(6379, ge=1, le=65535, description="port of the head that workers join")
    node_ip_address: str | None = Field(None, description="address workers reach the head at")
    head_slots: int = Field(0, ge=0, description="session slots on the head itself (0: it only schedules)")
    min_workers: int = Field(0, ge=0, description="start the job once this many nodes offer slots")
    wait_timeout: float = Field(600.0, gt=0, description="seconds to wait for min_workers")
    num_cpus: int | None = Field(None, ge=0, description="CPUs the head offers Ray")
    object_store_memory: int | None = Field(None, ge=78_643_200, description="bytes of the head's object store")
    temp_dir: Path | None = Field(None, description="Ray's session directory on the head")

    @property
    def address(self) -> str:
        return f"{self.node_ip_address or '127.0.0.1'}:{self.port}"


def load_scheduler_config(path: Path, overrides: list[str]) -> tuple[SchedulerRay, Any]:
    """Split the file into its `ray:` section and a RunConfig (run keys < command-line overrides)."""
    from trajforge.cli.run import parse_run_args

    raw = load_yaml_mapping(path)
    try:
        settings = SchedulerRay.model_validate(raw.pop("ray", None) or {})
    except ValidationError as e:
        err = e.errors()[0]
        raise ConfigError(f"{path}: key 'ray.{'.'.join(map(str, err['loc']))}': {err['msg']}") from None
    config, _ = parse_run_args(["--config", str(path), *overrides], "trajforge scheduler", strict_required=False,
                               file_keys=raw)
    if config is None:
        raise UsageError("trajforge scheduler runs a job; use 'trajforge distributions' to list distributions")
    return settings, config


class Head:
    """A `ray start --head --block` child: ready when Ray says so, stopped (with its node) on close."""

    def __init__(self, settings: SchedulerRay, verbose: bool) -> None:
        cmd = [*RAY_CLI, "start", "--head", "--block", f"--port={settings.port}", "--include-dashboard=false",
               "--disable-usage-stats", *_node_flags(settings.node_ip_address, settings.num_cpus,
                                                      settings.object_store_memory, settings.temp_dir)]
        if settings.head_slots:
            cmd.append(f"--resources={json.dumps({SLOT_RESOURCE: settings.head_slots})}")
        self.output: collections.deque[str] = collections.deque(maxlen=40)
        self._ready = threading.Event()
        self._verbose = verbose
        # Popen, not asyncio: the head outlives the run's own event loop. Its own session keeps a
        # Ctrl-C meant for the run away from it; PDEATHSIG takes it down if we are killed.
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True, preexec_fn=_die_with_parent)
        threading.Thread(target=self._drain, name="ray-head-output", daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line.rstrip())
            if self._verbose:
                print(f"[ray head] {line.rstrip()}", file=sys.stderr)
            if "Ray runtime started" in line:
                self._ready.set()
        self._ready.set()  # exited: wait_ready reports the failure

    def wait_ready(self, timeout: float = 120.0) -> None:
        if not self._ready.wait(timeout) or self.proc.poll() is not None:
            tail = "\n".join(self.output)
            raise TrajforgeError(f"the Ray head did not start:\n{tail}")

    def close(self, grace: float = 30.0) -> None:
        stop_node(self.proc, grace)


def _node_flags(ip: str | None, num_cpus: int | None, store: int | None, temp_dir: Path | None) -> list[str]:
    flags = [f"--node-ip-address={ip}"] if ip else []
    flags += [f"--num-cpus={num_cpus}"] if num_cpus is not None else []
    flags += [f"--object-store-memory={store}"] if store else []
    return flags + ([f"--temp-dir={temp_dir}"] if temp_dir else [])


def wait_for_workers(count: int, timeout: float) -> None:
    """Block until `count` distinct nodes offer slots: a placement group is Ray's event for that."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    if count <= 0:
        return
    print(f"trajforge: waiting up to {timeout:g}s for {count} worker(s) to join", file=sys.stderr)
    pg = placement_group([{SLOT_RESOURCE: 1}] * count, strategy="STRICT_SPREAD")
    try:
        ray.get(pg.ready(), timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise TrajforgeError(f"only part of the {count} worker(s) (ray.min_workers) joined "
                             f"within {timeout:g}s") from None
    finally:
        remove_placement_group(pg)


def scheduler_main(argv: list[str]) -> int:
    keys = "\n".join(f"  {name}: {f.description or ''} [default: {f.default}]"
                     for name, f in SchedulerRay.model_fields.items())
    parser = Parser(
        "trajforge scheduler", "Start a Ray head, wait for workers, run the job of FILE on the cluster, stop the head.",
        [Flag("config", "path", "YAML: run keys plus a `ray:` section", required=True)],
        usage="trajforge scheduler --config FILE [run flags that override the file]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"FILE holds run keys (as for `trajforge run --config`) plus a `ray:` section:\n{keys}")
    ns, overrides = parser.parse_known(argv)
    settings, config = load_scheduler_config(ns.config, overrides)
    auth = ray_auth.decide()
    import ray

    from trajforge.executors import make_executor
    from trajforge.runner.main import run

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray_auth.apply(auth)  # the head, this driver and the run's actors: one mode
    print(f"trajforge: {auth.describe()}" + ("; every worker node needs the same token" if auth.mode == "token"
                                              else ""), file=sys.stderr)
    head = Head(settings, config.verbose)
    try:
        head.wait_ready()
        print(f"trajforge: Ray head at {settings.address}; join workers with: "
              f"trajforge worker --address {settings.address} --pool_size N", file=sys.stderr)
        try:
            ray.init(address=settings.address, logging_level=logging.WARNING, log_to_driver=config.verbose)
        except Exception as e:  # ConnectionError around the real cause: one line, never a traceback
            text = f"{e} {e.__cause__ or ''}"
            if ray_auth.is_auth_failure(text):
                raise TrajforgeError(ray_auth.failure_message(f"Ray head at {settings.address}", auth)) from None
            raise TrajforgeError(f"cannot connect to the Ray head at {settings.address}: {e}") from None
        wait_for_workers(settings.min_workers, settings.wait_timeout)
        return run(config.model_copy(update={"executor": "ray", "ray_address": settings.address}), make_executor)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        head.close()


def worker_command(address: str, pool_size: int, worker_id: str, extra: argparse.Namespace) -> list[str]:
    return [*RAY_CLI, "start", "--block", f"--address={address}", "--disable-usage-stats",
            f"--resources={json.dumps({SLOT_RESOURCE: pool_size})}", f"--labels={WORKER_LABEL}={worker_id}",
            *_node_flags(extra.node_ip_address, extra.num_cpus, extra.object_store_memory, extra.temp_dir)]


def worker_flags() -> list[Flag]:
    return [
        Flag("address", "str", "the head's HOST:PORT (printed by trajforge scheduler) (required)", required=True),
        Flag("pool_size", "int", "sessions this node runs at once", default=4),
        Flag("worker_id", "str", f"name in statistics [default: ${WORKER_ENV}, else the host name]",
             default=os.environ.get(WORKER_ENV) or socket.gethostname()),
        Flag("node_ip_address", "str", "address the head reaches this node at"),
        Flag("num_cpus", "int", "CPUs this node offers Ray"),
        Flag("object_store_memory", "int", "bytes of this node's object store"),
        Flag("temp_dir", "path", "Ray's session directory on this node"),
        Flag("head_timeout", "float", "seconds without the head before this worker exits", default=HEAD_GONE_SECONDS),
        Flag("verbose", "bool", "show Ray's own output"),
    ]


def worker_main(argv: list[str]) -> int:
    ns = Parser("trajforge worker", "Join a trajforge Ray cluster, offering session slots. Exits when its head goes "
                "away; SIGTERM or Ctrl-C stops this node's Ray processes.", worker_flags()).parse(argv)
    if ns.pool_size < 1:
        raise UsageError(f"--pool_size: invalid value {ns.pool_size}: must be at least 1")
    if ns.head_timeout <= 0:
        raise UsageError(f"--head_timeout: invalid value {ns.head_timeout:g}: must be greater than 0")
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?", ns.worker_id):
        raise UsageError(f"--worker_id: invalid value {ns.worker_id!r}: must be 1-63 letters, digits, '-', '_' "
                         "or '.', starting and ending with a letter or digit (a Ray node label)")
    auth = ray_auth.decide()
    cmd = worker_command(ns.address, ns.pool_size, ns.worker_id, ns)
    env = {**os.environ, WORKER_ENV: ns.worker_id, "RAY_USAGE_STATS_ENABLED": "0", ray_auth.MODE_VAR: auth.mode,
           # The raylet gives up on a vanished head (GCS) after this long, and `ray start` ends with it.
           "RAY_gcs_rpc_server_reconnect_timeout_s": str(max(1, round(ns.head_timeout)))}
    print(f"trajforge: worker {ns.worker_id!r} joining {ns.address} with {ns.pool_size} slot(s); {auth.describe()}",
          file=sys.stderr, flush=True)
    return WorkerNode(cmd, env, ns.address, auth, ns.verbose).run()
