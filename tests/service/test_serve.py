"""`trajforge serve` (trajforge.service) end to end on loopback: a real service process, the scripted
OpenAI-compatible server, a client speaking HTTP with the standard library.

Groups stream as they finish with what trajectories.jsonl holds (scrubbed, filtered), masked
rollouts are masked and never reward 0, acks are kept across a SIGKILL and `--resume`, and the
service refuses what it must (a non-loopback bind without a token, a wrong token, a big body, a
bad row, a host directory `run` refuses)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import threading
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.support.failing_backend import BROKEN
from tests.support.images import podman  # noqa: F401 (fixture)
from tests.support.policies import echo_policy, tool_messages, user_prompt
from tests.support.scripted_server import Recorded, Reply, ScriptedServer, chat, http_error, tool_call
from tests.support.tasks import REWARD_IF, scripted_agent, task_base, write_task  # noqa: F401 (fixture)
from trajforge.config.load import build_config
from trajforge.sandbox.backends.container.engine import Engine
from trajforge.errors import UsageError

KEY = "sk-serve-SeCrEt-0123456789abcdef"
FAILING = "tests.support.failing_backend:SPEC"
TOKEN = "serve-test-token"  # a service with one takes endpoints and key variables from requests


def policy(req: Recorded) -> Reply:
    """echo, except: `leak` answers with the key the request carried, `stray` calls a tool that is
    not offered, `flaky` always gets a 500."""
    prompt, auth = user_prompt(req.body), req.headers.get("Authorization", "")
    if prompt == "flaky":
        return http_error(500, "the provider is down")
    if prompt == "hang":  # a reply that comes after the test is over (the service's stop cancels it)
        return Reply(body=chat("late").body, delay=600)
    if tool_messages(req.body):
        return echo_policy(turns=1)(req)
    if prompt == "leak":
        return chat(f"the key is {auth}", reasoning="I will say it.")
    if prompt == "say stray":
        return chat(None, reasoning="r", tool_calls=[tool_call("web_search", {"query": "x"})])
    return echo_policy(turns=1)(req)


class Service:
    """A `trajforge serve` process; `url` is its API's base."""

    def __init__(self, server: ScriptedServer, out: Path, *extra: str, token: str | None = None) -> None:
        self.token = token
        argv = [sys.executable, "-m", "trajforge", "serve", "--port=0", f"--output_dir={out}", "--run_name=svc",
                "--batch_size=8", f"--base_url={server.url}", "--model=scripted-model",
                "--distribution=terminal_only", f"--api_key={KEY}", "--num_workers=4",
                "--max_retries=0", *(["--token", token] if token else []), *extra]
        if not any(a.startswith("--sandbox") for a in extra):
            argv.append("--sandbox=local")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd=out, env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if " at " not in line:
            raise AssertionError(f"the service did not start: {line}{self.proc.communicate()[1]}")
        self.url = line.split(" at ")[1].split()[0]

    def request(self, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if token or self.token:
            req.add_header("Authorization", f"Bearer {token or self.token}")
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def stream(self, cursor: int = 0, follow: bool = True) -> Iterator[dict[str, Any]]:
        """Groups as the service sends them; the connection closes when the generator does."""
        host, _, rest = self.url.removeprefix("http://").partition("/")
        conn = http.client.HTTPConnection(host)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        conn.request("GET", f"/{rest}/groups/stream?cursor={cursor}&follow={int(follow)}", headers=headers)
        response = conn.getresponse()
        assert response.status == 200
        try:
            while line := response.readline():
                yield json.loads(line)
        finally:
            conn.close()

    def take(self, count: int, cursor: int = 0) -> list[dict[str, Any]]:
        stream = self.stream(cursor)
        try:
            return [next(stream) for _ in range(count)]
        finally:
            stream.close()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=120)
        assert KEY not in err
        return self.proc.returncode

    def kill(self) -> None:
        self.proc.kill()
        self.proc.communicate(timeout=60)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer(policy) as s:
        yield s


