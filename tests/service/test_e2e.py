"""The rollout service end to end, as a trainer uses it: 50 groups x 8 rollouts of `check` rows
through `trajforge serve` and the scripted model on loopback. The client streams and acks as it
goes, changes the policy version twice, drops its own connection once, and the service is
SIGKILLed and resumed once. Every group arrives, is acked exactly once and never comes again;
each rollout says its policy versions; the rollouts the test breaks (a sandbox that cannot start,
a provider answering 500) come out masked, never as reward 0. The embedded model runs the same
steps with 2 groups of 2 (a rollout of it takes tens of seconds on two shared cores)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.service.test_serve import FAILING, Service
from tests.support.failing_backend import BROKEN
from tests.support.policies import echo_policy, user_prompt
from tests.support.scripted_server import Recorded, Reply, ScriptedServer, http_error

GROUPS, N = 50, 8
echo = echo_policy(turns=1, delay=0.01)


def policy(req: Recorded) -> Reply:
    if user_prompt(req.body).startswith("flaky"):
        return http_error(500, "the provider is down")
    return echo(req)


def rows(tmp: Path) -> list[dict[str, Any]]:
    broken = tmp / BROKEN
    broken.mkdir()
    out = []
    for i in range(GROUPS):
        if i % 10 == 3:
            out.append({"prompt": f"flaky {i}", "check": "true"})
        elif i % 10 == 7:
            out.append({"prompt": f"say {i}", "cwd": str(broken), "check": "true"})
        else:
            out.append({"prompt": f"say {i}", "check": "true" if i % 2 else "false"})
    return out


def test_fifty_groups_of_eight_through_a_kill_a_dropped_connection_and_two_policy_changes(tmp_path: Path) -> None:
    submitted = rows(tmp_path)
    received: Counter[str] = Counter()
    acked: list[str] = []
    groups: dict[str, dict[str, Any]] = {}
    flags = ("--policy_version=0", "--retry_masked=1", f"--sandbox={FAILING}", "--num_workers=8")
    with ScriptedServer(policy) as server:
        service = Service(server, tmp_path, *flags)
        _, made = service.request("POST", "/groups", {"rows": submitted, "n": N})
        ids = made["ids"]
        assert len(ids) == GROUPS

        def take(s: Service, cursor: int, until: int, *, ack: bool = True) -> int:
            stream = s.stream(cursor)
            try:
                for group in stream:
                    assert group["id"] not in acked, "an acked group came again"
                    received[group["id"]] += 1
                    groups[group["id"]] = group
                    cursor = group["cursor"]
                    if len(received) == 1:  # the first group: most are still running
                        assert s.request("GET", "/status")[1]["open_rollouts"] >= GROUPS * N // 2
                    if ack:
                        assert s.request("POST", "/groups/ack", {"ids": [group["id"]]})[1] == {"acked": 1}
                        acked.append(group["id"])
                    if len(received) >= until:
                        return cursor
            finally:
                stream.close()  # the client's side of the connection goes
            return cursor

        cursor = take(service, 0, 10)
        assert service.request("POST", "/policy", {"version": 1})[0] == 200
        cursor = take(service, cursor, 20)
        take(service, cursor, 22, ack=False)  # two groups read, then the connection dropped before their acks
        cursor = take(service, cursor, 30)  # from the last acked cursor: the two come again, then more
        assert service.request("POST", "/policy", {"version": 2})[0] == 200
        cursor = take(service, cursor, 32)
        service.kill()
        service = Service(server, tmp_path, "--resume", *flags)
        try:
            take(service, 0, GROUPS)  # from the start: only what was not acked comes
            status = service.request("GET", "/status")[1]
        finally:
            assert service.stop() == 0
    assert sorted(acked) == sorted(ids) and len(acked) == GROUPS, "every group acked exactly once"
    assert max(received.values()) <= 2 and sum(n == 2 for n in received.values()) <= 4  # only unacked ones again
    assert (status["acked"], status["finished_unacked"], status["queued"], status["policy_version"]) == (GROUPS, 0, 0, 2)
    versions = set()
    for row, gid in zip(submitted, ids, strict=True):
        rollouts = groups[gid]["rollouts"]
        assert len(rollouts) == N
        broken = row["prompt"].startswith("flaky") or "cwd" in row
        for r in rollouts:
            if broken:
                assert (r["status"], r["reward"]) == ("masked", None), r
                assert r["failure"] == ("api_error" if "flaky" in row["prompt"] else "sandbox")
            else:
                assert r["status"] == "scored" and r["reward"] == (1.0 if row["check"] == "true" else 0.0)
                assert r["policy_versions"] and set(r["policy_versions"]) <= {0, 1, 2}
                versions |= set(r["policy_versions"])
        assert groups[gid]["usable"] == (0 if broken else N)
    assert 0 in versions and 2 in versions  # calls before the first change and after the second
    kept = (tmp_path / "svc" / "trajectories.jsonl").read_text().splitlines()
    assert len(kept) == 40 * N  # the run's own files hold every scored rollout once
    assert len({json.loads(x)["sample_id"] for x in kept}) == 40 * N


def test_the_embedded_model_serves_groups_through_an_ack_a_policy_change_and_a_kill(tmp_path: Path) -> None:
    """The scenario above at the embedded model's pace: a group streamed and acked, the policy
    version changed, a second group, the service SIGKILLed and resumed; the acked group never
    comes again and the second one comes once, its rollouts under the new version."""
    pytest.importorskip("llama_cpp")
    flags = ("--model=local", "--max_turns=1", "--max_tokens=16", "--policy_version=4", "--keep_no_reasoning",
             "--num_workers=2")
    with ScriptedServer(policy) as unused:  # the Service helper names a model server: the local model ignores it
        service = Service(unused, tmp_path, *flags)
        try:
            _, made = service.request("POST", "/groups", {"rows": [{"prompt": "Say hi.", "check": "true"}], "n": 2})
            (first,) = service.take(1)
            assert service.request("POST", "/groups/ack", {"ids": [first["id"]]})[1] == {"acked": 1}
            assert service.request("POST", "/policy", {"version": 5})[0] == 200
            _, later = service.request("POST", "/groups", {"rows": [{"prompt": "Say bye.", "check": "true"}],
                                                           "n": 2})
        finally:
            service.kill()  # whether the second group had started, ended or not: --resume goes on with it
        service = Service(unused, tmp_path, "--resume", *flags)
        try:
            seen = service.take(1)  # from cursor 0: only what is not acked
            status = service.request("GET", "/status")[1]
        finally:
            assert service.stop() == 0
    assert first["id"] == made["ids"][0] and [g["id"] for g in seen] == later["ids"]
    assert (status["acked"], status["queued"], status["policy_version"]) == (1, 0, 5)
    for group, version in ((first, 4), (seen[0], 5)):
        assert len(group["rollouts"]) == 2
        for r in group["rollouts"]:  # a small model's answer: scored with its check's reward
            assert (r["status"], r["reward"]) == ("scored", 1.0), r
            assert r["record"]["metadata"]["model"].startswith("local")
            assert set(r["policy_versions"]) == {version}
