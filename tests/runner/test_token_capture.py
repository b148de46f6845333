"""--capture_tokens end to end: real runs through the CLI against a server that renders a real chat
template with a real tokenizer and reports ids in vLLM's shapes (tests/support/token_server.py),
a server that ignores the request, and a plain one; statistics, the end of the run, resume."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import cli
from tests.support.policies import echo_policy
from tests.support.scripted_server import ScriptedServer
from tests.support.token_server import DROP_REASONING, TokenServer, terminal_policy


def run(tmp_path: Path, env: dict[str, str], server: ScriptedServer, prompts: list[str], *extra: str,
        name: str = "r") -> subprocess.CompletedProcess[str]:
    ds = tmp_path / f"{name}.jsonl"
    if not ds.exists() or "--resume" not in extra:
        ds.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return subprocess.run(cli("run", f"--dataset_file={ds}", "--batch_size=2", f"--run_name={name}",
                              f"--base_url={server.url}", "--model=policy", "--distribution=terminal_only",
                              "--sandbox=local", "--num_workers=3", *extra),
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)


def records(tmp_path: Path, name: str = "r") -> list[dict[str, Any]]:
    return [json.loads(x) for x in (tmp_path / "data" / name / "trajectories.jsonl").read_text().splitlines()]


def statistics(tmp_path: Path, name: str = "r") -> dict[str, Any]:
    return json.loads((tmp_path / "data" / name / "statistics.json").read_text())


def server_calls(ts: TokenServer, rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The server's replies to this record's sample, in turn order."""
    prompt = rec["conversations"][1]["value"]
    calls = sorted((c for c in ts.calls if c["prompt"] == prompt), key=lambda c: c["turn"])
    assert [c["turn"] for c in calls] == list(range(rec["api_calls"])), "one reply per call"
    return calls


def check_segments_against_the_server(rec: dict[str, Any], calls: list[dict[str, Any]]) -> None:
    """Each segment's input_ids are the ids the server reported for the segment's last prompt
    followed by that call's completion; loss_mask is 1 on exactly the completions' tokens, and
    the logprobs are the server's, in place."""
    tokens = rec["tokens"]
    for seg in tokens["segments"]:
        last = calls[seg["turns"][-1]]
        assert seg["input_ids"] == last["prompt_ids"] + last["completion_ids"]
        expected_mask = [0] * len(seg["input_ids"])
        expected_logprobs: list[float | None] = [None] * len(seg["input_ids"])
        for t in seg["turns"]:
            call = calls[t]
            start = tokens["turns"][t]["prompt_tokens"]
            assert start == len(call["prompt_ids"]) and tokens["turns"][t]["completion_tokens"] == len(
                call["completion_ids"])
            assert seg["input_ids"][:start] == call["prompt_ids"]  # every call of the segment saw its prefix
            assert seg["input_ids"][start:start + len(call["completion_ids"])] == call["completion_ids"]
            expected_mask[start:start + len(call["completion_ids"])] = [1] * len(call["completion_ids"])
            expected_logprobs[start:start + len(call["logprobs"])] = call["logprobs"]
        assert seg["loss_mask"] == expected_mask
        assert seg["logprobs"] == expected_logprobs


def test_segments_are_the_ids_the_server_reported(tmp_path: Path, clean_env: dict[str, str]) -> None:
    ts = TokenServer(terminal_policy(turns=2))
    prompts = [f"say word{i}" for i in range(4)]
    with ScriptedServer(ts) as server:
        proc = run(tmp_path, clean_env, server, prompts, "--capture_tokens", "--policy_version=12")
        requests = server.chat_requests()
    assert proc.returncode == 0, proc.stderr
    assert all(r["return_token_ids"] is True and r["logprobs"] is True for r in requests)
    # The model saw its reasoning again: the history's assistant turns carry it back.
    later = [m for r in requests for m in r["messages"] if m["role"] == "assistant"]
    assert later and all(m["reasoning_content"].startswith("Turn ") for m in later)
    recs = records(tmp_path)
    assert len(recs) == 4
    for rec in recs:
        assert rec["api_calls"] == 3 and rec["policy_versions"] == [12, 12, 12]
        assert "tokens_missing" not in rec
        assert rec["tokens"]["prefix_breaks"] == 0 and len(rec["tokens"]["segments"]) == 1
        check_segments_against_the_server(rec, server_calls(ts, rec))
    capture = statistics(tmp_path)["run"]["token_capture"]
    assert capture == {"samples_captured": 4, "samples_without": {}, "replies_without_ids": 0, "calls": 12,
                       "segments": 4, "prefix_breaks": 0, "prefix_integrity": 1.0}
    assert "prefix integrity" in proc.stdout and "1.000 (12 calls in 4 segments, 0 prefix breaks)" in proc.stdout


