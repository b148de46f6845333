"""Outcome listeners (runner.listeners): one registered from a test module hears, of every sample
that ends, exactly what trajectories.jsonl gets: the same bytes, scrubbed of the run's secrets,
with the records the filters drop (a call to a tool that was not offered, --keep passed) left
out; across a resume, and with the samples run on Ray (the listeners are the driver's)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support.policies import echo_policy, tool_messages, user_prompt
from tests.support.scripted_server import Recorded, Reply, ScriptedServer, chat, http_error, tool_call
from trajforge import cli
from trajforge.registry import Spec
from trajforge.runner.listeners import OUTCOME_LISTENERS

KEY = "sk-listen-SeCrEt-0123456789abcdef"
LISTENED = Spec("listened", "tests.support.listened:make", "the test's collector")


@pytest.fixture
def listened(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(OUTCOME_LISTENERS, "listened", LISTENED)


def policy(broken: set[str]):  # type: ignore[no-untyped-def]
    """echo, except: `leak` answers with the key the request carried, `stray` calls a tool the
    terminal_only distribution does not offer, and a prompt in `broken` gets a 400 quoting the key."""
    echo = echo_policy(turns=1)

    def handle(req: Recorded) -> Reply:
        prompt, auth = user_prompt(req.body), req.headers.get("Authorization", "")
        if prompt in broken:
            return http_error(400, f"bad request with {auth}")
        if tool_messages(req.body):
            return echo(req)
        if prompt == "leak":
            return chat(f"the key is {auth}", reasoning="I will say it.")
        if prompt == "say stray":
            return chat(None, reasoning="r", tool_calls=[tool_call("web_search", {"query": "x"})])
        return echo(req)

    return handle


ROWS = [{"prompt": "say a", "check": "true"}, {"prompt": "say b", "check": "false"}, {"prompt": "leak", "check": "true"},
        {"prompt": "say stray", "check": "true"}, {"prompt": "flaky", "check": "true"}]


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def args(server: ScriptedServer, ds: Path, out: Path, *extra: str) -> list[str]:
    return [f"--dataset_file={ds}", f"--output_dir={out}", "--run_name=r", "--batch_size=2", f"--base_url={server.url}",
            "--model=scripted-model", "--distribution=terminal_only", "--sandbox=local", f"--api_key={KEY}",
            "--keep=passed", "--num_workers=2", *extra]


def heard(run: Path) -> tuple[list[bytes], list[bytes]]:
    """(the record lines the listener was given, the failure messages it wrote)."""
    lines = run.with_name(run.name + ".listened").read_bytes().splitlines(keepends=True)
    return [x for x in lines if not x.startswith(b"# ")], [x for x in lines if x.startswith(b"# ")]


def assert_heard_what_the_run_kept(run: Path) -> None:
    records, _ = heard(run)
    kept = (run / "trajectories.jsonl").read_bytes().splitlines(keepends=True)
    assert sorted(records) == sorted(kept)
    assert KEY.encode() not in run.with_name(run.name + ".listened").read_bytes()


def test_a_registered_listener_hears_what_trajectories_jsonl_gets_across_a_resume(
        tmp_path: Path, server: ScriptedServer, clean_env: dict[str, str], listened: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    broken = {"flaky"}
    server.handler = policy(broken)
    ds = write_rows(tmp_path / "ds.jsonl", ROWS)
    out = tmp_path / "data"
    run = out / "r"
    assert cli.main(["run", *args(server, ds, out)]) == 3, capsys.readouterr().err  # flaky failed
    records, messages = heard(run)
    prompts = sorted(json.loads(x)["conversations"][1]["value"] for x in records)
    assert prompts == ["leak", "say a"]  # say b did not pass, say stray called a tool it was not offered
    assert b"***" in next(x for x in records if b"the key is" in x)
    assert len(messages) == 1 and b"bad request with Bearer ***" in messages[0]
    assert_heard_what_the_run_kept(run)
    # the resume retries the failed sample and runs a row added since: the listener hears those
    broken.clear()
    write_rows(ds, [*ROWS, {"prompt": "say c", "check": "true"}])
    assert cli.main(["run", *args(server, ds, out, "--resume")]) == 0, capsys.readouterr().err
    records, messages = heard(run)
    assert sorted(json.loads(x)["conversations"][1]["value"] for x in records) == ["flaky", "leak", "say a", "say c"]
    assert len(messages) == 1
    assert_heard_what_the_run_kept(run)


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install trajforge[ray])")
def test_the_listener_hears_the_samples_ray_ran(tmp_path: Path, server: ScriptedServer,
                                                 clean_env: dict[str, str]) -> None:
    server.handler = policy(set())
    ds = write_rows(tmp_path / "ds.jsonl", ROWS)
    ray_tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: Ray's unix sockets have a path limit
    env = {**clean_env, "PYTHONPATH": f"{REPO / 'src'}:{REPO}", "RAY_AUTH_MODE": "disabled",
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": ray_tmp}
    script = ("import sys\nfrom trajforge.cli import main\nfrom trajforge.registry import Spec\n"
              "from trajforge.runner.listeners import OUTCOME_LISTENERS\n"
              f"OUTCOME_LISTENERS.register(Spec('listened', {LISTENED.target!r}))\n"
              "sys.exit(main(['run', *sys.argv[1:]]))\n")
    try:
        proc = subprocess.run([sys.executable, "-c", script, *args(server, ds, tmp_path / "data", "--executor=ray")],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "data" / "r"
    records, _ = heard(run)
    assert sorted(json.loads(x)["conversations"][1]["value"] for x in records) == ["flaky", "leak", "say a"]
    assert_heard_what_the_run_kept(run)
