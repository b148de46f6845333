"""The batch engine under stress: concurrency, limits, retries, crashes, resume, locking."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

from tests.conftest import cli
from tests.support.policies import echo_policy, user_prompt
from tests.support.scripted_server import Recorded, Reply, ScriptedServer, chat, http_error, tool_call
from tests.runner.test_e2e import base_args, run_cli, write_dataset
from tests.support.run_state import read_records


def stats_of(tmp_path: Path, run: str = "r") -> dict:
    return json.loads((tmp_path / "data" / run / "statistics.json").read_text())


def test_hundreds_of_sessions_in_flight(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    """256 sessions have a model request in flight at once. The server holds the requests until
    all 256 are in (ScriptedServer.hold_until), so the test waits for that event, whatever the
    machine's load; before, 0.5 s replies had to be slow enough for the runner to start 200."""
    server.handler = echo_policy(turns=1)
    server.hold_until = 256
    n = 300
    ds = write_dataset(tmp_path / "ds.jsonl", [f"say w{i}" for i in range(n)])
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds, "r", "--num_workers=256", "--batch_size=100"),
                   timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = read_records(tmp_path / "data" / "r")
    assert [r["prompt_index"] for r in lines] == list(range(n))
    assert server.held and server.max_in_flight == 256, server.max_in_flight


def test_sample_timeout_kills_its_processes(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    marker = tmp_path / "pidfile"

    def handle(req: Recorded) -> Reply:
        if "hang" in user_prompt(req.body):
            return chat(None, reasoning="wait", tool_calls=[tool_call("terminal", {
                "command": f"sh -c 'echo $$ > {marker}; exec sleep 3600'"})])
        return echo_policy(1)(req)

    server.handler = handle
    ds = write_dataset(tmp_path / "ds.jsonl", ["please hang", "say ok"])
    # Only the sample's 2 s cut ends the hang: the command sleeps an hour and its tool timeout is
    # longer than run_cli's own, so a run that waited for either fails here.
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds, "r", "--timeout=2", "--tool_timeout=3600"))
    assert proc.returncode == 3, proc.stderr
    stats = stats_of(tmp_path)
    assert stats["run"]["samples"]["failed_by_class"]["timeout"] == 1
    assert stats["run"]["samples"]["finished"] == 1
    pid = int(marker.read_text())
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_retries_follow_task_type_and_resume_retries_failures(tmp_path: Path, server: ScriptedServer,
                                                              clean_env) -> None:
    attempts: Counter[str] = Counter()
    fail_times = {"say flaky": 2, "say plain": 2}

    def handle(req: Recorded) -> Reply:
        prompt = user_prompt(req.body)
        if not any(m["role"] == "tool" for m in req.body["messages"]):
            attempts[prompt] += 1
            if attempts[prompt] <= fail_times[prompt]:
                return http_error(400, "scripted failure")  # not retried by the client: fails the attempt
        return echo_policy(1)(req)

    server.handler = handle
    (tmp_path / "cfg.yaml").write_text("task_types: {flaky: {retry_limit: 2}}\n")
    (tmp_path / "ds.jsonl").write_text(json.dumps({"prompt": "say flaky", "task_type": "flaky"}) + "\n"
                                       + json.dumps({"prompt": "say plain"}) + "\n")
    args = base_args(server, tmp_path / "ds.jsonl", "r", "--config=cfg.yaml")
    proc = run_cli(tmp_path, clean_env, *args)
    assert proc.returncode == 3, proc.stderr
    assert attempts == {"say flaky": 3, "say plain": 2}  # 1 + retry_limit attempts each
    stats = stats_of(tmp_path)
    assert stats["run"]["samples"]["finished"] == 1
    assert stats["run"]["samples"]["failed_by_class"]["api_error"] == 1
    proc = run_cli(tmp_path, clean_env, *args, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert attempts["say plain"] == 3 and attempts["say flaky"] == 3
    stats = stats_of(tmp_path)
    assert stats["run"]["samples"]["finished"] == 2 and stats["run"]["samples"]["failed"] == 0
    assert stats["invocations"] == 2


def test_sigkill_five_times_then_resume_loses_and_duplicates_nothing(tmp_path: Path, server: ScriptedServer,
                                                                     clean_env) -> None:
    server.handler = echo_policy(turns=1, delay=0.03)
    prompts = [f"say w{i % 70}" for i in range(90)]  # 20 duplicated prompts
    ds = write_dataset(tmp_path / "ds.jsonl", prompts)
    args = base_args(server, ds, "r", "--num_workers=6", "--batch_size=10")
    rng = random.Random(7)
    for k in range(5):
        p = subprocess.Popen(cli("run", *args, *(["--resume"] if k else [])), cwd=tmp_path, env=clean_env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.8, 1.6))
        p.send_signal(signal.SIGKILL)
        p.wait()
    proc = run_cli(tmp_path, clean_env, *args, "--resume")
    assert proc.returncode == 0, proc.stderr
    lines = read_records(tmp_path / "data" / "r")
    assert [r["prompt_index"] for r in lines] == list(range(len(prompts)))
    ids = [r["sample_id"] for r in lines]
    assert len(set(ids)) == len(prompts)
    assert Counter(r["conversations"][1]["value"] for r in lines) == Counter(prompts)
    assert stats_of(tmp_path)["run"]["samples"]["finished"] == len(prompts)