def test_groups_stream_as_they_finish_with_what_the_run_keeps_and_masked_ones_never_score(
        server: ScriptedServer, tmp_path: Path) -> None:
    not_a_dir = tmp_path / BROKEN  # the sandbox cannot start in it
    not_a_dir.mkdir()
    service = Service(server, tmp_path, "--retry_masked=1", f"--sandbox={FAILING}")
    try:
        rows = [{"prompt": "say a", "check": "true"}, {"prompt": "say b", "check": "false"},
                {"prompt": "leak", "check": "true"}, {"prompt": "say stray", "check": "true"},
                {"prompt": "flaky", "check": "true"}, {"prompt": "say c", "cwd": str(not_a_dir), "check": "true"}]
        status, made = service.request("POST", "/groups", {"rows": rows, "n": 3})
        assert status == 200 and len(made["ids"]) == 6
        groups = service.take(6)
        by_prompt = {g["row"]["prompt"]: g for g in groups}
        assert sorted(g["id"] for g in groups) == sorted(made["ids"])
        assert [g["cursor"] for g in groups] == [1, 2, 3, 4, 5, 6]
        assert [(r["status"], r["reward"]) for r in by_prompt["say a"]["rollouts"]] == [("scored", 1.0)] * 3
        assert [(r["status"], r["reward"]) for r in by_prompt["say b"]["rollouts"]] == [("scored", 0.0)] * 3
        # the run's filters: a call to a tool not offered leaves the record out, as trajectories.jsonl does
        stray = by_prompt["say stray"]["rollouts"]
        assert [(r["status"], r["failure"], r["record"]) for r in stray] == [("dropped", "hallucinated_tool", None)] * 3
        # infrastructure failures are masked, run again once (--retry_masked 1), never a reward
        for name, failure in (("flaky", "api_error"), ("say c", "sandbox")):
            masked = by_prompt[name]["rollouts"]
            assert [(r["status"], r["failure"], r["reward"], r["runs"]) for r in masked] == \
                [("masked", failure, None, 2)] * 3, masked
            assert by_prompt[name]["usable"] == 0
        assert by_prompt["say a"]["usable"] == 3
        # the records are the lines trajectories.jsonl holds: scrubbed of the key
        assert KEY not in json.dumps(groups)
        assert "[REDACTED" in json.dumps(by_prompt["leak"]["rollouts"][0]["record"]) or \
            KEY not in json.dumps(by_prompt["leak"])
        status, acked = service.request("POST", "/groups/ack", {"ids": made["ids"][:4]})
        assert (status, acked) == (200, {"acked": 4})
        left = list(service.stream(0, follow=False))
        assert sorted(g["id"] for g in left) == sorted(made["ids"][4:])
        status, shown = service.request("GET", "/status")
        assert (shown["finished_unacked"], shown["acked"], shown["queued"]) == (2, 4, 0)
        assert shown["spent"] == 0.0  # the scripted model has no price
        assert shown["model"] is None or shown["model"]["in_flight"] == 0  # the invocation may still be merging
    finally:
        assert service.stop() == 0
    kept = (tmp_path / "svc" / "trajectories.jsonl").read_text()
    assert kept.count("\n") == 9  # say a, say b, leak: what the streams carried records of
    assert KEY not in kept