def test_a_template_that_drops_earlier_reasoning_splits_at_exactly_that_turn(tmp_path: Path,
                                                                           clean_env: dict[str, str]) -> None:
    # Only turn 1 reasons: turn 2's prompt renders it without its <think> block, so it cannot
    # start with what the model generated; turn 1's prompt still extends turn 0's.
    ts = TokenServer(terminal_policy(turns=2, reasoning_at=(1,)), template=DROP_REASONING)
    with ScriptedServer(ts) as server:
        proc = run(tmp_path, clean_env, server, ["say alpha", "say beta"], "--capture_tokens")
    assert proc.returncode == 0, proc.stderr
    for rec in records(tmp_path):
        tokens = rec["tokens"]
        assert [s["turns"] for s in tokens["segments"]] == [[0, 1], [2]]
        assert tokens["prefix_breaks"] == 1
        assert "policy_versions" not in rec  # no --policy_version: nothing to stamp
        check_segments_against_the_server(rec, server_calls(ts, rec))
    capture = statistics(tmp_path)["run"]["token_capture"]
    assert capture["prefix_breaks"] == 2 and capture["prefix_integrity"] == 0.5  # 2 of 4 later calls extended


def test_a_server_that_ignores_the_request_marks_its_samples_and_the_run_goes_on(
        tmp_path: Path, clean_env: dict[str, str]) -> None:
    ts = TokenServer(terminal_policy(turns=1), honor_ids=False)
    with ScriptedServer(ts) as server:
        proc = run(tmp_path, clean_env, server, ["say a", "say b", "say c"], "--capture_tokens")
    assert proc.returncode == 0, proc.stderr
    for rec in records(tmp_path):
        assert rec["tokens"] is None and rec["tokens_missing"] == "not_returned_by_server"
        assert rec["tokens_missing_calls"] == 2 and rec["completed"] is True
    capture = statistics(tmp_path)["run"]["token_capture"]
    assert capture["samples_captured"] == 0 and capture["samples_without"] == {"not_returned_by_server": 3}
    assert capture["replies_without_ids"] == 6 and capture["prefix_integrity"] is None
    assert ("6 model replies came back without the token ids --capture_tokens asked for" in proc.stderr
            and "3 sample(s) say tokens: null, tokens_missing: not_returned_by_server" in proc.stderr)


def test_a_plain_server_gets_no_extra_fields_and_records_say_not_requested(tmp_path: Path, server: ScriptedServer,
                                                                           clean_env: dict[str, str]) -> None:
    server.handler = echo_policy(turns=1)
    proc = run(tmp_path, clean_env, server, ["say one", "say two"])
    assert proc.returncode == 0, proc.stderr
    for body in server.chat_requests():
        assert not {"return_token_ids", "logprobs"} & set(body)
        assert all("reasoning_content" not in m for m in body["messages"])  # the history is as before
    for rec in records(tmp_path):
        assert rec["tokens"] is None and rec["tokens_missing"] == "not_requested"
        assert "tokens_missing_calls" not in rec and "policy_versions" not in rec
    stats = statistics(tmp_path)
    assert "token_capture" not in stats["run"] and "token_capture" not in stats["last_invocation"]
    assert "prefix integrity" not in proc.stdout and "token ids" not in proc.stderr


def test_a_resumed_run_keeps_the_ids_it_captured(tmp_path: Path, clean_env: dict[str, str]) -> None:
    ts = TokenServer(terminal_policy(turns=1))
    with ScriptedServer(ts) as server:
        first = run(tmp_path, clean_env, server, ["say a", "say b"], "--capture_tokens", "--policy_version=1")
        assert first.returncode == 0, first.stderr
        before = (tmp_path / "data" / "r" / "trajectories.jsonl").read_bytes()
        ds = tmp_path / "r.jsonl"
        ds.write_text(ds.read_text() + json.dumps({"prompt": "say c"}) + "\n")
        again = run(tmp_path, clean_env, server, [], "--resume", "--capture_tokens", "--policy_version=2")
    assert again.returncode == 0, again.stderr
    after = (tmp_path / "data" / "r" / "trajectories.jsonl").read_bytes()
    assert after.startswith(before)  # the first invocation's records, ids included, byte for byte
    recs = records(tmp_path)
    assert [r["policy_versions"] for r in recs] == [[1, 1], [1, 1], [2, 2]]
    for rec in recs:
        check_segments_against_the_server(rec, server_calls(ts, rec))
    assert statistics(tmp_path)["run"]["token_capture"]["samples_captured"] == 3


@pytest.mark.parametrize(("value", "message"), [("-1", "policy_version"), ("x", "policy_version")])
def test_a_bad_policy_version_is_refused_before_anything_runs(tmp_path: Path, server: ScriptedServer,
                                                              clean_env: dict[str, str], value: str,
                                                              message: str) -> None:
    proc = run(tmp_path, clean_env, server, ["say a"], f"--policy_version={value}")
    assert proc.returncode == 2 and message in proc.stderr
    assert server.chat_requests() == [] and not (tmp_path / "data").exists()
