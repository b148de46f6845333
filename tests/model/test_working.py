"""`--timeout` counts a sample's working time; `--sample_wall_timeout` its wall clock (issue 37).

A provider that refuses often makes every sample wait (the run-wide Retry-After pause, the gate,
backoff) far longer than it works. Those waits must not fail a healthy sample, while a model call
that really hangs is still cut at --timeout, and the wall-clock limit, when set, cuts a sample
that waits too long. The clock's own accounting is checked first, on its own.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from pathlib import Path

import pytest

from tests.support.policies import echo_policy, user_prompt
from tests.support.scripted_server import Recorded, Reply, ScriptedServer, chat, http_error
from tests.runner.test_e2e import base_args, run_cli, write_dataset
from tests.support.run_state import read_records
from trajforge.model import working

REFUSALS = 3  # 429s with Retry-After: 1 each sample hears first: at least 3 s of waiting, for certain


def refusing_provider(refusals: int = REFUSALS):
    """echo_policy behind a provider that answers each prompt's first `refusals` requests 429."""
    seen: Counter[str] = Counter()
    lock = threading.Lock()
    policy = echo_policy(turns=1)

    def handle(req: Recorded) -> Reply:
        prompt = user_prompt(req.body)
        with lock:
            seen[prompt] += 1
            refused = seen[prompt] <= refusals
        if refused:
            return http_error(429, "slow down", headers={"Retry-After": "1"})
        return policy(req)

    return handle


def checkpoint_samples(run: Path) -> list[dict]:
    return list(json.loads((run / "checkpoint.json").read_text())["samples"].values())


def test_the_clock_stands_still_while_any_wait_of_the_sample_is_in_progress() -> None:
    async def scenario() -> tuple[float, float, float | None, float | None]:
        clock = working.WorkingClock()
        async with asyncio.timeout(10) as limit:
            with working.bound(clock), clock.limiting(limit):
                deadline = limit.when()
                clock.stop()  # two overlapping waits (a tool's parallel calls): one stop
                clock.stop()
                assert limit.when() is None  # while waiting the limit cannot fire
                await asyncio.sleep(0.05)
                clock.go()
                assert limit.when() is None  # one wait still in progress
                await asyncio.sleep(0.05)
                clock.go()
                moved = limit.when()
                with working.waiting():
                    await asyncio.sleep(0.05)
                again = limit.when()
        assert deadline is not None and moved is not None and again is not None
        return clock.working, clock.wall, moved - deadline, again - moved

    worked, wall, moved, again = asyncio.run(scenario())
    assert wall >= 0.15 and worked < wall - 0.14, (worked, wall)
    assert moved >= 0.1 and again >= 0.05  # the deadline moved out by exactly the time stood still


def test_observers_hear_when_the_sample_starts_and_stops_waiting() -> None:
    """Overlapping waits are one wait to an observer too (the sandbox pool's demand: lazy.py)."""
    heard: list[bool] = []

    async def scenario() -> None:
        clock = working.WorkingClock()
        clock.observe(heard.append)
        clock.stop()
        clock.stop()
        clock.go()
        assert heard == [True]
        clock.go()
        with working.bound(clock), working.waiting():
            pass

    asyncio.run(scenario())
    assert heard == [True, False, True, False]


def test_waiting_outside_a_sample_does_nothing() -> None:
    async def scenario() -> None:
        with working.waiting():
            await asyncio.sleep(0)

    asyncio.run(scenario())


def test_retry_after_waits_do_not_count_against_the_sample_timeout(tmp_path: Path, server: ScriptedServer,
                                                                  clean_env: dict[str, str]) -> None:
    server.handler = refusing_provider()
    prompts = [f"say token{i}" for i in range(4)]
    ds = write_dataset(tmp_path / "ds.jsonl", prompts)
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds, "r", "--num_workers=4", "--timeout=2"))
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "data" / "r"
    records = read_records(run)
    assert len(records) == len(prompts) and all(r["completed"] for r in records)
    for rec in records:
        timing = rec["timing"]
        # Every sample waited past its limit in wall-clock time, yet worked well within it.
        assert timing["wall_s"] >= REFUSALS, timing
        assert 0 < timing["working_s"] < 2 < timing["wall_s"], timing
    assert len(server.chat_requests()) == len(prompts) * (REFUSALS + 2)