def test_a_killed_service_resumes_acked_groups_never_come_back_unacked_ones_do(
        server: ScriptedServer, tmp_path: Path) -> None:
    service = Service(server, tmp_path, "--policy_version=1")
    rows = [{"prompt": f"say {i}", "check": "true"} for i in range(6)]
    _, made = service.request("POST", "/groups", {"rows": rows, "n": 2})
    first = service.take(3)
    service.request("POST", "/groups/ack", {"ids": [g["id"] for g in first]})
    assert service.request("POST", "/policy", {"version": 2})[0] == 200
    service.kill()  # SIGKILL: no goodbye
    again = Service(server, tmp_path, "--resume", "--policy_version=1")
    try:
        rest = again.take(3)
        assert not {g["id"] for g in rest} & {g["id"] for g in first}
        assert sorted(g["id"] for g in first + rest) == sorted(made["ids"])
        assert again.request("GET", "/status")[1]["policy_version"] == 2  # the service's, not the flag's
        _, later = again.request("POST", "/groups", {"rows": [{"prompt": "say later", "check": "true"}], "n": 2})
        (group,) = again.take(1, cursor=max(g["cursor"] for g in rest))
        assert group["id"] == later["ids"][0]
        assert [r["policy_versions"] for r in group["rollouts"]] == [[2, 2], [2, 2]]
    finally:
        assert again.stop() == 0


