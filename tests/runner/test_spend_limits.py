"""Pure spend and load decisions: the AIMD limiter, token buckets, prices, the run budget and the
per-sample limits, fed outcomes and clock values directly (no event loop, no server)."""

from __future__ import annotations

import asyncio

import pytest

from trajforge.agent.limits import SpendLimits
from trajforge.model.limiter import AimdLimiter, TokenBucket
from trajforge.model.pricing import Price, call_usage, price_known, reports_cost
from trajforge.model import spend
from trajforge.model.types import Usage
from trajforge.runner.scheduling.budget import BUDGET_EXIT_CODE, Budget
from trajforge.runner.state.checkpoint_file import InvocationEntry


def pay(meter: spend.SampleSpend, usd: float) -> None:
    """A model call costing `usd`, charged as the client charges it."""
    with spend.bound(meter):
        spend.charge(Usage(cost=usd))

# --- AIMD limiter --------------------------------------------------------------------------------


def test_limiter_starts_at_the_ceiling_and_grows_no_further() -> None:
    lim = AimdLimiter(64)
    assert lim.value == 64
    for i in range(1000):
        lim.on_success(i * 0.01, 0.5, saturated=True)
    assert lim.value == 64


def test_a_429_cuts_the_limit_to_what_is_still_in_flight_but_at_most_by_half_per_round_trip() -> None:
    lim = AimdLimiter(512)
    lim.on_overload(0.0, in_flight=500)
    assert lim.value == 500
    lim.on_overload(0.01, in_flight=100)  # 100 < half of 512: the cut stops at 256
    assert lim.value == 256
    lim.on_overload(0.02, in_flight=300)  # more in flight than the limit: no raise
    assert lim.value == 256
    # The next round trip (default window 1 s before any latency is known) may halve again.
    lim.on_overload(1.5, in_flight=60)
    assert lim.value == 128


def test_a_round_trip_with_429s_ends_at_most_at_ninety_percent_of_where_it_began() -> None:
    lim = AimdLimiter(100)
    lim.on_success(0.0, 0.5, saturated=False)  # latency 0.5 s: windows of 0.5 s
    lim.on_overload(0.1, in_flight=99)
    assert lim.value == 99
    lim.on_success(0.7, 0.5, saturated=False)  # closes the window that saw the 429
    assert lim.value == 90
    assert lim.decreases == 1


def test_the_limit_grows_about_one_per_round_trip_only_while_it_is_the_bottleneck() -> None:
    lim = AimdLimiter(100)
    lim.on_overload(0.0, in_flight=50)
    assert lim.value == 50
    t = 2.0
    for _ in range(50 * 4):  # four round trips of 50 successes, limit binding
        t += 0.01
        lim.on_success(t, 0.5, saturated=True)
    assert 53 <= lim.value <= 55
    before = lim.limit
    for _ in range(500):  # idle capacity: no growth
        t += 0.01
        lim.on_success(t, 0.5, saturated=False)
    assert lim.limit == before


def test_rising_latency_shrinks_the_limit_and_steady_latency_does_not() -> None:
    lim = AimdLimiter(100)
    t = 0.0
    for _ in range(50):
        t += 0.1
        lim.on_success(t, 1.0, saturated=False)
    assert lim.value == 100
    for _ in range(50):  # the provider starts queueing: 4x slower
        t += 0.5
        lim.on_success(t, 4.0, saturated=False)
    assert lim.value < 100
    assert lim.decreases >= 1


def test_a_fixed_limiter_ignores_everything() -> None:
    lim = AimdLimiter(64, adaptive=False)
    lim.on_overload(0.0, in_flight=1)
    lim.on_success(5.0, 100.0, saturated=True)
    assert lim.value == 64


# --- token buckets -------------------------------------------------------------------------------


def test_requests_bucket_spaces_calls_at_the_rate_after_its_burst() -> None:
    bucket = TokenBucket(per_minute=60, burst_seconds=2)  # 1/s, holds 2
    assert bucket.wait(0.0, 1) == 0
    bucket.take(0.0, 1)
    bucket.take(0.0, 1)
    assert bucket.wait(0.0, 1) == pytest.approx(1.0)
    assert bucket.wait(0.5, 1) == pytest.approx(0.5)
    assert bucket.wait(1.0, 1) == 0


def test_tokens_bucket_lets_a_big_call_through_and_then_pays_its_debt() -> None:
    bucket = TokenBucket(per_minute=6000, burst_seconds=10)  # 100/s, holds 1000
    assert bucket.wait(0.0, 5000) == 0  # bigger than the bucket: waits only for a full bucket
    bucket.take(0.0, 5000)
    assert bucket.wait(0.0, 10) == pytest.approx(40.1)  # 4000 in debt, then 10 more
    bucket.adjust(0.0, -3000)  # the call used 2000, not 5000: refund
    assert bucket.wait(0.0, 10) == pytest.approx(10.1)


# --- prices --------------------------------------------------------------------------------------


