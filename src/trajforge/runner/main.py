"""One invocation of a run, start to end: validate, lock, then the invocation itself.

Everything that can be wrong with the input (dataset, prefill file, model key, contradicting
settings: runner.preflight) is checked before the run directory is touched, so bad input never
alters existing output. Once the directory is locked, runner.invocation plans, executes, merges
and reports. stdout/stderr go through runner.console.SafeStream: scrubbed of the run's secrets,
and never fatal when closed. What the event loop is given besides the work (child watcher,
collector settings, SIGINT/SIGTERM, periodic flush) is runner.eventloop's.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

from trajforge.config import RunConfig
from trajforge.config.resolved import Resolved
from trajforge.errors import UsageError
from trajforge.jsonio import dumps
from trajforge.redact import REGISTRY, hide_in_proc, run_secrets
from trajforge.run_layout import RunLayout
from trajforge.runner.state import store
from trajforge.runner.console import safe_std_streams
from trajforge.runner.scheduling.engine import ExecutorFactory
from trajforge.runner.eventloop import tuned_collector, use_pidfd_child_watcher
from trajforge.runner.scheduling.governor import check_prices
from trajforge.runner.invocation import Invocation
from trajforge.runner.preflight import (
    check_container_images, check_endpoint, check_executor, check_network, check_sandbox, check_task_engine,
    choose_backend, choose_model, load_input, load_prefill, refuse_contradictions,
)
from trajforge.runner.reporting.report import ORACLE_MODEL
from trajforge.runner.scheduling.rows import RunRows
from trajforge.runner.state.rundir import RunDir
from trajforge.verify.verifier import check_verification_settings


def run(config: RunConfig, make_executor: ExecutorFactory) -> int:
    """Run the job `config` describes on the executor `make_executor` builds (the command layer's choice)."""
    secrets = run_secrets(config)
    REGISTRY.add(*secrets)
    hide_in_proc(secrets)
    with safe_std_streams():
        return _run_checked(config, make_executor)


def _run_checked(config: RunConfig, make_executor: ExecutorFactory) -> int:
    config, shown, rows, prefill, rundir = _prepare(config)
    rundir.acquire(resume=config.resume, overwrite=config.overwrite)
    watcher = use_pidfd_child_watcher()
    refused = False
    try:
        _tidy(rundir)
        with tuned_collector():
            return asyncio.run(_invoke(config, shown, rows, prefill, rundir, make_executor))
    except UsageError:  # refused at the invocation's start (Invocation.start): before any result was written
        refused = True
        raise
    finally:
        if watcher:  # in-process callers (tests, notebooks) get the default back for their own loops
            asyncio.set_child_watcher(None)
        rundir.release(discard=refused)


async def invoke(config: RunConfig, make_executor: ExecutorFactory, stop: asyncio.Event | None = None) -> int:
    """One invocation of the run `config` describes, in the caller's running event loop (the
    rollout service runs one after another as groups arrive): the same checks, directory lock and
    Invocation as `run`. Its secrets are registered like `run`'s. `stop`: set by the caller to
    start no new sample (and by SIGINT/SIGTERM while the invocation runs)."""
    secrets = run_secrets(config)
    REGISTRY.add(*secrets)
    # the checks run event loops of their own (asyncio.run): a thread of theirs keeps the caller's going
    config, shown, rows, prefill, rundir = await asyncio.to_thread(_prepare, config)
    rundir.acquire(resume=config.resume, overwrite=config.overwrite)
    refused = False
    try:
        _tidy(rundir)
        return await _invoke(config, shown, rows, prefill, rundir, make_executor, stop)
    except UsageError:
        refused = True
        raise
    finally:
        rundir.release(discard=refused)


def _prepare(config: RunConfig) -> tuple[RunConfig, str, RunRows, list[dict[str, Any]] | None, RunDir]:
    """Every check before the run directory is touched, and what the run decided."""
    logging.basicConfig(level=logging.INFO if config.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    if config.verbose:
        print(dumps(config.masked()).decode(), file=sys.stderr)
    assert (config.dataset_file or config.tasks) is not None and config.run_name is not None
    refuse_contradictions(config)
    prefill = load_prefill(config.prefill_messages_file)
    layout = RunLayout(config.output_dir / config.run_name)
    # one pass: every row validated, a few bytes of each kept; a resume reads only what the last
    # invocation did not (rows.idx)
    rows = load_input(config, layout.rows_cache if config.resume else None)
    if config.agent != "oracle":
        model = choose_model(config)
        check_prices(config, model)
    else:  # the oracle calls no model: no endpoint, key or price to check, and its records say "oracle"
        model = ORACLE_MODEL
    network, sandbox = check_network(config.sandbox_settings())
    check_sandbox(config, sandbox)
    check_executor(config)
    check_container_images(config, rows)
    check_task_engine(config, sandbox)
    check_verification_settings(config, rows.path, rows.rubric, rows.verified)
    check_endpoint(config, model)  # the one check that waits on the network
    backend, shown = choose_backend(config, sandbox, rows)
    config = config.resolve(Resolved(model, backend, network))  # what the run decided, once
    return config, shown, rows, prefill, RunDir(layout)


def _tidy(rundir: RunDir) -> None:
    """What a killed invocation left behind, once the directory is locked."""
    leftovers = rundir.remove_leftovers()
    if leftovers:
        print(f"trajforge: removed {leftovers} temporary file(s) left by a killed run", file=sys.stderr)
    for msg in store.repair(rundir.layout):
        print(f"trajforge: {msg}", file=sys.stderr)


async def _invoke(config: RunConfig, shown: str, rows: RunRows, prefill: list[dict[str, Any]] | None,
                  rundir: RunDir, make_executor: ExecutorFactory, stop: asyncio.Event | None = None) -> int:
    return await Invocation(config, shown, rows, prefill, rundir, make_executor, stop=stop).run()