def test_the_service_refuses_what_it_must(server: ScriptedServer, tmp_path: Path) -> None:
    refused = subprocess.run([sys.executable, "-m", "trajforge", "serve", "--host=0.0.0.0", "--port=0",
                              f"--base_url={server.url}", "--model=m", "--api_key=k"],
                             capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert refused.returncode == 2 and "not loopback: pass --token" in refused.stderr
    service = Service(server, tmp_path, "--max_body=4096", token="right-token")
    try:
        status, body = service.request("GET", "/status", token="wrong-token")
        assert status == 401, "a wrong token gets 401"
        assert service.request("GET", "/status")[0] == 200
        status, body = service.request("POST", "/groups", {"rows": [{"prompt": "x" * 5000}], "n": 1})
        assert status == 413
        status, body = service.request("POST", "/groups", {"rows": [{"prompt": "ok"}, {"prompt": ""}], "n": 2})
        assert status == 422 and body["error"] == "rows[1]: field 'prompt' is empty"
        status, body = service.request("POST", "/groups", {"rows": [{"prompt": "ok", "cwd": "/etc"}], "n": 2})
        assert status == 422 and "rows[0]: field 'cwd' would cover the system directory /etc" in body["error"]
        status, body = service.request("POST", "/groups", {"rows": [{"prompt": "ok"}], "n": 2, "model": "x"})
        assert status == 422 and "unknown field 'model'" in body["error"]
        status, body = service.request("POST", "/groups", {"tasks": ["/etc"], "n": 1})
        assert (status, body["error"]) == (422, "field 'tasks[0]': this service takes no task paths (start it with "
                                                "--tasks_root DIR)")
        assert service.request("GET", "/status")[1]["queued"] == 0  # no half-made group
        _, made = service.request("POST", "/groups", {"rows": [{"prompt": "hang"}, {"prompt": "say a"}], "n": 1})
        assert service.request("DELETE", f"/groups/{made['ids'][0]}") == (200, {"cancelled": made["ids"][0]})
        assert service.request("DELETE", "/groups/nosuchgroup")[0] == 404
        (group,) = service.take(1)
        assert group["id"] == made["ids"][1]
        shown = service.request("GET", "/status")[1]
        assert (shown["cancelled"], shown["finished_unacked"], shown["queued"]) == (1, 1, 0)
    finally:
        assert service.stop() == 0
    again = subprocess.run([sys.executable, "-m", "trajforge", "serve", "--port=0", f"--output_dir={tmp_path}",
                            "--run_name=svc", f"--base_url={server.url}", "--model=m", "--api_key=k"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert again.returncode == 2 and "pass --resume to go on with its groups, or --overwrite" in again.stderr
    fresh = Service(server, tmp_path, "--overwrite", token="right-token")
    try:
        _, made = fresh.request("POST", "/groups", {"rows": [{"prompt": "say b", "check": "true"}], "n": 2})
        (group,) = fresh.take(1)
        assert (group["id"], group["cursor"]) == (made["ids"][0], 1)  # the old service's groups are gone
    finally:
        assert fresh.stop() == 0
    assert (tmp_path / "svc" / "trajectories.jsonl").read_text().count("\n") == 2


def test_max_staleness_starts_no_rollout_that_would_mix_more_versions_into_its_group(tmp_path: Path) -> None:
    started = threading.Event()
    seen: list[str] = []

    def slow(req: Recorded) -> Reply:  # the first two rollouts are in flight when the policy changes
        seen.append(user_prompt(req.body))
        if len(seen) >= 2:
            started.set()
        return Reply(body=chat("done").body, delay=1.0) if not tool_messages(req.body) else policy(req)

    with ScriptedServer(slow) as server:
        service = Service(server, tmp_path, "--max_staleness=1", "--num_workers=2", "--policy_version=0",
                          "--keep_no_reasoning")
        try:
            _, made = service.request("POST", "/groups", {"rows": [{"prompt": "say a", "check": "true"}], "n": 4})
            assert started.wait(120)
            assert service.request("POST", "/policy", {"version": 1})[0] == 200
            (group,) = service.take(1)
            shown = service.request("GET", "/status")[1]
        finally:
            assert service.stop() == 0
    statuses = [(r["status"], r["failure"]) for r in group["rollouts"]]
    assert statuses == [("scored", None)] * 2 + [("masked", "stale")] * 2
    assert all(r["reward"] is None for r in group["rollouts"][2:])
    assert (shown["max_staleness"], shown["held_stale"]) == (1, 2)


def test_a_policy_change_with_restart_runs_the_rollouts_in_flight_again_under_the_new_version(tmp_path: Path) -> None:
    started = threading.Event()
    seen: list[str] = []

    def slow(req: Recorded) -> Reply:  # two calls of 4 s each: a rollout in flight outlives the 5 s grace
        seen.append(user_prompt(req.body))
        if len(seen) >= 2:
            started.set()
        return Reply(body=echo_policy(turns=1)(req).body, delay=4.0)

    with ScriptedServer(slow) as server:
        service = Service(server, tmp_path, "--num_workers=2", "--policy_version=0")
        try:
            service.request("POST", "/groups", {"rows": [{"prompt": "say a", "check": "true"}], "n": 2})
            assert started.wait(120)
            assert service.request("POST", "/policy", {"version": 1, "in_flight": "restart"})[0] == 200
            (group,) = service.take(1)
            bad = service.request("POST", "/policy", {"version": 2, "in_flight": "later"})
        finally:
            assert service.stop() == 0
    assert [(r["status"], r["policy_versions"]) for r in group["rollouts"]] == [("scored", [1, 1])] * 2
    assert bad[0] == 422 and "'continue' or 'restart'" in bad[1]["error"]


def prompted(prompt: str) -> Callable[[Recorded], bool]:
    return lambda req: req.path.endswith("/chat/completions") and user_prompt(req.body) == prompt


def test_a_delivered_or_cancelled_groups_rollouts_never_run_again_and_status_counts_warm_sandboxes(
        server: ScriptedServer, tmp_path: Path) -> None:
    service = Service(server, tmp_path)
    try:
        _, masked = service.request("POST", "/groups", {"rows": [{"prompt": "flaky", "check": "true"}], "n": 2})
        (group,) = service.take(1)
        assert [r["status"] for r in group["rollouts"]] == ["masked", "masked"]
        flaky_calls = sum(map(prompted("flaky"), server.requests))
        assert flaky_calls >= 2
        server.hold_until = 1 << 30  # every call waits for release(): the next pass is held in its first call
        _, held = service.request("POST", "/groups", {"rows": [{"prompt": "say held", "check": "true"}], "n": 1})
        assert server.wait_for(prompted("say held"))
        assert service.request("GET", "/status")[1]["sandboxes_warm"] >= 1  # its sandbox is up, its call held
        _, doomed = service.request("POST", "/groups", {"rows": [{"prompt": "say cancelled"}], "n": 2})
        assert service.request("DELETE", f"/groups/{doomed['ids'][0]}")[0] == 200
        server.release()
        (group,) = service.take(1, cursor=1)
        assert group["id"] == held["ids"][0]
        # a later pass resumes over the whole dataset: the masked group's and the cancelled one's rows too
        _, last = service.request("POST", "/groups", {"rows": [{"prompt": "say last", "check": "true"}], "n": 1})
        (group,) = service.take(1, cursor=2)
        assert group["id"] == last["ids"][0] and group["rollouts"][0]["status"] == "scored"
        assert service.request("GET", "/status")[1]["sandboxes_warm"] == 0  # every open rollout ended
    finally:
        assert service.stop() == 0
    assert sum(map(prompted("flaky"), server.requests)) == flaky_calls, "a delivered group's rollouts ran again"
    assert not any(map(prompted("say cancelled"), server.requests)), "a cancelled group's rollouts ran"


def chats(server: ScriptedServer) -> list[Recorded]:
    return [r for r in server.requests if r.path.endswith("/chat/completions")]


def test_a_policy_change_of_endpoint_and_model_reaches_the_new_server_from_the_next_rollout_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    second_key = "sk-second-SeCrEt-fedcba9876543210"
    monkeypatch.setenv("TRAJFORGE_TEST_SECOND_KEY", second_key)
    with pytest.raises(UsageError) as run_said:
        build_config({"dataset_file": "rows.jsonl", "base_url": "ftp://x"})
    with ScriptedServer(policy) as first, ScriptedServer(policy) as second:
        (tmp_path / "plain").mkdir()
        plain = Service(first, tmp_path / "plain", "--num_workers=1", "--policy_version=0")
        try:  # a service that takes requests from anyone local takes no endpoint or key variable from them
            said = [plain.request("POST", "/policy", {"version": 1, **fields})
                    for fields in ({"base_url": second.url}, {"api_key_env": "TRAJFORGE_TEST_SECOND_KEY"})]
            assert said == [(422, {"error": f"field '{name}': a service without --token takes no endpoint or key "
                                            "variable from a request (any local user could have its key sent to "
                                            "an address of theirs); start it with --token, or set --base_url "
                                            "where it starts"}) for name in ("base_url", "api_key_env")]
            refused = plain.request("POST", "/groups", {"rows": [{"prompt": "say a"}],
                                                        "policy": {"base_url": second.url}})
            assert refused[0] == 422 and refused[1]["error"].startswith("field 'policy.base_url': a service without")
            status, body = plain.request("POST", "/policy", {"version": 1, "model": "another-model"})
            assert (status, body["model"]) == (200, "another-model")  # the same endpoint and key: anyone may
            assert (plain.request("GET", "/status")[1]["queued"], len(chats(second))) == (0, 0)
        finally:
            assert plain.stop() == 0
        service = Service(first, tmp_path, "--num_workers=1", "--policy_version=0", token=TOKEN)
        try:
            status, body = service.request("POST", "/policy", {"version": 1, "base_url": "ftp://x"})
            assert (status, body["error"]) == (422, str(run_said.value).replace("--base_url", "field 'base_url'", 1))
            status, body = service.request("POST", "/policy", {"version": 1, "api_key_env": "TRAJFORGE_NO_SUCH_VAR"})
            assert status == 422 and "field 'api_key_env'" in body["error"]
            status, body = service.request("POST", "/policy", {"model": 7})
            assert status == 422 and body["error"].startswith("field 'model': invalid value 7")
            assert service.request("GET", "/status")[1]["policy_version"] == 0  # a refused change changes nothing
            first.hold_until = 1 << 30  # the first rollout's first call is held while the policy changes
            service.request("POST", "/groups", {"rows": [{"prompt": "say a", "check": "true"}], "n": 2})
            assert first.wait_for(prompted("say a"))
            status, body = service.request("POST", "/policy", {
                "version": 3, "base_url": second.url, "model": "second-model",
                "api_key_env": "TRAJFORGE_TEST_SECOND_KEY"})
            assert status == 200 and (body["policy_version"], body["model"]) == (3, "second-model")
            assert second_key not in json.dumps(body)
            first.release()
            (group,) = service.take(1)
        finally:
            service.kill()  # the endpoint is kept in the service's state: a resumed service goes on with it
        again = Service(first, tmp_path, "--resume", "--num_workers=1", token=TOKEN)
        try:
            again.request("POST", "/groups", {"rows": [{"prompt": "say b", "check": "true"}], "n": 1})
            (later,) = again.take(1, cursor=1)
        finally:
            assert again.stop() == 0
    # the rollout in flight finished on the old endpoint (its later call stamped with the new
    # version); the next rollout started on the new one, with its model and key
    assert [(r["status"], r["policy_versions"]) for r in group["rollouts"]] == [("scored", [0, 3]), ("scored", [3, 3])]
    assert later["rollouts"][0]["policy_versions"] == [3, 3]
    assert [user_prompt(r.body) for r in chats(first)] == ["say a"] * 2
    assert [user_prompt(r.body) for r in chats(second)] == ["say a"] * 2 + ["say b"] * 2
    assert {r.body["model"] for r in chats(first)} == {"scripted-model"}
    assert {r.body["model"] for r in chats(second)} == {"second-model"}
    assert {r.headers["Authorization"] for r in chats(second)} == {f"Bearer {second_key}"}


def test_groups_with_a_policy_of_their_own_run_in_their_own_lane_on_their_own_endpoint(
        server: ScriptedServer, tmp_path: Path) -> None:
    with ScriptedServer(policy) as first, ScriptedServer(policy) as second:
        policies = {"one": {"base_url": first.url, "model": "model-one", "sampling": {"temperature": 0.25,
                                                                                      "max_tokens": 77},
                            "limits": {"max_turns": 3, "timeout": 600}},
                    "two": {"base_url": second.url, "model": "model-two", "sampling": {"temperature": 0.75,
                                                                                       "top_p": 0.5}}}
        service = Service(server, tmp_path, token=TOKEN)
        try:
            refused = [service.request("POST", "/groups", {"rows": [{"prompt": "say x"}], "policy": bad})
                       for bad in ({"sampling": {"temperature": 5}}, {"limits": {"num_workers": 2}},
                                   {"base_url": "ftp://x"}, {"api_key_env": "TRAJFORGE_NO_SUCH_VAR"}, ["x"])]
            assert [status for status, _ in refused] == [422] * 5
            assert [body["error"] for _, body in refused[:4]] == [
                "field 'policy.sampling.temperature': invalid value 5: must be at most 2",
                "field 'policy.limits.num_workers' is unknown (known: max_turns, timeout, sample_wall_timeout, "
                "max_tokens_per_sample, max_cost_per_sample)",
                "field 'policy.base_url': invalid value 'ftp://x': not a valid URL: needs a scheme (http or https) "
                "and a host, e.g. http://127.0.0.1:8000/v1",
                "field 'policy.api_key_env': the service's environment has no variable 'TRAJFORGE_NO_SUCH_VAR' "
                "(set it where the service starts)"]
            shown = service.request("GET", "/status")[1]
            assert (shown["queued"], shown["lanes"]) == (0, 1)  # nothing was made of them
            made = {name: service.request("POST", "/groups", {"rows": [{"prompt": f"say {name}", "check": "true"}],
                                                             "n": 2, "policy": p})[1]["ids"][0]
                    for name, p in policies.items()}
            made["plain"] = service.request("POST", "/groups", {"rows": [{"prompt": "say plain", "check": "true"}],
                                                                "n": 1})[1]["ids"][0]
            groups = {g["id"]: g for g in service.take(3)}
            assert sorted(groups) == sorted(made.values())
            assert all(r["status"] == "scored" for g in groups.values() for r in g["rollouts"])
            first.hold_until = 1 << 30  # the next lane "one" rollout is held when the service is killed
            again_id = service.request("POST", "/groups", {"rows": [{"prompt": "say again", "check": "true"}],
                                                           "n": 1, "policy": policies["one"]})[1]["ids"][0]
            assert first.wait_for(prompted("say again"))
            assert service.request("GET", "/status")[1]["lanes"] == 3
        finally:
            service.kill()
        first.release()
        again = Service(server, tmp_path, "--resume", token=TOKEN)
        try:
            (group,) = again.take(1, cursor=3)  # the resumed service goes on with the lane's open group
        finally:
            assert again.stop() == 0
    assert group["id"] == again_id and group["rollouts"][0]["status"] == "scored"
    bodies = {name: [r.body for r in chats(s)] for name, s in (("one", first), ("two", second), ("plain", server))}
    assert {user_prompt(b) for b in bodies["one"]} == {"say one", "say again"}
    assert {user_prompt(b) for b in bodies["two"]} == {"say two"}
    assert {user_prompt(b) for b in bodies["plain"]} == {"say plain"}
    sent = {name: {(b["model"], b.get("temperature"), b.get("top_p"), b.get("max_tokens")) for b in found}
            for name, found in bodies.items()}
    assert sent == {"one": {("model-one", 0.25, None, 77)}, "two": {("model-two", 0.75, 0.5, None)},
                    "plain": {("scripted-model", None, None, None)}}
    lanes = sorted(p.name for p in (tmp_path / "svc" / "lanes").iterdir())
    assert len(lanes) == 2 and all((tmp_path / "svc" / "lanes" / lane / "trajectories.jsonl").exists()
                                   for lane in lanes)


def test_task_groups_run_the_tasks_under_tasks_root_and_no_other_path(
        tmp_path: Path, podman: Engine, task_base: str) -> None:  # noqa: F811 (fixtures)
    root = tmp_path / "tasks"
    prebuilt = f'[environment]\ndocker_image = "{task_base}"\n'  # no image of the test's own to leave behind
    write_task(root, "hello", toml=prebuilt, test_sh=REWARD_IF.format(cond="[ -f /app/out.txt ]"))
    outside = write_task(tmp_path, "outside", toml=prebuilt, test_sh="echo 1 > /logs/verifier/reward.txt\n")
    (root / "escape").symlink_to(outside)
    (write_task(root, "untestable", toml=prebuilt, test_sh="true\n") / "tests" / "test.sh").unlink()
    with ScriptedServer(scripted_agent({"hello": ["echo done > /app/out.txt"]})) as server:
        service = Service(server, tmp_path, f"--tasks_root={root}", "--sandbox=container", "--container_engine=podman")
        try:
            refused = {given: service.request("POST", "/groups", {"tasks": ["hello", given], "n": 1})
                       for given in ("../outside", "escape", str(outside), "untestable", "nosuch")}
            assert {given: status for given, (status, _) in refused.items()} == dict.fromkeys(refused, 422)
            assert {given: body["error"] for given, (_, body) in refused.items()} == {
                "../outside": "field 'tasks[1]': '../outside' must not hold '..'",
                "escape": "field 'tasks[1]': 'escape' is not inside --tasks_root once its links are resolved",
                str(outside): f"field 'tasks[1]': {str(outside)!r} is not inside --tasks_root once its links are "
                              "resolved",
                "untestable": "field 'tasks[1]': 'untestable': tests has no test.sh: the task cannot be verified",
                "nosuch": "field 'tasks[1]': 'nosuch' is not a task directory under --tasks_root"}
            assert service.request("GET", "/status")[1]["queued"] == 0  # the whole request or nothing
            status, made = service.request("POST", "/groups", {"tasks": [str(root / "hello")], "n": 2})
            assert status == 200
            (group,) = service.take(1)
        finally:
            assert service.stop() == 0
    assert (group["id"], group["row"]) == (made["ids"][0], {"task": "hello"})
    assert [(r["status"], r["reward"]) for r in group["rollouts"]] == [("scored", 1.0)] * 2
    assert {r["record"]["task"]["name"] for r in group["rollouts"]} == {"hello"}
