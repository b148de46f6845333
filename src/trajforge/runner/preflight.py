"""Checks before a run touches anything: settings that contradict each other, the prefill file,
the model and its key, the executor. Each failure is a UsageError (exit 2) naming the flag, so
bad input never alters an existing run directory and a run that could only fail never starts.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from trajforge.catalog.executors import EXECUTORS
from trajforge.catalog.sandboxes import AUTO, SANDBOXES, NetworkMode, image_backend, network_refusal, runs_on_host
from trajforge.config import RunConfig
from trajforge.errors import UsageError
from trajforge.jsonio import loads
from trajforge.registry import words
from trajforge.sandbox.sandbox_settings import SandboxSettings
from trajforge.runner.scheduling.rows import RunRows


def contradictions(config: RunConfig) -> list[str]:
    """Settings that cannot all hold: each would make every sample fail or silently do nothing."""
    c = config
    found = []
    refused = network_refusal(c.sandbox, c.sandbox_network)  # what the backend's spec offers
    if refused is not None:
        found.append(refused)
    if c.resume and c.overwrite:
        found.append("--resume and --overwrite contradict each other: --resume continues the run, --overwrite "
                     "deletes it; give one")
    if c.reasoning_disabled and c.reasoning_effort not in (None, "none"):
        found.append(f"--reasoning_disabled contradicts --reasoning_effort {c.reasoning_effort}; give one")
    no_reasoning = c.reasoning_disabled or c.reasoning_effort == "none"
    if no_reasoning and not c.keep_no_reasoning:
        flag = "--reasoning_disabled" if c.reasoning_disabled else "--reasoning_effort none"
        found.append(f"{flag} without --keep_no_reasoning would discard every sample (samples without "
                     "reasoning are dropped by default); add --keep_no_reasoning")
    both = sorted(set(c.providers_allowed or ()) & set(c.providers_ignored or ()))
    if both:
        found.append(f"--providers_allowed and --providers_ignored both name {', '.join(both)}; give each "
                     "provider in one of them")
    for spec in EXECUTORS.specs():  # a setting only one executor reads
        if spec.settings and getattr(c, spec.settings) and c.executor != spec.name:
            found.append(f"--{spec.settings} is only used with --executor {spec.name}; add --executor {spec.name} "
                         "or drop it")
    if c.keep_workspaces and not EXECUTORS[c.executor].capabilities.in_process:
        here = words([s.name for s in EXECUTORS.specs() if s.capabilities.in_process])
        found.append(f"--keep_workspaces is not supported with --executor {c.executor} (workspaces live on the worker "
                     f"nodes); drop it or use --executor {here}")
    return found


def refuse_contradictions(config: RunConfig) -> None:
    found = contradictions(config)
    if found:
        raise UsageError("\n".join(found))


def load_prefill(path: Path | None) -> list[dict[str, Any]] | None:
    if path is None:
        return None
    try:
        data = loads(path.read_bytes())
    except OSError as e:
        raise UsageError(f"--prefill_messages_file: cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise UsageError(f"--prefill_messages_file: {path} is not valid JSON: {e}") from None
    if not isinstance(data, list):
        raise UsageError(f"--prefill_messages_file: {path} must hold a JSON list of messages")
    for i, m in enumerate(data):
        if not (isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
                and isinstance(m.get("content"), str)):
            raise UsageError(f"--prefill_messages_file: {path}: message {i} must be an object with role "
                             "system/user/assistant and a string content")
    return data


def choose_model(config: RunConfig) -> str:
    """The model the run will use: --model, or the bundled local one when no API is reachable."""
    from trajforge.model.endpoint import NoKey, endpoint
    from trajforge.model.factory import is_local_model, should_use_local

    settings = config.model_settings()
    named = "model" in config.model_fields_set  # a flag or a config file key, even the default's name
    if should_use_local(settings, named=named) and not is_local_model(config.model):
        print("trajforge: no API key, no --base_url and no --model: using the bundled local model (--model "
              "local); set OPENROUTER_API_KEY or pass --base_url/--api_key to use an API", file=sys.stderr)
        return _local_model(config, "local")
    if is_local_model(config.model):
        return _local_model(config, config.model)
    try:
        endpoint(settings.base_url, api_key=settings.api_key)
    except NoKey as e:
        instead = (f" (--model {config.model} was named, so the bundled local model does not stand in for it: "
                   "pass --model local for that)") if named and settings.base_url is None else ""
        raise UsageError(f"{e}{instead}") from None
    return config.model


def _local_model(config: RunConfig, model: str) -> str:
    """`model` (local[:path]) once its file and backend are there: a missing one is refused here,
    before the start line, said once."""
    from trajforge.model.factory import check_client

    check_client(config.model_settings(model))
    return model


def check_endpoint(config: RunConfig, model: str) -> None:
    """The model's endpoint answers (model.probe): a mistyped or down --base_url is refused here,
    naming the URL (exit 2), instead of after every sample has spent its retries on it."""
    from trajforge.model.factory import is_local_model
    from trajforge.model.probe import unreachable
    from trajforge.model.types import DEFAULT_BASE_URL

    if config.agent == "oracle" or is_local_model(model):
        return
    if not EXECUTORS[config.executor].capabilities.in_process:
        return  # the nodes make the calls: a loopback URL means each node's own server, not this one's
    url = config.base_url or DEFAULT_BASE_URL
    why = asyncio.run(unreachable(url, timeout=min(config.request_timeout, 10.0)))
    if why is not None:
        flag = "--base_url" if config.base_url else "the default endpoint (no --base_url)"
        raise UsageError(f"{flag} {url} does not answer ({why}); check the URL and that the server is up")


def check_network(settings: SandboxSettings) -> tuple[NetworkMode, SandboxSettings]:
    """The run's network mode, `auto` resolved (the sandbox's own resolution, sandbox/network.py),
    and the sandbox settings with it; an explicit egress that cannot be had stops here (exit 2)."""
    from trajforge.sandbox.network import resolve_mode

    mode, note = asyncio.run(resolve_mode(settings))
    if note:
        print(f"trajforge: {note}", file=sys.stderr)
    return mode, settings.with_network(mode)


def choose_backend(config: RunConfig, settings: SandboxSettings, rows: RunRows) -> tuple[str, str]:
    """The sandbox backend of rows without an image, `--sandbox auto` decided here once (so the start
    line, config.json and statistics.json name the backend the samples really use), and how the
    start line shows it. A fallback to one that isolates less says why and how to get isolation."""
    if config.tasks is not None:
        return config.sandbox, f"{image_backend().name} (tasks)"
    if not EXECUTORS[config.executor].capabilities.in_process:
        return config.sandbox, f"{config.sandbox} (chosen on each node)" if config.sandbox == AUTO else config.sandbox
    from trajforge.sandbox.factory import resolve_backend

    kind, passed = asyncio.run(resolve_backend(settings))
    for name, reason in passed:
        print(f"trajforge: --sandbox auto: {name} is not usable here ({reason}), so commands run in the "
              f"`{kind}` sandbox WITHOUT isolation from this host; run `trajforge doctor` to see how to get "
              f"isolation, or pass --sandbox {kind} to accept it", file=sys.stderr)
    runs_images = image_backend().name
    return kind, f"{kind} (rows with an image: {runs_images})" if rows.with_image and kind != runs_images else kind


def check_sandbox(config: RunConfig, settings: SandboxSettings) -> None:
    """An explicit `--sandbox NAME` whose backend does not work here would let every sample spend a
    model call and then fail as `sandbox`: refuse before any work, with what is broken (exit 2), as
    an explicit egress that cannot be had is. `auto` picks a working one itself; the nodes of
    another executor and the containers of --tasks are checked where they run."""
    if config.sandbox == AUTO or config.tasks is not None or not EXECUTORS[config.executor].capabilities.in_process:
        return
    from trajforge.sandbox.factory import backend_status

    spec = SANDBOXES[config.sandbox]
    status = asyncio.run(backend_status(spec, settings))
    if not status.usable:  # fix(): what is broken and how to repair it; else it is missing: install it
        why = status.fix() or f"{status.detail}; {spec.capabilities.enable}".rstrip("; ")
        raise UsageError(f"--sandbox {spec.name} cannot work here: {why}. `trajforge doctor` shows which sandboxes "
                         "work here (--sandbox auto picks the best of them)")


def check_executor(config: RunConfig) -> None:
    if (why := EXECUTORS[config.executor].missing()) is not None:
        raise UsageError(f"--executor {config.executor}: {why}")


def load_input(config: RunConfig, cache: Path | None = None) -> RunRows:
    """The run's samples: the dataset's rows (read in one pass, or on from `cache`: runner.scheduling.rows),
    or the tasks of --tasks (trajforge.tasks.load), held whole."""
    if config.tasks is not None:
        from trajforge.tasks.load import load_tasks

        return RunRows.held(config, load_tasks(config.tasks, skip_invalid=config.skip_invalid,
                                               max_samples=config.max_samples, with_solution=config.agent == "oracle"))
    return RunRows.read(config, cache)


def check_task_engine(config: RunConfig, settings: SandboxSettings) -> None:
    """--tasks runs every task in the backend that runs images: when it does not work here, stop before any work."""
    if config.tasks is None or not EXECUTORS[config.executor].capabilities.in_process:
        return
    from trajforge.sandbox.factory import backend_status

    spec = image_backend(config.sandbox)
    status = asyncio.run(backend_status(spec, settings))
    if not status.usable:
        raise UsageError(f"--tasks runs each task in a {spec.name}, and no {spec.name} engine works here "
                         f"({status.detail}); {spec.capabilities.enable} (see `trajforge doctor`)")


def check_container_images(config: RunConfig, rows: RunRows) -> None:
    """`--sandbox container` with rows that name no image and no `container_image`: every such
    sample could only fail, so refuse before any work."""
    if runs_on_host(config.sandbox) or config.container_image or config.tasks is not None:
        return
    bare = len(rows.keys) - rows.with_image
    if bare:
        raise UsageError(f"--sandbox {config.sandbox}: {bare} row(s) have no `image` (first: {rows.path}:"
                         f"{rows.first_bare}) and the config sets no `container_image`; give each row an image "
                         "or set `container_image: IMAGE` in the --config file")
