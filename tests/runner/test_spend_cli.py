"""Spend control and adaptive concurrency through the real CLI against a priced scripted server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.policies import echo_policy
from tests.support.scripted_server import ScriptedServer, with_usage
from tests.runner.test_e2e import base_args, run_cli, write_dataset
from tests.support.run_state import read_records

PRICED = "pricing:\n  scripted-model: {prompt: 10, completion: 100}\n"  # USD per Mtok


def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "data" / "r"


def config(tmp_path: Path, text: str = PRICED) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return f"--config={path}"


def test_max_cost_stops_new_samples_and_resume_with_more_finishes_the_rest_once(tmp_path: Path, clean_env) -> None:
    # The provider reports $0.01 per call (it wins over the table, which would say $0.003): $0.02 a sample.
    with ScriptedServer(with_usage(echo_policy(1, delay=0.05), 100, 20, cost=0.01)) as srv:
        ds = write_dataset(tmp_path / "ds.jsonl", [f"say w{i}" for i in range(20)])
        args = base_args(srv, ds, "r", "--num_workers=3", config(tmp_path))
        first = run_cli(tmp_path, clean_env, *args, "--max_cost=0.2")
        calls_first = len(srv.chat_requests())
        stats = json.loads((run_dir(tmp_path) / "statistics.json").read_text())

        assert first.returncode == 4, first.stderr[-2000:]
        assert "budget reached" in first.stderr and "--resume" in first.stderr and "higher --max_cost" in first.stderr
        assert "Traceback" not in first.stderr
        spent = calls_first * 0.01
        assert stats["spend"]["spent"] == pytest.approx(spent)
        assert stats["spend"]["budget_reached"] is True
        # Never more than the budget plus what the 3 in-flight samples spent.
        assert 0.2 - 0.02 <= spent <= 0.2 + 3 * 0.02
        finished_first = read_records(run_dir(tmp_path))
        assert 8 <= len(finished_first) <= 12

        # The same budget again: nothing may start, same exit code.
        again = run_cli(tmp_path, clean_env, *args, "--resume", "--max_cost=0.2")
        assert again.returncode == 4, again.stderr[-2000:]
        assert len(srv.chat_requests()) == calls_first

        more = run_cli(tmp_path, clean_env, *args, "--resume", "--max_cost=1")
        assert more.returncode == 0, more.stderr[-2000:]
        records = read_records(run_dir(tmp_path))
        assert [r["prompt_index"] for r in records] == list(range(20))
        assert len(srv.chat_requests()) == 40  # every sample ran exactly once over the invocations
        stats = json.loads((run_dir(tmp_path) / "statistics.json").read_text())
        assert stats["spend"]["spent"] == pytest.approx(0.40)
        assert stats["spend"]["budget_reached"] is False
        assert all(r["usage"]["cost"] == pytest.approx(0.02) for r in records)


def test_a_budget_without_a_known_price_is_refused_before_anything_runs(tmp_path: Path, server: ScriptedServer,
                                                                         clean_env) -> None:
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a"])
    for flag in ("--max_cost=5", "--max_cost_per_sample=0.1"):
        proc = run_cli(tmp_path, clean_env, *base_args(server, ds, "r", flag))
        assert proc.returncode == 2
        assert "pricing" in proc.stderr and "scripted-model" in proc.stderr and "Traceback" not in proc.stderr
        assert not (tmp_path / "data").exists()
    assert server.requests == []


def test_the_refusal_of_an_unpriced_budget_does_not_claim_the_endpoint_reports_no_cost(
        tmp_path: Path, clean_env) -> None:
    # This endpoint does report each call's cost; trajforge cannot know that before a call, and says
    # what it relies on instead of a falsehood about the endpoint.
    with ScriptedServer(with_usage(echo_policy(1), 100, 20, cost=0.01)) as srv:
        ds = write_dataset(tmp_path / "ds.jsonl", ["say a"])
        proc = run_cli(tmp_path, clean_env, *base_args(srv, ds, "r", "--max_cost=5"))
        assert proc.returncode == 2 and srv.chat_requests() == []
    error = " ".join(proc.stderr.split())
    assert "does not report" not in error, error
    assert "openrouter.ai" in error and "pricing: {\"scripted-model\": {prompt: USD_PER_MTOK" in error, error


def test_table_prices_calls_of_a_provider_that_reports_no_cost(tmp_path: Path, clean_env) -> None:
    with ScriptedServer(with_usage(echo_policy(1), 100, 20)) as srv:
        ds = write_dataset(tmp_path / "ds.jsonl", ["say a", "say b"])
        proc = run_cli(tmp_path, clean_env, *base_args(srv, ds, "r", config(tmp_path), "--max_cost=10"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    per_call = (100 * 10 + 20 * 100) / 1e6
    assert [r["usage"]["cost"] for r in read_records(run_dir(tmp_path))] == \
        [pytest.approx(2 * per_call)] * 2
    stats = json.loads((run_dir(tmp_path) / "statistics.json").read_text())
    assert stats["spend"]["spent"] == pytest.approx(4 * per_call)
    assert stats["run"]["cost"] == pytest.approx(4 * per_call)


@pytest.mark.parametrize(("flag", "reason"), [("--max_tokens_per_sample=300", "max_tokens_per_sample"),
                                              ("--max_cost_per_sample=0.025", "max_cost_per_sample")])
def test_per_sample_limits_end_samples_as_partial_naming_the_limit(tmp_path: Path, clean_env, flag: str,
                                                                   reason: str) -> None:
    # 120 tokens and $0.01 per call: both limits are reached by the third call of a 5-turn session.
    with ScriptedServer(with_usage(echo_policy(5), 100, 20, cost=0.01)) as srv:
        ds = write_dataset(tmp_path / "ds.jsonl", ["say a", "say b"])
        proc = run_cli(tmp_path, clean_env, *base_args(srv, ds, "r", config(tmp_path), flag, "--max_turns=10"))
        calls = len(srv.chat_requests())
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = read_records(run_dir(tmp_path))
    assert len(records) == 2
    for r in records:
        assert r["partial"] is True and r["completed"] is False
        assert r["end_reason"] == reason
        assert r["api_calls"] == 3
        assert r["tool_stats"]["terminal"]["count"] == 3  # the last turn's tool call ran, like --max_turns
    assert calls == 6


def test_unlimited_samples_end_with_their_answer(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    server.handler = echo_policy(1)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a"])
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds, "r", "--max_tokens_per_sample=100000"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    [record] = read_records(run_dir(tmp_path))
    assert record["end_reason"] == "answer" and record["completed"] is True


def test_run_adapts_to_a_concurrency_cap_and_records_it(tmp_path: Path, clean_env) -> None:
    with ScriptedServer(echo_policy(1, delay=0.1), concurrency_cap=4) as srv:
        ds = write_dataset(tmp_path / "ds.jsonl", [f"say w{i}" for i in range(60)])
        proc = run_cli(tmp_path, clean_env, *base_args(srv, ds, "r", "--num_workers=32", "--max_retries=50"))
        rejected = srv.rejected
    assert proc.returncode == 0, proc.stderr[-2000:]
    stats = json.loads((run_dir(tmp_path) / "statistics.json").read_text())
    assert stats["run"]["samples"]["finished"] == 60
    conc = stats["concurrency"]
    assert conc["adaptive"] is True and conc["ceiling"] == 32
    assert conc["final_limit"] <= 5 and conc["min_limit"] <= 5
    assert conc["rate_limited"] == rejected > 0
    assert conc["series"] and {"t", "limit", "in_flight", "requests_per_min", "spent"} <= set(conc["series"][-1])
    assert "in flight, limit" in proc.stderr


def test_adaptive_concurrency_off_keeps_num_workers(tmp_path: Path, clean_env) -> None:
    with ScriptedServer(echo_policy(1, delay=0.1), concurrency_cap=4) as srv:
        ds = write_dataset(tmp_path / "ds.jsonl", [f"say w{i}" for i in range(16)])
        proc = run_cli(tmp_path, clean_env, *base_args(srv, ds, "r", "--num_workers=16", "--max_retries=200",
                                                       "--adaptive_concurrency", "false"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    conc = json.loads((run_dir(tmp_path) / "statistics.json").read_text())["concurrency"]
    assert conc["adaptive"] is False and conc["final_limit"] == conc["min_limit"] == 16


def test_tools_model_calls_pass_the_runs_gate_and_are_charged_to_their_sample(tmp_path: Path, clean_env) -> None:
    from tests.support.scripted_server import Recorded, Reply, chat, tool_call

    def handle(req: Recorded) -> Reply:
        body = req.body
        if "tools" not in body:  # moa's own calls: two references, then the aggregator
            return chat("aggregate" if body["messages"][0]["role"] == "system" else "reference answer")
        if not any(m["role"] == "tool" for m in body["messages"]):
            return chat(None, tool_calls=[tool_call("mixture_of_agents", {"user_prompt": "Why?"})], reasoning="Ask.")
        return chat("Done.", reasoning="Answered.")

    (tmp_path / "c.yaml").write_text(
        "distributions: {moa_only: {toolsets: {moa: 100}}}\n"
        "tools: {moa: {reference_models: [ref-a, ref-b], aggregator_model: agg}}\n" + PRICED)
    with ScriptedServer(with_usage(handle, 100, 20, cost=0.01)) as srv:
        ds = write_dataset(tmp_path / "ds.jsonl", ["q1", "q2", "q3"])
        args = [a for a in base_args(srv, ds, "r") if not a.startswith("--distribution")]
        proc = run_cli(tmp_path, clean_env, *args, "--distribution=moa_only", f"--config={tmp_path / 'c.yaml'}",
                       "--max_cost=10", "--max_requests_per_minute=6000")
        calls = len(srv.chat_requests())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert calls == 3 * 5  # per sample: 2 agent calls, 2 references, 1 aggregator
    stats = json.loads((run_dir(tmp_path) / "statistics.json").read_text())
    assert stats["concurrency"]["requests"] == calls  # every call, the tool's included, went through the gate
    assert stats["spend"]["spent"] == pytest.approx(calls * 0.01)
    for record in read_records(run_dir(tmp_path)):
        assert record["usage"]["cost"] == pytest.approx(0.05)  # the sample pays for its tool's calls


def test_bad_prices_and_limits_are_refused_naming_the_key(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a"])
    bad = config(tmp_path, "pricing:\n  scripted-model: {prompt: -1, completion: 2}\n")
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds, "r", bad, "--max_cost=1"))
    assert proc.returncode == 2
    assert "pricing.scripted-model.prompt" in proc.stderr and "Traceback" not in proc.stderr
    for flag, words in (("--max_cost=0", "greater than 0"), ("--max_tokens_per_sample=0", "at least 1"),
                        ("--adaptive_concurrency=perhaps", "true or false")):
        proc = run_cli(tmp_path, clean_env, *base_args(server, ds, "r", flag))
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    assert server.requests == [] and not (tmp_path / "data").exists()