def test_a_hung_model_call_is_still_cut_at_the_timeout(tmp_path: Path, server: ScriptedServer,
                                                       clean_env: dict[str, str]) -> None:
    server.handler = lambda req: chat("never arrives", reasoning="...", delay=120)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say hung"])
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds, "r", "--timeout=1", "--request_timeout=300",
                                                   "--num_workers=1"), timeout=60)
    assert proc.returncode == 3, proc.stderr
    [sample] = checkpoint_samples(tmp_path / "data" / "r")
    assert sample["status"] == "failed" and sample["reason"] == "timeout", sample
    assert "1s sample limit (--timeout, working time)" in sample["message"], sample


def test_the_wall_clock_limit_cuts_a_sample_that_waits_too_long(tmp_path: Path, server: ScriptedServer,
                                                               clean_env: dict[str, str]) -> None:
    server.handler = refusing_provider()
    ds = write_dataset(tmp_path / "ds.jsonl", ["say waited"])
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds, "r", "--sample_wall_timeout=1.5", "--timeout=600"))
    assert proc.returncode == 3, proc.stderr
    [sample] = checkpoint_samples(tmp_path / "data" / "r")
    assert sample["status"] == "failed" and sample["reason"] == "timeout", sample
    assert "1.5s wall-clock sample limit (--sample_wall_timeout)" in sample["message"], sample


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_the_wall_clock_limit_is_checked_like_every_number(tmp_path: Path, value: str,
                                                           clean_env: dict[str, str]) -> None:
    ds = write_dataset(tmp_path / "ds.jsonl", ["x"])
    proc = run_cli(tmp_path, clean_env, f"--dataset_file={ds}", f"--sample_wall_timeout={value}", "--model=local")
    assert proc.returncode == 2 and "--sample_wall_timeout" in proc.stderr, proc.stderr
    assert not (tmp_path / "data").exists()


def test_a_sandbox_made_at_the_first_tool_call_does_not_count_against_the_timeout(
        tmp_path: Path, server: ScriptedServer) -> None:
    """Backends that pool what sandboxes are made of (bwrap slots) make one at the sample's first
    tool call, inside its limits: however long that takes (here 1.5 s, against a 1 s --timeout),
    it is the run's wait, as it is for a sandbox made before the sample starts."""
    from trajforge.config import RunConfig
    from trajforge.dataset import Sample
    from trajforge.sample.worker import SampleWorker

    server.handler = echo_policy(turns=1)
    config = RunConfig(base_url=server.url, model="scripted", api_key="k", sandbox="local",
                       distribution="terminal_only", timeout=1, batch_size=1)

    async def scenario() -> dict:
        worker = SampleWorker(config, workspace_root=tmp_path / "ws")
        await worker.start()
        provider = worker.sandboxes
        assert provider is not None
        create = provider.create

        async def first_use(image: str | None) -> bool:
            return True

        async def slow_create(**kw):  # a slot that takes long to be free
            await asyncio.sleep(1.5)
            return await create(**kw)

        provider.made_on_first_use = first_use  # type: ignore[method-assign]
        provider.create = slow_create  # type: ignore[method-assign]
        try:
            outcome = await worker.process(Sample(0, 1, "say made", "id:0"))
        finally:
            await worker.aclose()
        assert outcome.status == "done", outcome
        assert outcome.record is not None
        return outcome.record["timing"]

    timing = asyncio.run(scenario())
    assert timing["wall_s"] >= 1.5 and timing["working_s"] < 1, timing
