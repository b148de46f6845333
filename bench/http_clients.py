"""CPU per chat-completion request of the model client and the HTTP stacks it was chosen among,
against bench.server in another process.

The model client is the largest share of the runner's event-loop time (bench/RESULTS.md), so
this isolates it: the same request body (a system prompt, a user turn, six tool schemas) sent
N times by C concurrent tasks through
  client          OpenAIClient.complete over model.transport's AiohttpTransport (what a run uses),
  bare sdk        the openai SDK's raw `post` over httpx2 + orjson parse (no trajforge),
  bare httpx2     an httpx2.AsyncClient POST + orjson parse (no SDK, no trajforge),
  bare aiohttp    an aiohttp.ClientSession POST + orjson parse (no trajforge),
and reports CPU milliseconds of this process per request. Rows needing a missing package are
skipped. Run: python bench/http_clients.py
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from trajforge.model.client import OpenAIClient
from trajforge.model.types import ModelSettings

BENCH = Path(__file__).resolve().parent
_SERVE = f"""
import asyncio, sys
sys.path.insert(0, {str(BENCH)!r})
from server import BenchServer
async def main():
    s = BenchServer(turns=1, latency=0.0, jitter=0.0)
    await s.start()
    print(s.port, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""
MESSAGES = [{"role": "system", "content": "You are a capable assistant. " * 12},
            {"role": "user", "content": "Task 1: inspect the working directory and report."}]
TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "description": "Does one thing well. " * 10,
          "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}, "required": ["arg"]}}}
         for i in range(6)]


async def _client(url: str) -> Any:
    client = OpenAIClient(ModelSettings(model="bench", base_url=url), "no-key")

    async def call() -> None:
        await client.complete(MESSAGES, TOOLS)

    return call, client.aclose


async def _sdk(url: str) -> Any:
    from openai import AsyncOpenAI

    api = AsyncOpenAI(api_key="no-key", base_url=url, max_retries=0)
    options = {"headers": {"Content-Type": "application/json"}}

    async def call() -> None:
        body = orjson.dumps({"model": "bench", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "auto"})
        orjson.loads(await api.post("/chat/completions", cast_to=bytes, content=body, options=options))

    return call, api.close


async def _httpx2(url: str) -> Any:
    import httpx2

    http = httpx2.AsyncClient(limits=httpx2.Limits(max_connections=None, max_keepalive_connections=1000))
    headers = {"Content-Type": "application/json", "Authorization": "Bearer no-key"}

    async def call() -> None:
        body = orjson.dumps({"model": "bench", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "auto"})
        orjson.loads((await http.post(f"{url}/chat/completions", content=body, headers=headers)).content)

    return call, http.aclose


async def _aiohttp(url: str) -> Any:
    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30))
    headers = {"Content-Type": "application/json", "Authorization": "Bearer no-key"}

    async def call() -> None:
        body = orjson.dumps({"model": "bench", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "auto"})
        async with session.post(f"{url}/chat/completions", data=body, headers=headers) as r:
            orjson.loads(await r.read())

    return call, session.close


async def measure(factory: Any, url: str, requests: int, concurrency: int) -> float:
    call, close = await factory(url)
    try:
        await call()  # connection set-up and lazy imports are not per-request costs
        t0 = time.process_time()

        async def worker() -> None:
            for _ in range(requests // concurrency):
                await call()

        async with asyncio.TaskGroup() as tg:
            for _ in range(concurrency):
                tg.create_task(worker())
        return 1000 * (time.process_time() - t0) / (requests // concurrency * concurrency)
    finally:
        await close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()
    server = subprocess.Popen([sys.executable, "-c", _SERVE], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{server.stdout.readline().strip()}/v1"
        print(f"{args.requests} requests, {args.concurrency} concurrent; CPU ms per request of the client:")
        for name, factory in (("client", _client), ("bare sdk", _sdk), ("bare httpx2", _httpx2),
                              ("bare aiohttp", _aiohttp)):
            try:
                ms = asyncio.run(measure(factory, url, args.requests, args.concurrency))
            except ModuleNotFoundError as e:
                print(f"  {name:15s} skipped ({e.name} not installed)")
                continue
            print(f"  {name:15s} {ms:.3f}")
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