def test_price_of_a_call_with_cached_prompt_tokens() -> None:
    price = Price(prompt=3.0, completion=15.0, cached_prompt=0.3)
    usage = Usage(prompt_tokens=1_000_000, completion_tokens=100_000, cached_tokens=400_000)
    assert price.cost(usage) == pytest.approx(0.6 * 3 + 0.4 * 0.3 + 0.1 * 15)
    assert Price(2.0, 4.0).cost(Usage(prompt_tokens=500_000, cached_tokens=500_000)) == pytest.approx(1.0)


def test_reported_cost_wins_over_the_table_and_the_table_fills_in_otherwise() -> None:
    price = Price(1.0, 2.0)
    raw = {"prompt_tokens": 1000, "completion_tokens": 500, "cost": 0.5}
    assert call_usage(raw, price).cost == 0.5
    del raw["cost"]
    assert call_usage(raw, price).cost == pytest.approx(0.002)
    assert call_usage(raw, None).cost == 0
    assert call_usage({"prompt_tokens": 1000, "cost": True}, price).cost == pytest.approx(0.001)  # not a number
    assert call_usage({"prompt_tokens_details": {"cached_tokens": 7}}, None).cached_tokens == 7


def test_a_providers_impossible_usage_counts_as_zero_and_the_record_can_be_saved() -> None:
    # 2**64 tokens once ended the whole run where the record was saved (orjson refuses integers
    # past 64 bits), and every --resume died the same way
    from trajforge.jsonio import dumps

    raw = {"prompt_tokens": 2**64, "completion_tokens": -5, "cost": float("nan"),
           "completion_tokens_details": {"reasoning_tokens": 10**30}, "prompt_tokens_details": {"cached_tokens": "1e400"}}
    usage = call_usage(raw, Price(1.0, 2.0))
    assert (usage.prompt_tokens, usage.completion_tokens, usage.reasoning_tokens, usage.cached_tokens, usage.cost) == (0, 0, 0, 0, 0)
    assert call_usage({"prompt_tokens": 1234, "cost": float("inf")}, None).prompt_tokens == 1234
    assert call_usage({"cost": -1.0}, None).cost == 0
    dumps({"usage": usage.as_dict()})


def test_which_models_have_a_known_price() -> None:
    assert reports_cost("https://openrouter.ai/api/v1")
    assert not reports_cost("http://127.0.0.1:8000/v1")
    assert price_known("m", "http://127.0.0.1:8000/v1", {"m": Price(1, 1)})
    assert not price_known("m", "http://127.0.0.1:8000/v1", {"other": Price(1, 1)})
    assert price_known("anthropic/claude-sonnet-4.6", "https://openrouter.ai/api/v1", None)
    assert price_known("local", "", None)


# --- the run budget ------------------------------------------------------------------------------


def test_budget_stops_starts_once_spend_plus_in_flight_projection_reaches_it() -> None:
    budget = Budget(limit=1.0, to_run=20)
    a, b = budget.start(), budget.start()
    assert budget.may_start()  # nothing known yet: no projection
    pay(a, 0.2)
    budget.end(a)
    assert budget.average() == pytest.approx(0.2)
    pay(b, 0.05)  # in flight, projected to the 0.2 average
    c = budget.start()
    budget.start(), budget.start()
    # spent 0.25, in flight b (0.15 more) + three new ones (0.2 each) = 0.25 + 0.75 = 1.0: reached
    assert not budget.may_start()
    pay(c, 0.01)
    budget.end(c)  # once refused, always refused: in-flight samples finish, nothing new starts
    assert not budget.may_start()
    assert budget.reached


def test_budget_continues_over_invocations() -> None:
    # The middle one is from before spend was recorded: it adds nothing.
    invocations = [InvocationEntry(started=1.0, spent=0.4, spent_samples=4), InvocationEntry(started=2.0, seconds=3.0),
                   InvocationEntry(started=3.0, spent=0.1, spent_samples=1)]
    budget = Budget.from_invocations(0.5, invocations, to_run=5)
    assert budget.spent == pytest.approx(0.5)
    assert budget.average() == pytest.approx(0.1)
    assert not budget.may_start()
    lines = budget.stop_message()
    assert "budget reached" in lines[0] and "5 sample(s) not started" in lines[0]
    assert "--resume" in lines[1] and "--max_cost" in lines[1] and "$1.0000" in lines[1]
    assert BUDGET_EXIT_CODE not in (0, 1, 2, 130)


def test_budget_without_limit_only_counts() -> None:
    budget = Budget(to_run=3)
    s = budget.start()
    pay(s, 5.0)
    assert budget.may_start() and budget.spent == 5.0
    assert budget.end(s, elsewhere=1.0) == 6.0
    entry = InvocationEntry(started=1.0)
    budget.fill(entry)
    assert (entry.spent, entry.spent_samples) == (6.0, 1)
    assert entry.model_dump(exclude_unset=True) == {"started": 1.0, "spent": 6.0, "spent_samples": 1}
    assert budget.projected_total() == pytest.approx(6.0 + 2 * 6.0)


