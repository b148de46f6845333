"""`trajforge serve [serve flags] [run flags]`: the engine as a rollout service for RL trainers.

The serve flags are below; every other flag is a `run` flag (model, sandbox, limits, --run_name,
--output_dir, ...) and means what it means for `run`, except --dataset_file, which the service
makes itself (groups arrive over HTTP). It listens on loopback unless --host says otherwise,
which needs --token. SIGINT / SIGTERM stop it (exit 0); `--resume` goes on with a stopped or
killed service's groups.
"""

from __future__ import annotations

import asyncio
import ipaddress
import signal
import sys
from pathlib import Path

from aiohttp import web

from trajforge.cli.flags import Flag, Parser
from trajforge.errors import UsageError
from trajforge.redact import REGISTRY

FLAGS = [Flag("host", "str", "address to listen on (not loopback: needs --token)", default="127.0.0.1"),
         Flag("port", "port", "TCP port (0 picks a free one)", default=8780),
         Flag("token", "str", "the bearer token every request must carry (required off loopback)", default=None),
         Flag("retry_masked", "int", "run a masked (failed) rollout again up to M times before delivering it",
              default=0),
         Flag("max_body", "int", "the largest request body, in bytes", default=8 << 20),
         Flag("max_staleness", "int", "start no rollout whose group's rollouts would start under more than K "
              "policy versions (it is masked as stale)", default=None),
         Flag("push", "str", "also send each finished group to atropos=URL (an Atropos API server)", default=None),
         Flag("tasks_root", "str", "the directory whose Harbor tasks a group may name (POST /v1/groups "
              "{\"tasks\": [...]}); only paths inside it", default=None)]


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def main(argv: list[str]) -> int:
    from trajforge.cli.run import parse_run_args

    ns, rest = Parser("trajforge serve", "Serve rollouts of groups to an RL trainer over HTTP; every other flag "
                      "is a run flag.", FLAGS).parse_known(argv)
    if not is_loopback(ns.host) and not ns.token:
        raise UsageError(f"--host {ns.host} is not loopback: pass --token so that only holders of it can use "
                         "the service")
    if ns.retry_masked < 0 or ns.max_body < 1 or (ns.max_staleness is not None and ns.max_staleness < 1):
        raise UsageError("--retry_masked must be 0 or more, --max_body and --max_staleness 1 or more")
    if any(a.lstrip("-").replace("-", "_").startswith("dataset_file") for a in rest):
        raise UsageError("--dataset_file: the service's groups arrive over HTTP (POST /v1/groups)")
    config, _ = parse_run_args(["--dataset_file=service_rows.jsonl", *rest], "trajforge serve",
                               strict_required=False)
    assert config is not None
    if ns.token:
        REGISTRY.add(ns.token)
    from trajforge.executors import make_executor
    from trajforge.runner.eventloop import tuned_collector, use_pidfd_child_watcher

    use_pidfd_child_watcher()  # as `run` does: the loop reaps tool processes without a thread each
    with tuned_collector():
        return asyncio.run(_serve(config, make_executor, ns))


async def _serve(config, make_executor, ns) -> int:  # type: ignore[no-untyped-def]
    from trajforge.service.core import RolloutService
    from trajforge.service.http import make_app

    service = RolloutService(config, make_executor, retry_masked=ns.retry_masked, resume=config.resume,
                              push=ns.push, max_staleness=ns.max_staleness,
                              tasks_root=None if ns.tasks_root is None else Path(ns.tasks_root),
                              redirects=ns.token is not None)
    async with service:
        runner = web.AppRunner(make_app(service, token=ns.token, max_body=ns.max_body), access_log=None,
                               handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, ns.host, ns.port)
        try:
            await site.start()
        except OSError as e:
            await runner.cleanup()
            raise UsageError(f"cannot listen on {ns.host}:{ns.port}: {e.strerror or e}") from None
        bound = runner.addresses[0][1]
        shown = f"[{ns.host}]" if ":" in ns.host else ns.host
        print(f"trajforge serve: run {service.layout.root} at http://{shown}:{bound}/v1 (Ctrl-C to stop)", flush=True)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):  # the service's invocations leave them to it
            loop.add_signal_handler(sig, service.stop.set)
        try:
            await service.stop.wait()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            await service.close()  # streams end before the server waits for its requests
            await runner.cleanup()
    print("trajforge serve: stopped", file=sys.stderr)
    return 0

