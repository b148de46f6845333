"""The model gate with real clients against the real scripted server: concurrency it lets through,
Retry-After honoured by every request of the run, per-minute budgets shared by all clients,
adaptation to a provider that refuses above a concurrency cap, and spend charged per sample."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tests.support.scripted_server import (
    Recorded,
    Reply,
    ScriptedServer,
    chat,
    http_error,
    with_usage,
)
from trajforge.model import gate as model_gate
from trajforge.model import spend
from trajforge.model.client import OpenAIClient
from trajforge.model.gate import ModelGate
from trajforge.model.pricing import Price
from trajforge.model.types import ModelSettings

MESSAGES = [{"role": "user", "content": "hi"}]


def client(srv: ScriptedServer, model: str = "m", **kw: Any) -> OpenAIClient:
    return OpenAIClient(ModelSettings(model=model, base_url=srv.url, **kw), "k", backoff_base=0.01, backoff_max=0.05)


async def _calls(gate: ModelGate | None, clients: list[OpenAIClient], n: int) -> list[float]:
    """n concurrent calls spread over `clients`, through `gate`; returns each one's end time."""
    ends: list[float] = []

    async def one(i: int) -> None:
        await clients[i % len(clients)].complete(MESSAGES, [])
        ends.append(time.monotonic())

    with model_gate.bound(gate):
        async with asyncio.TaskGroup() as tg:
            for i in range(n):
                tg.create_task(one(i))
    for c in clients:
        await c.aclose()
    return ends


def test_gate_keeps_requests_in_flight_under_its_limit() -> None:
    with ScriptedServer(lambda r: chat("ok", delay=0.1)) as srv:
        gate = ModelGate(5)
        asyncio.run(_calls(gate, [client(srv)], 30))
        assert srv.max_in_flight == 5
        snap = gate.snapshot()
    assert (snap.requests, snap.ok, snap.in_flight, snap.waiting) == (30, 30, 0, 0)


def test_without_a_gate_nothing_is_held_back() -> None:
    with ScriptedServer(lambda r: chat("ok", delay=0.2)) as srv:
        asyncio.run(_calls(None, [client(srv)], 20))
        assert srv.max_in_flight == 20


def test_retry_after_pauses_every_request_to_the_endpoint_not_just_the_refused_one() -> None:
    first = True

    def handle(req: Recorded) -> Reply:
        nonlocal first
        if first:
            first = False
            return http_error(429, "slow down", headers={"Retry-After": "1"})
        return chat("ok")

    with ScriptedServer(handle) as srv:
        gate = ModelGate(10)

        async def scenario() -> list[float]:
            c = client(srv)
            with model_gate.bound(gate):
                refused = asyncio.create_task(c.complete(MESSAGES, []))
                async with asyncio.timeout(30):  # until the 429 arrived: the endpoint is paused for 1 s
                    while gate.snapshot().overloaded == 0:
                        await asyncio.sleep(0.005)
                t0 = time.monotonic()
                await c.complete(MESSAGES, [])  # a different request, never refused itself
                waited = time.monotonic() - t0
                await refused
            await c.aclose()
            return [waited]

        [waited] = asyncio.run(scenario())
    assert 0.6 <= waited <= 4.0, waited
    assert gate.snapshot().overloaded == 1


def test_requests_per_minute_is_shared_by_every_client_of_the_run() -> None:
    with ScriptedServer(lambda r: chat("ok")) as srv:
        gate = ModelGate(100, requests_per_minute=600)  # 10/s, bursts of 100 (10 s): first 100 at once
        t0 = time.monotonic()
        ends = asyncio.run(_calls(gate, [client(srv, "main"), client(srv, "vision-model")], 110))
    # 100 from the burst, then 10 more at 10/s: about one second, across both clients.
    assert 0.8 <= max(ends) - t0 <= 8.0, max(ends) - t0
    assert {r.body["model"] for r in srv.requests} == {"main", "vision-model"}


def test_tokens_per_minute_charges_real_usage_so_the_next_call_waits_off_the_debt() -> None:
    with ScriptedServer(with_usage(lambda r: chat("ok"), 1000, 200)) as srv:
        gate = ModelGate(100, tokens_per_minute=120_000)  # 2,000 tokens/s, holds 20,000

        async def scenario() -> float:
            # 20 small-looking requests start at once; their replies say 1,200 tokens each: 24,000,
            # so the bucket ends 4,000 in debt and the next call waits ~2 s for it to refill.
            await _calls(gate, [client(srv)], 20)
            t0 = time.monotonic()
            await _calls(gate, [client(srv)], 1)
            return time.monotonic() - t0

        waited = asyncio.run(scenario())
    assert 1.5 <= waited <= 8.0, waited
    assert gate.snapshot().tokens == 21 * 1200


def test_adaptive_gate_settles_under_a_providers_concurrency_cap() -> None:
    rejected = {}
    for adaptive in (True, False):
        with ScriptedServer(lambda r: chat("ok", delay=0.1), concurrency_cap=8) as srv:
            gate = ModelGate(64, adaptive=adaptive)
            asyncio.run(_calls(gate, [client(srv, max_retries=1000)], 400))
            rejected[adaptive] = srv.rejected
        snap = gate.snapshot()
        assert snap.ok == 400 and snap.overloaded == rejected[adaptive]
        assert snap.limit <= 9 if adaptive else snap.limit == 64
    assert rejected[True] * 5 < rejected[False], rejected


def test_spend_is_charged_to_the_sample_bound_to_the_task_priced_from_the_table() -> None:
    with ScriptedServer(with_usage(lambda r: chat("ok"), 1_000_000, 100_000)) as srv:
        c = client(srv, pricing={"m": Price(prompt=1.0, completion=10.0)})

        async def two_samples() -> tuple[spend.SampleSpend, spend.SampleSpend]:
            a, b = spend.SampleSpend(), spend.SampleSpend()

            async def run(meter: spend.SampleSpend, calls: int) -> None:
                with spend.bound(meter):
                    for _ in range(calls):
                        await c.complete(MESSAGES, [])

            await asyncio.gather(run(a, 1), run(b, 3))
            await c.aclose()
            return a, b

        a, b = asyncio.run(two_samples())
    assert (a.calls, b.calls) == (1, 3)
    assert a.cost == 2.0 and b.cost == 6.0  # 1 Mtok x $1 + 0.1 Mtok x $10 per call
    assert b.tokens == 3 * 1_100_000