def test_reordered_dataset_resumes_by_content(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    server.handler = echo_policy(turns=1)
    prompts = [f"say r{i}" for i in range(6)] + ["say r0"]
    ds = write_dataset(tmp_path / "ds.jsonl", prompts)
    assert run_cli(tmp_path, clean_env, *base_args(server, ds)).returncode == 0
    calls = len(server.requests)
    write_dataset(ds, list(reversed(prompts)) + ["say new"])
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds), "--resume")
    assert proc.returncode == 0, proc.stderr
    assert len(server.requests) == calls + 2  # only the new prompt ran
    lines = read_records(tmp_path / "data" / "r")
    assert [r["conversations"][1]["value"] for r in lines] == list(reversed(prompts)) + ["say new"]
    assert [r["prompt_index"] for r in lines] == list(range(8))


def test_torn_last_line_is_cut_not_glued(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    server.handler = echo_policy(turns=1)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a", "say b", "say c"])
    args = base_args(server, ds, "r", "--batch_size=10")
    assert run_cli(tmp_path, clean_env, *args).returncode == 0
    batch = tmp_path / "data" / "r" / "batch_0.jsonl"
    lines = batch.read_bytes().splitlines(keepends=True)
    batch.write_bytes(b"".join(lines[:2]) + lines[2][: len(lines[2]) // 2])  # crash mid-write of the third
    proc = run_cli(tmp_path, clean_env, *args, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert "torn" in proc.stderr
    for raw in batch.read_bytes().splitlines():
        json.loads(raw)
    assert len(read_records(tmp_path / "data" / "r")) == 3


def test_second_process_on_same_run_is_refused(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    server.handler = echo_policy(turns=1)
    server.hold_until = 3  # never 3 in flight with 2 samples: the first run waits, holding its lock, until release();
    # held in the server's loop, not by blocking it, so the second run's endpoint probe is answered
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a", "say b"])
    args = base_args(server, ds)
    first = subprocess.Popen(cli("run", *args), cwd=tmp_path, env=clean_env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not server.requests and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.05)
        assert server.requests, "the first run made no model call"
        second = run_cli(tmp_path, clean_env, *args, "--resume")
        assert second.returncode != 0
        assert "another trajforge process" in second.stderr
    finally:
        server.release()
        assert first.wait(120) == 0


def test_interrupt_exits_130_and_resume_finishes(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    server.handler = echo_policy(turns=1, delay=0.3)
    ds = write_dataset(tmp_path / "ds.jsonl", [f"say i{i}" for i in range(40)])
    args = base_args(server, ds, "r", "--num_workers=2")
    p = subprocess.Popen(cli("run", *args), cwd=tmp_path, env=clean_env, stderr=subprocess.PIPE, text=True)
    batch = tmp_path / "data" / "r" / "batch_0.jsonl"
    deadline = time.monotonic() + 120
    while p.poll() is None and time.monotonic() < deadline and not (batch.exists() and batch.read_bytes()):
        time.sleep(0.05)  # a sample finished: the run is scheduling, its SIGINT handler installed
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    first = stats_of(tmp_path)["run"]["samples"]["finished"]
    assert 0 < first < 40
    proc = run_cli(tmp_path, clean_env, *args, "--resume")
    assert proc.returncode == 0, proc.stderr
    stats = stats_of(tmp_path)
    assert stats["run"]["samples"]["finished"] == 40
    assert stats["last_invocation"]["samples"]["finished"] == 40 - first


def test_bad_key_stops_the_run(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    server.handler = lambda req: http_error(401, "invalid key")
    ds = write_dataset(tmp_path / "ds.jsonl", [f"say k{i}" for i in range(50)])
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds, "r", "--num_workers=2", "--api_key=sk-secret-123"))
    assert proc.returncode == 1
    assert "401" in proc.stderr or "auth" in proc.stderr.lower()
    assert "sk-secret-123" not in proc.stderr + proc.stdout
    assert len(server.requests) <= 4
    for f in (tmp_path / "data" / "r").iterdir():
        if f.is_file():
            assert b"sk-secret-123" not in f.read_bytes(), f


def test_bad_dataset_leaves_existing_output_untouched(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    server.handler = echo_policy(turns=1)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a"])
    assert run_cli(tmp_path, clean_env, *base_args(server, ds)).returncode == 0
    run = tmp_path / "data" / "r"
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    ds.write_text('{"prompt": "ok"}\n{"prompt": 3}\n')
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds), "--resume")
    assert proc.returncode != 0 and "ds.jsonl:2" in proc.stderr and "prompt" in proc.stderr
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert os.listdir(run)


def test_merge_filters_unoffered_tools_and_samples_no_longer_in_the_dataset(tmp_path: Path, server: ScriptedServer,
                                                                             clean_env) -> None:
    def handle(req: Recorded) -> Reply:
        if "stray" in user_prompt(req.body) and not any(m["role"] == "tool" for m in req.body["messages"]):
            # web_search exists, but terminal_only never offers it: a corrupt entry for this sample
            return chat(None, reasoning="r", tool_calls=[tool_call("web_search", {"query": "x"})])
        return echo_policy(1)(req)

    server.handler = handle
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a", "say stray", "say c"])
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds))
    assert proc.returncode == 0, proc.stderr
    stats = stats_of(tmp_path)
    assert stats["run"]["samples"]["discarded_by_reason"] == {"hallucinated_tool": 1}
    assert [r["conversations"][1]["value"] for r in read_records(tmp_path / "data" / "r")] \
        == ["say a", "say c"]
    write_dataset(ds, ["say a"])  # the dataset shrank: the others stay in batch files only
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds), "--resume")
    assert proc.returncode == 0, proc.stderr
    assert "no longer in the dataset" in proc.stderr
    lines = read_records(tmp_path / "data" / "r")
    assert [r["prompt_index"] for r in lines] == [0]
    assert stats_of(tmp_path)["run"]["samples"]["finished"] == 1


def test_provider_error_mid_generation_is_a_retried_failure(tmp_path: Path, server: ScriptedServer,
                                                            clean_env) -> None:
    server.handler = lambda req: chat("partial text", reasoning="r", finish_reason="error")
    ds = write_dataset(tmp_path / "ds.jsonl", ["say e"])
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds))
    assert proc.returncode == 3, proc.stderr
    stats = stats_of(tmp_path)
    assert stats["run"]["samples"]["failed_by_class"]["api_error"] == 1
    assert stats["run"]["samples"]["finished"] == 0
    assert len(server.requests) == 2  # the first attempt and its in-run retry


def test_spend_of_discarded_samples_is_counted(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    server.handler = echo_policy(turns=1, reasoning=False)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a", "say b"])
    assert run_cli(tmp_path, clean_env, *base_args(server, ds)).returncode == 0
    assert run_cli(tmp_path, clean_env, *base_args(server, ds), "--resume").returncode == 0
    run = stats_of(tmp_path)["run"]
    assert run["samples"]["discarded"] == 2
    assert run["api_calls"] == 4 and run["tokens"]["prompt"] == 4 * 10
