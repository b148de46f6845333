"""What a new user meets when following the README (issue #21), each through the real CLI.

Nested working directories under every sandbox, a command that cannot even start in its
directory, the toolset guarantee, input rows carried into the records, exit codes, the sandbox
named at start, and a timed-out model request classified as `timeout`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import cli
from tests.support.images import busybox_image, podman  # noqa: F401 (fixtures)
from tests.support.policies import (
    echo_policy,
    prompt_command_policy,
    tool_messages,
    user_prompt,
)
from tests.support.scripted_server import (
    Recorded,
    Reply,
    ScriptedServer,
    chat,
    http_error,
    tool_call,
)
from tests.runner.test_e2e import run_cli, write_dataset
from tests.support.run_state import read_batch_records, read_records
from trajforge.sandbox.backends.bwrap.bwrap_backend import probe

SEARCH_KEYS = ("SEARXNG_URL", "BRAVE_API_KEY", "TAVILY_API_KEY")


def bwrap_skip_reason() -> str | None:
    status = asyncio.run(probe())
    return None if status.usable else f"bwrap is not usable here: {status.detail}"


def args_for(server: ScriptedServer, dataset: Path, *extra: str, run_name: str = "r") -> list[str]:
    return [f"--dataset_file={dataset}", "--batch_size=10", f"--run_name={run_name}", f"--base_url={server.url}",
            "--model=scripted-model", "--distribution=terminal_only", *extra]


def write_rows(path: Path, rows: list[dict[str, Any] | str]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def tool_results(record: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for turn in record["conversations"]:
        if turn["from"] == "tool":
            body = turn["value"].removeprefix("<tool_response>\n").removesuffix("\n</tool_response>")
            out.append(json.loads(body)["content"])
    return out


def run_dir(tmp_path: Path, name: str = "r") -> Path:
    return tmp_path / "data" / name


# ---- 1. nested cwd: the same under every backend; a command that cannot start is a failed call


CWD_COMMAND = "echo made > made.txt && cat made.txt && pwd"


def _nested_cwd_run(tmp_path: Path, server: ScriptedServer, env: dict[str, str], sandbox: str,
                    *extra: str) -> list[dict[str, Any]]:
    server.handler = prompt_command_policy
    ds = write_rows(tmp_path / "ds.jsonl", [{"prompt": CWD_COMMAND, "cwd": "/app/sub"},
                                            {"prompt": CWD_COMMAND + " ", "cwd": "rel/dir"}])
    proc = run_cli(tmp_path, env, *args_for(server, ds, f"--sandbox={sandbox}", *extra), timeout=300)
    assert proc.returncode == 0, proc.stderr
    return read_records(run_dir(tmp_path))


def _assert_ran_in(records: list[dict[str, Any]]) -> None:
    assert len(records) == 2
    for rec, where in zip(records, ("/app/sub", "/rel/dir")):
        (result,) = tool_results(rec)
        assert result["error"] is None and result["exit_code"] == 0, result
        lines = result["output"].splitlines()
        assert lines[0] == "made" and lines[1].endswith(where), result
        assert rec["tool_stats"]["terminal"] == {"count": 1, "success": 1, "failure": 0}


@pytest.mark.parametrize("sandbox", ["local", "bwrap"])
def test_nested_absolute_and_relative_cwd_work_under_every_backend(tmp_path: Path, server: ScriptedServer,
                                                                   clean_env: dict[str, str], sandbox: str) -> None:
    if sandbox == "bwrap" and (reason := bwrap_skip_reason()):
        pytest.skip(reason)
    _assert_ran_in(_nested_cwd_run(tmp_path, server, clean_env, sandbox))


def test_nested_cwd_works_in_a_container(tmp_path: Path, server: ScriptedServer, clean_env: dict[str, str],
                                         busybox_image: str) -> None:  # noqa: F811
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"container_image: {busybox_image}\ncontainer_engine: podman\n")
    _assert_ran_in(_nested_cwd_run(tmp_path, server, clean_env, "container", f"--config={cfg}"))


def test_a_command_that_cannot_enter_its_cwd_is_a_failed_call(tmp_path: Path, server: ScriptedServer,
                                                              clean_env: dict[str, str]) -> None:
    """The sample shuts itself out of its working directory (as the unprivileged sandbox user):
    the next command never runs, and that call counts as failed, not as a success with exit 125."""
    if reason := bwrap_skip_reason():
        pytest.skip(reason)
    if (asyncio.run(probe())).mode != "root":
        pytest.skip("needs the root-mode bwrap sandbox (the command runs as a uid of its own)")
    steps = ["chmod 000 .", "echo should-not-run"]

    def handle(req: Recorded) -> Reply:
        done = len(tool_messages(req.body))
        if done < len(steps):
            return chat(None, reasoning="step", tool_calls=[tool_call("terminal", {"command": steps[done]})])
        return chat("done", reasoning="finished")

    server.handler = handle
    ds = write_rows(tmp_path / "ds.jsonl", [{"prompt": "lock yourself out", "cwd": "/app/sub"}])
    proc = run_cli(tmp_path, clean_env, *args_for(server, ds, "--sandbox=bwrap"))
    assert proc.returncode == 0, proc.stderr
    (rec,) = read_records(run_dir(tmp_path))
    first, second = tool_results(rec)
    assert first["error"] is None and first["exit_code"] == 0
    assert "should-not-run" not in second["output"]
    assert second["error"] and "working directory" in second["error"], second
    assert rec["tool_stats"]["terminal"] == {"count": 2, "success": 1, "failure": 1}
    assert rec["tool_error_counts"]["terminal"] == 1


# ---- 1. toolsets: every sample gets at least one available toolset


def no_search_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in SEARCH_KEYS}


def test_every_sample_gets_an_available_toolset_when_the_top_one_is_missing(
        tmp_path: Path, server: ScriptedServer, clean_env: dict[str, str]) -> None:
    server.handler = echo_policy(turns=1)
    (tmp_path / "cfg.yaml").write_text("distributions:\n  webby: {toolsets: {web: 100, terminal: 1}}\n")
    ds = write_dataset(tmp_path / "ds.jsonl", [f"say w{i}" for i in range(8)])
    proc = run_cli(tmp_path, no_search_env(clean_env), *args_for(server, ds, "--sandbox=local", "--config=cfg.yaml",
                                                                  "--distribution=webby"))
    assert proc.returncode == 0, proc.stderr
    assert "toolset 'web' unavailable" in proc.stderr
    records = read_records(run_dir(tmp_path))
    assert len(records) == 8
    for rec in records:
        assert rec["toolsets_used"] == ["terminal"]
        assert '"terminal"' in rec["conversations"][0]["value"]
    offered = [[t["function"]["name"] for t in body.get("tools", [])] for body in server.chat_requests()]
    assert all(names == ["terminal", "process"] for names in offered), offered


def test_a_distribution_with_no_available_toolset_is_refused(tmp_path: Path, server: ScriptedServer,
                                                             clean_env: dict[str, str]) -> None:
    server.handler = echo_policy(turns=1)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a"])
    proc = run_cli(tmp_path, no_search_env(clean_env), *args_for(server, ds, "--sandbox=local",
                                                                  "--distribution=minimal"))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "--distribution minimal: none of its toolsets can be offered here (web: " in proc.stderr
    assert server.chat_requests() == []
    # Refused before anything was recorded: the same run name starts afresh, without --resume.
    assert not (run_dir(tmp_path) / "checkpoint.json").exists()
    proc = run_cli(tmp_path, no_search_env(clean_env), *args_for(server, ds, "--sandbox=local"))
    assert proc.returncode == 0, proc.stderr


# ---- 2. input rows survive into the records


def test_records_keep_the_row_fields_and_the_file_line(tmp_path: Path, server: ScriptedServer,
                                                       clean_env: dict[str, str]) -> None:
    server.handler = echo_policy(turns=1)
    ds = write_rows(tmp_path / "ds.jsonl", [
        {"prompt": "say a", "id": "row-a", "meta": {"source": "x", "n": 1}},
        "",
        "not json",
        {"prompt": "say b", "id": "row-b", "task_type": "t"},
        {"prompt": "say c"},
    ])
    args = args_for(server, ds, "--sandbox=local", "--skip_invalid")
    proc = run_cli(tmp_path, clean_env, *args)
    assert proc.returncode == 0, proc.stderr
    recs = read_records(run_dir(tmp_path))
    assert [(r["prompt_index"], r["dataset_line"], r["row"]) for r in recs] == [
        (0, 1, {"id": "row-a", "meta": {"source": "x", "n": 1}}), (1, 4, {"id": "row-b"}), (2, 5, {})]
    batch = read_batch_records(run_dir(tmp_path))  # one batch file: 3 rows, --batch_size=10
    assert {r["dataset_line"] for r in batch} == {1, 4, 5}

    # The same rows reordered, one extra field edited: the resumed merge says where each row is now.
    write_rows(ds, [{"prompt": "say c"}, {"prompt": "say b", "id": "row-b2", "task_type": "t"},
                    {"prompt": "say a", "id": "row-a", "meta": {"source": "x", "n": 1}}])
    before = len(server.requests)
    proc = run_cli(tmp_path, clean_env, *args, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert len(server.requests) == before  # nothing re-ran: identity ignores extra fields
    recs = read_records(run_dir(tmp_path))
    assert [(user_prompt_of(r), r["prompt_index"], r["dataset_line"], r["row"].get("id")) for r in recs] == [
        ("say c", 0, 1, None), ("say b", 1, 2, "row-b2"), ("say a", 2, 3, "row-a")]


def user_prompt_of(rec: dict[str, Any]) -> str:
    return next(t["value"] for t in rec["conversations"] if t["from"] == "human")


# ---- 3. exit codes


def failing_policy(bad_word: str = "bad") -> Any:
    ok = echo_policy(turns=1)

    def handle(req: Recorded) -> Reply:
        if bad_word in user_prompt(req.body):
            return http_error(400, "scripted failure")  # not retried by the client: the attempt fails
        return ok(req)

    return handle


@pytest.mark.parametrize(("tolerance", "code"), [(None, 3), ("2", 0), ("0.5", 0), ("0.25", 3), ("1", 3)])
def test_failed_samples_give_exit_code_3_unless_tolerated(tmp_path: Path, server: ScriptedServer,
                                                          clean_env: dict[str, str], tolerance: str | None,
                                                          code: int) -> None:
    server.handler = failing_policy()
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a", "say bad", "say c", "say d"])
    extra = [f"--fail_on_error={tolerance}"] if tolerance else []
    proc = run_cli(tmp_path, clean_env, *args_for(server, ds, "--sandbox=local", *extra))
    assert proc.returncode == code, proc.stderr
    stats = json.loads((run_dir(tmp_path) / "statistics.json").read_text())
    assert stats["run"]["samples"]["failed"] == 1 and stats["run"]["samples"]["finished"] == 3
    if code == 3:
        assert "1 of 4 sample(s) failed (api_error 1)" in proc.stderr and "checkpoint.json" in proc.stderr
    ckpt = json.loads((run_dir(tmp_path) / "checkpoint.json").read_text())
    (failed,) = [v for v in ckpt["samples"].values() if v["status"] == "failed"]
    assert failed["reason"] == "api_error" and "scripted failure" in failed["message"]


def test_every_sample_failing_is_never_tolerated_and_a_resume_that_fixes_it_exits_0(
        tmp_path: Path, server: ScriptedServer, clean_env: dict[str, str]) -> None:
    server.handler = failing_policy("say")
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a", "say b"])
    args = args_for(server, ds, "--sandbox=local", "--fail_on_error=100")
    proc = run_cli(tmp_path, clean_env, *args)
    assert proc.returncode == 3, proc.stderr
    assert "2 of 2 sample(s) failed" in proc.stderr
    server.handler = echo_policy(turns=1)
    proc = run_cli(tmp_path, clean_env, *args, "--resume")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("value", ["1.5", "0", "-1", "x"])
def test_a_bad_tolerance_is_a_usage_error(tmp_path: Path, clean_env: dict[str, str], value: str) -> None:
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a"])
    proc = subprocess.run(cli("run", f"--dataset_file={ds}", f"--fail_on_error={value}"), cwd=tmp_path,
                          env=clean_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "error: --fail_on_error: invalid value " in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) == 1
    assert not (tmp_path / "data").exists()


def test_a_rejected_key_is_run_fatal_exit_1(tmp_path: Path, server: ScriptedServer, clean_env: dict[str, str]) -> None:
    server.handler = lambda req: http_error(401, "bad key")
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a"])
    proc = run_cli(tmp_path, clean_env, *args_for(server, ds, "--sandbox=local"))
    assert proc.returncode == 1, proc.stderr
    assert "refused the API key" in proc.stderr and "Traceback" not in proc.stderr


def test_container_sandbox_without_any_image_is_refused_at_start(tmp_path: Path, server: ScriptedServer,
                                                                 clean_env: dict[str, str]) -> None:
    ds = write_rows(tmp_path / "ds.jsonl", [{"prompt": "say a", "image": "busybox"}, {"prompt": "say b"}])
    proc = run_cli(tmp_path, clean_env, *args_for(server, ds, "--sandbox=container"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        f"error: --sandbox container: 1 row(s) have no `image` (first: {ds}:2) and the config sets no "
        "`container_image`; give each row an image or set `container_image: IMAGE` in the --config file")
    assert not (tmp_path / "data").exists() and server.requests == []


# ---- 5. a timed-out model request is a `timeout` failure


def test_a_model_request_that_times_out_is_a_timeout_failure(tmp_path: Path, server: ScriptedServer,
                                                             clean_env: dict[str, str]) -> None:
    server.handler = lambda req: chat("late", reasoning="r", delay=3)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a"])
    proc = run_cli(tmp_path, clean_env, *args_for(server, ds, "--sandbox=local", "--request_timeout=0.5",
                                                  "--max_retries=0"))
    assert proc.returncode == 3, proc.stderr
    by_class = json.loads((run_dir(tmp_path) / "statistics.json").read_text())["run"]["samples"]["failed_by_class"]
    assert by_class["timeout"] == 1 and by_class["api_error"] == 0
    (entry,) = json.loads((run_dir(tmp_path) / "checkpoint.json").read_text())["samples"].values()
    assert entry["reason"] == "timeout" and "timed out after 0.5s" in entry["message"]


# ---- 6 / #13.7: the sandbox in use is named at start, in config.json and in statistics.json


def test_auto_sandbox_is_named_and_recorded_resolved(tmp_path: Path, server: ScriptedServer,
                                                     clean_env: dict[str, str]) -> None:
    if reason := bwrap_skip_reason():
        pytest.skip(reason)
    server.handler = echo_policy(turns=1)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a"])
    proc = run_cli(tmp_path, clean_env, *args_for(server, ds))
    assert proc.returncode == 0, proc.stderr
    assert "1 to run, sandbox bwrap -> " in proc.stderr
    assert json.loads((run_dir(tmp_path) / "config.json").read_text())["sandbox"] == "bwrap"
    assert json.loads((run_dir(tmp_path) / "statistics.json").read_text())["sandbox"] == "bwrap"


def test_auto_falling_back_to_local_says_why_and_how_to_get_isolation(tmp_path: Path, server: ScriptedServer,
                                                                      clean_env: dict[str, str]) -> None:
    """A machine where bwrap does not work: in a private mount namespace, /bin/false stands in for it."""
    bwrap = shutil.which("bwrap")
    if bwrap is None or shutil.which("unshare") is None:
        pytest.skip("needs bwrap and unshare (util-linux) to simulate a broken bwrap")
    probe_ns = subprocess.run(["unshare", "--mount", "true"], capture_output=True)
    if probe_ns.returncode != 0:
        pytest.skip("cannot create a mount namespace here")
    server.handler = echo_policy(turns=1)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a"])
    argv = cli("run", *args_for(server, ds))
    script = f'mount --bind /bin/false {bwrap} && exec "$@"'
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv],
                          cwd=tmp_path, env=clean_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "1 to run, sandbox local -> " in proc.stderr
    assert "bwrap is not usable here" in proc.stderr and "WITHOUT isolation" in proc.stderr
    assert "trajforge doctor" in proc.stderr
    assert json.loads((run_dir(tmp_path) / "config.json").read_text())["sandbox"] == "local"
    assert json.loads((run_dir(tmp_path) / "statistics.json").read_text())["sandbox"] == "local"


# ---- 4. the container tests clean up what they start: no conmon outlives its container


def conmons_of(name: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_bytes().strip() != b"conmon":
                continue
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a == b"-n" and b == name.encode() for a, b in zip(args, args[1:])):
            pids.append(int(entry.name))
    return pids


def test_killed_commands_leave_no_conmon_behind(tmp_path: Path, busybox_image: str) -> None:  # noqa: F811
    """A timed-out and a cancelled `podman exec` used to leave their session's conmon waiting
    300 s (Podman's exit_command_delay) after the container was gone."""
    from tests.support.sandboxes import create_sandbox
    from trajforge.config import RunConfig

    async def body() -> str:
        cfg = RunConfig(container_engine="podman", run_name="conmon-test")
        sb = await create_sandbox(cfg, cwd=None, image=busybox_image, root=tmp_path)
        name = sb.name
        assert name is not None
        try:
            assert (await sb.exec("sleep 30", timeout=1)).timed_out
            task = asyncio.create_task(sb.exec("sleep 31", timeout=60))
            await asyncio.sleep(1.0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            job = await sb.spawn("sleep 32")
            await asyncio.sleep(1.0)
            await job.kill()
            assert conmons_of(name), "the killed sessions' monitors exist while the container does"
        finally:
            await sb.close()
        return name

    name = asyncio.run(body())
    assert conmons_of(name) == []


# ---- 6. the compressor falls back to the local model without a key, like `trajforge run`


def test_compressor_without_a_key_summarises_with_the_local_model(tmp_path: Path, clean_env: dict[str, str]) -> None:
    from tests.support.compress_data import trajectory, write_jsonl

    src = write_jsonl(tmp_path / "in.jsonl", [trajectory(0, steps=6, response_words=40)])
    cfg = tmp_path / "c.yaml"
    cfg.write_text("compression: {summary_target_tokens: 16}\nprotected_turns: {last_n_turns: 2}\n"
                   "summarization: {max_retries: 0}\n")
    env = no_search_env(clean_env)
    proc = subprocess.run(cli("compress", f"--input={src}", "--target_max_tokens=500", f"--config={cfg}"),
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "no API key and no --base_url: summaries come from the bundled local model (--model local)" in proc.stderr
    metrics = json.loads((tmp_path / "in_compressed_metrics.json").read_text())
    assert "no API key" not in json.dumps(metrics)  # the remote summariser was never tried
    assert '"local"' in json.dumps(metrics), metrics  # the summariser model it used
    # A model the user names is never replaced: no key for it is that model's problem, said as such.
    proc = subprocess.run(cli("compress", f"--input={src}", "--target_max_tokens=500", f"--config={cfg}",
                              "--model=openai/gpt-5-mini", "--output=named.jsonl"),
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert "bundled local model" not in proc.stderr
    assert "summariser: no API key" in proc.stderr or "no API key" in proc.stderr, proc.stderr
