"""The benchmark's own OpenAI-compatible model server: fixed latency with jitter, a scripted tool user.

It must never be the bottleneck, because it shares the machine's cores with the runner under
test. So the handler does the least possible work per request: it reads the body, counts the
tool results already in the conversation (which says which turn this is), sleeps the injected
latency and returns one of K+1 reply bodies encoded once at start-up. Replies: K turns with a
`terminal` call each (reasoning included), then a final answer with reasoning.

Latency is uniform in [latency * (1 - jitter), latency * (1 + jitter)], so its mean is `latency`.
The server counts requests and tracks the maximum number in flight at once.

A request that asks for token ids (`return_token_ids`, as `--capture_tokens` sends it) gets them
in vLLM's shapes: `prompt_token_ids` (about a token per 4 bytes of the request, so a prompt the
size of the conversation), `choices[0].token_ids` (60 ids) and a logprob for each. The ids are a
function of their position alone, so each prompt starts with the last prompt and its completion,
as a real chat template's would, and making them costs a list slice.

With `cap=N` it plays a provider with a concurrency limit: a request arriving while N are being
served is answered 429 at once (no Retry-After). It then logs every request (arrival time,
whether it was refused) and samples the number in flight every 0.1 s, so the benchmark can say
where the runner settled and how many 429s it caused after the first seconds.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

import orjson
from aiohttp import web

# Both spellings, as clients differ in separators; content strings escape their quotes, so a
# terminal output mentioning "role" cannot match.
_TOOL_MARKERS = (b'"role":"tool"', b'"role": "tool"')
_USAGE = {"prompt_tokens": 400, "completion_tokens": 60, "total_tokens": 460}
_ASKED = b'"return_token_ids":true'  # orjson's spelling, as the runner sends it
_COMPLETION_IDS = 60
_IDS = [(i * 7919) % 49152 for i in range(1 << 20)]  # the id at each position of any conversation
_LOGPROBS = [{"token": "t", "logprob": -0.125 - (i % 7) / 8, "top_logprobs": []} for i in range(_COMPLETION_IDS)]


def _completion(n: int, message: dict[str, object], finish: str) -> bytes:
    return orjson.dumps({
        "id": f"chatcmpl-bench-{n}", "object": "chat.completion", "created": 0, "model": "bench",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": _USAGE,
    })


def scripted_replies(turns: int, command: str) -> list[bytes]:
    """Reply bodies by turn: `turns` terminal calls, then the answer."""
    replies = []
    for k in range(turns):
        args = orjson.dumps({"command": command}).decode()
        call = {"id": f"call_{k + 1}", "type": "function", "function": {"name": "terminal", "arguments": args}}
        msg = {"role": "assistant", "content": None, "tool_calls": [call],
               "reasoning": f"Step {k + 1}: I should run a command to inspect the environment."}
        replies.append(_completion(k, msg, "tool_calls"))
    answer = {"role": "assistant", "content": "Done: the command ran and printed the expected output.",
              "reasoning": "The tool output confirms the task is complete, so I can answer."}
    replies.append(_completion(turns, answer, "stop"))
    return replies


@dataclass
class ServerStats:
    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    errors: int = 0
    first_request: float = 0.0  # time.monotonic() of the first request and of the last reply
    last_reply: float = 0.0
    rejected: int = 0  # 429s sent by the concurrency cap
    log: list[tuple[float, bool]] = field(default_factory=list)  # (arrival, refused) with a cap
    in_flight_samples: list[tuple[float, int]] = field(default_factory=list)  # (time, in flight) with a cap


class BenchServer:
    """aiohttp on 127.0.0.1:<free port>, running on the caller's event loop."""

    def __init__(self, *, turns: int, latency: float, jitter: float = 0.1, seed: int = 0,
                 command: str = "echo bench-$((6*7))", cap: int | None = None) -> None:
        self.turns = turns
        self.cap = cap
        self._sampler: asyncio.Task[None] | None = None
        self.latency = latency
        self.jitter = jitter
        self.stats = ServerStats()
        self._replies = scripted_replies(turns, command)
        self._reply_objects = [orjson.loads(r) for r in self._replies]
        self._rng = random.Random(seed)
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _chat(self, request: web.Request) -> web.Response:
        st = self.stats
        if not st.requests:
            st.first_request = time.monotonic()
        st.requests += 1
        if self.cap is not None:
            refused = st.in_flight >= self.cap
            st.log.append((time.monotonic(), refused))
            if refused:
                st.rejected += 1
                return web.Response(status=429, body=b'{"error":{"message":"too many concurrent requests","code":429}}',
                                    content_type="application/json")
        st.in_flight += 1
        st.max_in_flight = max(st.max_in_flight, st.in_flight)
        try:
            body = await request.read()
            done = sum(body.count(m) for m in _TOOL_MARKERS)
            if done > self.turns:
                st.errors += 1
                return web.Response(status=400, body=b'{"error":{"message":"more tool results than scripted"}}',
                                    content_type="application/json")
            lo, hi = self.latency * (1 - self.jitter), self.latency * (1 + self.jitter)
            await asyncio.sleep(self._rng.uniform(lo, hi))
            if _ASKED in body:
                return web.Response(body=self._with_ids(done, len(body) // 4), content_type="application/json")
            return web.Response(body=self._replies[done], content_type="application/json")
        finally:
            st.in_flight -= 1
            st.last_reply = time.monotonic()

    def _with_ids(self, turn: int, prompt: int) -> bytes:
        reply = dict(self._reply_objects[turn])
        choice = dict(reply["choices"][0], token_ids=_IDS[prompt:prompt + _COMPLETION_IDS],
                      logprobs={"content": _LOGPROBS})
        return orjson.dumps({**reply, "prompt_token_ids": _IDS[:prompt], "choices": [choice]})

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=8192)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        if self.cap is not None:
            self._sampler = asyncio.create_task(self._sample_in_flight())

    async def _sample_in_flight(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            if self.stats.requests:
                self.stats.in_flight_samples.append((time.monotonic(), self.stats.in_flight))

    async def aclose(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