def test_budget_tells_what_each_sample_in_flight_spent_on_its_current_attempt() -> None:
    # Saved with the checkpoint: a record written after that save holds this part again, so a
    # resume after a kill adds only the rest of the record's cost (runner.state.recovery).
    budget = Budget(to_run=3)
    a, b = budget.start("a"), budget.start("b")
    pay(a, 0.3)
    budget.retry(a)  # its first attempt failed: the record will hold only the next one's cost
    pay(a, 0.2)
    entry = InvocationEntry(started=1.0)
    budget.fill(entry)
    assert (entry.spent, entry.in_flight) == (pytest.approx(0.5), {"a": pytest.approx(0.2)})  # b spent nothing
    budget.end(a)
    budget.end(b)
    budget.fill(entry)
    assert entry.in_flight == {} and entry.spent == pytest.approx(0.5)


def test_budget_continues_spend_recovered_from_the_batch_files() -> None:
    invocations = [InvocationEntry(started=1.0, spent=2.0, spent_samples=2),
                   InvocationEntry(started=2.0, spent=1.0, spent_samples=1, recovered_spent=0.5, recovered_samples=1)]
    budget = Budget.from_invocations(5.0, invocations, to_run=1, recovered=(1.5, 2))
    assert (budget.spent, budget.prior_samples) == (pytest.approx(5.0), 6)
    assert not budget.may_start()


# --- per-sample limits ---------------------------------------------------------------------------


def test_sample_limits_name_the_limit_reached() -> None:
    limits = SpendLimits(max_tokens=1000, max_cost=0.1)
    assert limits.reached(Usage(prompt_tokens=500, completion_tokens=400)) is None
    assert limits.reached(Usage(prompt_tokens=500, completion_tokens=400), Usage(completion_tokens=100)) \
        == "max_tokens_per_sample"
    assert limits.reached(Usage(cost=0.08), Usage(cost=0.03), None) == "max_cost_per_sample"
    assert SpendLimits().reached(Usage(prompt_tokens=10**9, cost=1e9)) is None


# --- what progress and statistics.json show ----------------------------------------------------


def test_monitor_series_rates_progress_and_thinning() -> None:
    from trajforge.model.gate import ModelGate
    from trajforge.runner.reporting import monitor as monitor_mod

    now = [0.0]
    gate = ModelGate(512, clock=lambda: now[0])
    budget = Budget(limit=2.0, to_run=10)
    mon = monitor_mod.RunMonitor(gate, budget, every=1.0, clock=lambda: now[0])
    for _ in range(30):  # requests admitted and answered, as the client does
        ticket = asyncio.run(gate.acquire("http://x/v1"))
        gate.release(ticket, "ok", tokens=100)
    s = budget.start()
    pay(s, 0.5)
    budget.end(s)
    now[0] = 1.0
    mon.tick()
    point = mon.series[-1]
    assert point.gate is not None and point.gate.requests_per_min == 1800.0 and point.gate.tokens_per_min == 180_000
    assert point.gate.limit == 512 and point.spent == 0.5
    text = mon.progress_text()
    assert "limit 512/512" in text and "1800 req/min, 0 429s/min" in text
    assert "spent $0.5000" in text and "~$5.0000 projected" in text and "of $2.0000 budget" in text
    for _ in range(monitor_mod.MAX_POINTS + 5):
        now[0] += 1.0
        mon.tick()
    assert len(mon.series) <= monitor_mod.MAX_POINTS
    assert mon.spend().to_json() == {"spent": 0.5, "this_invocation": 0.5, "max_cost": 2.0, "budget_reached": False,
                                     "average_per_sample": 0.5}
    concurrency = mon.concurrency().to_json()
    assert concurrency["ok"] == 30 and concurrency["ceiling"] == 512
    assert concurrency["series"][0] == {"t": 1.0, "spent": 0.5, "limit": 512, "in_flight": 0, "waiting": 0,
                                        "requests_per_min": 1800.0, "tokens_per_min": 180_000,
                                        "rate_limited_per_min": 0.0}  # thinning keeps the first reading
    assert monitor_mod.RunMonitor(None, budget).concurrency().to_json()["note"]


def test_a_ray_actor_gets_its_share_of_the_runs_rate_budgets() -> None:
    from trajforge.config import RunConfig
    from trajforge.sample.gate_builder import gate_for

    config = RunConfig(num_workers=512, max_requests_per_minute=800, max_tokens_per_minute=1_600_000,
                       adaptive_concurrency=False)
    whole, part = gate_for(config), gate_for(config, share=64 / 512)
    assert (whole.ceiling, part.ceiling) == (512, 64)
    assert whole._rpm is not None and part._rpm is not None and part._tpm is not None
    assert (whole._rpm.per_minute, part._rpm.per_minute, part._tpm.per_minute) == (800, 100, 200_000)
    assert part.adaptive is False
    assert gate_for(RunConfig())._rpm is None
