"""A real OpenAI-compatible HTTP server on 127.0.0.1:0, scripted per test.

It runs aiohttp in a background thread so sync tests, async tests and CLI subprocesses can all
talk to it. Each POST is passed to a handler that returns a `Reply`; replies can be canned chat
completions (content, tool calls, reasoning in any provider shape, usage), HTTP errors with
headers, delays (for timeouts and concurrency), or a dropped connection. Every request is
recorded, and the maximum number of requests in flight at once is tracked.

The endpoint probe a run makes before it starts (trajforge.model.probe: `GET .../models`, its
User-Agent says so) is answered with a model list, as OpenAI-compatible servers do, and counted in `probes`, not in `requests`, and
never takes a scripted reply; `drop_probes = N` drops the next N of them unanswered (a blip).

A provider's limits can be emulated: `concurrency_cap=N` answers 429 at once to a request that
would be the N+1th in flight (counted in `rejected`, with `cap_headers`, e.g. a Retry-After);
`with_usage` makes a handler's replies report given tokens and cost (OpenRouter's usage.cost).
`hold_until = N` holds every request until N are in flight at once, or until `release()` (then lets
them all go, and every later one straight through; `held` says whether N was reached): a test of concurrency
then waits for the event itself, not for replies slow enough that a loaded machine keeps up.
`wait_for(match)` waits until a request that `match`es has arrived (a held one included).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop: bool = False  # close the connection without answering


@dataclass
class Recorded:
    path: str
    body: Any
    headers: dict[str, str]


_ids = itertools.count(1)


def tool_call(name: str, arguments: Any, call_id: str | None = None) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id or f"call_{next(_ids)}", "type": "function",
            "function": {"name": name, "arguments": args}}


def chat(content: str | None = None, *, tool_calls: list[dict[str, Any]] | None = None,
         reasoning: str | None = None, reasoning_field: str = "reasoning", finish_reason: str | None = None,
         usage: dict[str, Any] | None = None, model: str = "scripted", delay: float = 0.0) -> Reply:
    """A chat.completion reply. `reasoning_field` may be reasoning, reasoning_content or reasoning_details."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    if reasoning is not None:
        if reasoning_field == "reasoning_details":
            message["reasoning_details"] = [{"type": "reasoning.text", "text": reasoning}]
        else:
            message[reasoning_field] = reasoning
    body = {
        "id": f"chatcmpl-{next(_ids)}", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": message,
                     "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop")}],
        "usage": usage or {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }
    return Reply(body=body, delay=delay)


def http_error(status: int, message: str = "error", headers: dict[str, str] | None = None,
               delay: float = 0.0) -> Reply:
    return Reply(status=status, body={"error": {"message": message, "type": "test", "code": status}},
                 headers=headers or {}, delay=delay)


Handler = Callable[[Recorded], Reply]


def with_usage(handler: Handler, prompt_tokens: int, completion_tokens: int, cost: float | None = None,
               cached_tokens: int = 0) -> Handler:
    """`handler` whose successful chat replies report this usage; `cost`: the provider's own
    charge per call (usage.cost), None for a provider that reports tokens only."""

    def handle(req: Recorded) -> Reply:
        reply = handler(req)
        if reply.status == 200 and isinstance(reply.body, dict) and "choices" in reply.body:
            usage: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                     "total_tokens": prompt_tokens + completion_tokens}
            if cached_tokens:
                usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
            if cost is not None:
                usage["cost"] = cost
            reply.body["usage"] = usage
        return reply

    return handle


class ScriptedServer:
    """Use as a context manager; `url` is the base URL to pass as --base_url."""

    def __init__(self, handler: Handler | None = None, *, concurrency_cap: int | None = None,
                 cap_headers: dict[str, str] | None = None) -> None:
        self.handler = handler
        self.concurrency_cap = concurrency_cap
        self.cap_headers = cap_headers or {}
        self.rejected = 0  # requests answered 429 by the concurrency cap
        self._queue: list[Reply] = []
        self.requests: list[Recorded] = []
        self.probes = 0  # GET .../models answered (model.probe)
        self.drop_probes = 0  # the next this many probes get their connection closed unanswered
        self.probe_dropped = threading.Event()  # set when one was
        self.in_flight = 0
        self.max_in_flight = 0
        self.hold_until: int | None = None
        self.hold_timeout = 120.0  # then the requests go anyway (and `held` stays False): no hang
        self.held = False
        self._all_in = asyncio.Event()
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)  # notified at each recorded request
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def release(self) -> None:
        """Let the requests `hold_until` holds go now (and every later one straight through)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._all_in.set)

    def wait_for(self, match: Callable[[Recorded], bool], count: int = 1, timeout: float = 120.0) -> bool:
        """Whether `count` requests that `match` arrived within `timeout` seconds (held ones count)."""
        with self._arrived:
            return self._arrived.wait_for(lambda: sum(map(match, self.requests)) >= count, timeout)

    def script(self, *replies: Reply) -> None:
        """Answer the next requests with these replies in order (before falling back to the handler)."""
        with self._lock:
            self._queue.extend(replies)

    def chat_requests(self) -> list[Any]:
        return [r.body for r in self.requests if r.path.endswith("/chat/completions")]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and "(endpoint probe)" in request.headers.get("User-Agent", ""):
            return self._probe(request)
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        rec = Recorded(request.path, body, dict(request.headers))
        with self._lock:
            self.requests.append(rec)
            self._arrived.notify_all()
            if self.concurrency_cap is not None and self.in_flight >= self.concurrency_cap:
                self.rejected += 1
                capped = http_error(429, "too many concurrent requests", headers=self.cap_headers)
                return web.json_response(capped.body, status=429, headers=capped.headers)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            reply = self._queue.pop(0) if self._queue else None
            if self.hold_until is not None and self.in_flight >= self.hold_until:
                self.held = True
                self._all_in.set()
        try:
            if self.hold_until is not None and not self._all_in.is_set():
                try:
                    await asyncio.wait_for(self._all_in.wait(), self.hold_timeout)
                except TimeoutError:
                    self._all_in.set()
            if reply is None:
                if self.handler is None:
                    reply = http_error(500, "no scripted reply left")
                else:
                    reply = self.handler(rec)
            if reply.delay:
                await asyncio.sleep(reply.delay)
            if reply.drop:
                assert request.transport is not None
                request.transport.close()
                return web.Response(status=500)
            return web.json_response(reply.body, status=reply.status, headers=reply.headers)
        finally:
            with self._lock:
                self.in_flight -= 1

    def _probe(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            self.probes += 1
            drop, self.drop_probes = self.drop_probes > 0, max(0, self.drop_probes - 1)
        if drop:
            assert request.transport is not None
            request.transport.close()
            self.probe_dropped.set()
            return web.Response(status=500)
        return web.json_response({"object": "list", "data": [{"id": "scripted", "object": "model", "owned_by": "test"}]})

    def __enter__(self) -> ScriptedServer:
        started = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=4096)
            self._loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            started.set()
            self._loop.run_forever()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()  # answers still pending (a stalled reply): the test is over
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=run, name="scripted-server", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("scripted server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._thread is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
