"""--tasks input without containers: loading Harbor-format task directories, their problems named by
path, identities, the flags' rules, reward files and the ATIF document (validated with `atif`)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import atif
import pytest

from tests.conftest import REPO, cli
from tests.support.tasks import EXAMPLES, write_task
from trajforge.agent.atif import document, messages_of
from trajforge.agent.loop import SessionResult, ToolResult, Turn
from trajforge.cli.run import parse_run_args
from trajforge.errors import DatasetError, UsageError
from trajforge.model.types import ToolCall, Usage
from trajforge.tasks.load import load_tasks
from trajforge.tasks.reward import parse_json, parse_txt, verification
from trajforge.task_spec import parse_size

OK_TEST = "echo 1 > /logs/verifier/reward.txt\n"


def test_the_examples_load_with_their_settings() -> None:
    ds = load_tasks(EXAMPLES)
    tasks = {s.task.name.removeprefix("trajforge/"): s for s in ds.samples if s.task is not None}
    assert sorted(tasks) == ["count-lines", "hello-world", "wrong-solution"]  # named org/name, as Harbor wants
    hello = tasks["hello-world"].task
    assert hello is not None
    assert (hello.agent_timeout, hello.verifier_timeout, hello.build_timeout) == (120, 60, 300)
    assert (hello.cpus, hello.memory, hello.storage, hello.allow_internet) == (1, 512 << 20, 1 << 30, False)
    assert hello.metadata == {"category": "files", "difficulty": "easy", "tags": ["example"]}
    assert tasks["hello-world"].prompt == (EXAMPLES / "hello-world" / "instruction.md").read_text()
    count = tasks["count-lines"].task
    assert count is not None and count.verifier_user == "tester" and count.verifier_env == (("EXPECTED_FILES", "3"),)
    assert count.memory == 512 << 20
    assert [s.line for s in ds.samples] == [1, 2, 3]  # their order in the directory, by name
    assert load_tasks(EXAMPLES / "hello-world").samples[0].identity == tasks["hello-world"].identity


def test_identity_follows_the_content_and_identical_contexts_share_a_hash(tmp_path: Path) -> None:
    a = write_task(tmp_path / "set", "a", test_sh=OK_TEST, nonce="same")
    write_task(tmp_path / "set", "b", test_sh=OK_TEST, nonce="same")
    write_task(tmp_path / "set", "c", test_sh=OK_TEST, nonce="other")
    ds = load_tasks(tmp_path / "set")
    specs = [s.task for s in ds.samples]
    assert specs[0].environment_hash == specs[1].environment_hash != specs[2].environment_hash  # type: ignore[union-attr]
    before = ds.samples[0].identity
    assert load_tasks(tmp_path / "set").samples[0].identity == before  # stable
    (a / "tests" / "test.sh").write_text(OK_TEST + "# edited\n")
    assert load_tasks(tmp_path / "set").samples[0].identity != before  # an edited task runs again on --resume
    with pytest.raises(DatasetError, match="no runnable task: all 3 are invalid") as err:  # no solve.sh anywhere
        load_tasks(tmp_path / "set", skip_invalid=True, with_solution=True)
    assert "a/solution: has no solve.sh, which --agent oracle runs" in str(err.value)


BAD = [
    ("no-instruction", lambda t: (t / "instruction.md").unlink(), "no-instruction: missing instruction.md"),
    ("no-toml", lambda t: (t / "task.toml").unlink(), "no-toml: missing task.toml"),
    ("bad-toml", lambda t: (t / "task.toml").write_text("[task\nname = 1"), "bad-toml/task.toml: invalid TOML"),
    ("no-dockerfile", lambda t: (t / "environment" / "Dockerfile").unlink(),
     "no-dockerfile/environment: has no Dockerfile, and task.toml names no [environment].docker_image"),
    ("no-tests", lambda t: (t / "tests" / "test.sh").unlink(), "no-tests/tests: has no test.sh"),
    ("bad-timeout", lambda t: (t / "task.toml").write_text('[agent]\ntimeout_sec = "soon"\n'),
     "bad-timeout/task.toml: [agent].timeout_sec must be a number above 0, got 'soon'"),
    ("bad-memory", lambda t: (t / "task.toml").write_text('[environment]\nmemory = "lots"\n'),
     "bad-memory/task.toml: [environment].memory must be a size such as \"2G\""),
    ("two-memories", lambda t: (t / "task.toml").write_text('[environment]\nmemory = "1G"\nmemory_mb = 512\n'),
     "two-memories/task.toml: [environment].memory (1G) and memory_mb (512) disagree"),
    ("steps", lambda t: (t / "task.toml").write_text('[[steps]]\nname = "one"\n'),
     "steps/task.toml: uses multi-step tasks ([[steps]]), which trajforge does not run"),
    ("compose", lambda t: (t / "environment" / "docker-compose.yaml").write_text("services: {}\n"),
     "compose/environment: holds a docker-compose file"),
    ("empty-instruction", lambda t: (t / "instruction.md").write_text(" \n"), "empty-instruction/instruction.md: is empty"),
]


def test_every_bad_task_is_named_with_its_path_and_problem(tmp_path: Path) -> None:
    root = tmp_path / "set"
    write_task(root, "good", test_sh=OK_TEST)
    for name, breakit, _ in BAD:
        breakit(write_task(root, name, test_sh=OK_TEST))
    with pytest.raises(DatasetError) as err:
        load_tasks(root)
    text = str(err.value)
    assert f"{root}: {len(BAD)} invalid task(s)" in text
    for _, _, message in BAD:
        assert f"{root}/{message}" in text, message
    skipped = load_tasks(root, skip_invalid=True)
    assert [s.task.name for s in skipped.samples] == ["good"] and len(skipped.skipped) == len(BAD)  # type: ignore[union-attr]


def test_a_prebuilt_image_needs_no_dockerfile(tmp_path: Path) -> None:
    task = write_task(tmp_path, "pre", test_sh=OK_TEST, toml='[environment]\ndocker_image = "localhost/x:1"\n')
    (task / "environment" / "Dockerfile").unlink()
    spec = load_tasks(task).samples[0].task
    assert spec is not None and spec.docker_image == "localhost/x:1" and spec.environment_hash is None


def test_paths_that_are_no_task_set(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such directory"):
        load_tasks(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(DatasetError, match="not a directory"):
        load_tasks(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="no task directories in it"):
        load_tasks(tmp_path / "empty")


def test_sizes() -> None:
    assert parse_size("2G") == 2 << 30 and parse_size("512M") == 512 << 20 and parse_size("1.5GiB") == 3 << 29
    assert parse_size("10GB") == 10 << 30 and parse_size("lots") is None and parse_size(3) is None


def test_flags_tasks_and_dataset_are_exclusive_and_the_run_is_named_after_the_tasks(tmp_path: Path) -> None:
    config, _ = parse_run_args(["--tasks", str(EXAMPLES)], "trajforge run", strict_required=False)
    assert config is not None and config.tasks == EXAMPLES and config.run_name == "tasks" and config.dataset_file is None
    config, _ = parse_run_args(["--tasks", str(EXAMPLES), "--agent", "oracle", "--pass_threshold", "0.5"],
                               "trajforge run", strict_required=False)
    assert config is not None and config.agent == "oracle" and config.pass_threshold == 0.5
    with pytest.raises(UsageError, match="--tasks and --dataset_file are exclusive"):
        parse_run_args(["--tasks", str(EXAMPLES), "--dataset_file", "d.jsonl"], "trajforge run", strict_required=False)
    with pytest.raises(UsageError, match="--agent oracle runs each task's solution/solve.sh: it needs --tasks"):
        parse_run_args(["--dataset_file", "d.jsonl", "--agent", "oracle"], "trajforge run", strict_required=False)
    with pytest.raises(UsageError, match="--agent"):
        parse_run_args(["--tasks", str(EXAMPLES), "--agent", "human"], "trajforge run", strict_required=False)


def test_a_bad_task_set_stops_the_run_before_it_writes_anything(tmp_path: Path, clean_env: dict[str, str]) -> None:
    root = tmp_path / "set"
    write_task(root, "good", test_sh=OK_TEST)
    (write_task(root, "broken", test_sh=OK_TEST) / "instruction.md").unlink()
    proc = subprocess.run(cli("run", "--tasks", str(root), "--agent", "oracle", "--run_name", "r"), cwd=tmp_path,
                          env=clean_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert f"{root}/broken: missing instruction.md" in proc.stderr
    assert f"{root}/good/solution: has no solve.sh, which --agent oracle runs" in proc.stderr
    assert not (tmp_path / "data").exists()
    proc = subprocess.run(cli("run", "--tasks", str(root), "--dataset_file", "x.jsonl"), cwd=tmp_path, env=clean_env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--tasks and --dataset_file are exclusive" in proc.stderr


def test_reward_files() -> None:
    r = parse_json(b'{"reward": 0.5, "accuracy": 0.75, "n": 4}')
    assert (r.reward, r.rewards, r.problem) == (0.5, {"reward": 0.5, "accuracy": 0.75, "n": 4.0}, None)
    assert parse_json(b'{"score": 0.25}').reward == 0.25  # one number: the main one
    assert "no main 'reward'" in (parse_json(b'{"a": 1, "b": 2}').problem or "")
    assert "not valid JSON" in (parse_json(b'{"reward": NaN}').problem or "")
    assert "not a finite number" in (parse_json(b'{"reward": "1"}').problem or "")
    assert "empty" in (parse_json(b"  ").problem or "") and "not valid JSON" in (parse_json(b"{").problem or "")
    assert parse_txt(b"0.75\n").reward == 0.75 and "not a finite number" in (parse_txt(b"inf").problem or "")
    assert "empty" in (parse_txt(b"\n").problem or "")
    ok = verification(parse_txt(b"0.9"), threshold=1.0, exit_code=0, timed_out=False, seconds=1, output="o")
    assert (ok["passed"], ok["reward"], ok["error"], ok["score"]) == (False, 0.9, None, 0.9)
    assert verification(parse_txt(b"0.9"), threshold=0.5, exit_code=1, timed_out=False, seconds=1,
                        output="")["passed"] is True  # a reward written counts, whatever the exit code
    # No reward: in default mode the agent had the tests' container, so it is a fail with reward 0 and
    # the kind named; in sealed mode it is the tests' own error, with no verdict (trajforge.failures).
    crashed = verification(None, threshold=1.0, exit_code=2, timed_out=False, seconds=1, output="boom")
    assert (crashed["passed"], crashed["error"], crashed["failure"], crashed["reward"], crashed["score"]) == \
        (False, None, "verifier_crashed", 0.0, 0.0)
    assert "scored 0: agent's doing in default mode" in crashed["detail"]["tests"]["message"]
    crashed = verification(None, threshold=1.0, exit_code=2, timed_out=False, seconds=1, output="boom", mode="sealed")
    assert (crashed["passed"], crashed["error"], crashed["reward"], "failure" in crashed) == \
        (None, "verifier_crashed", None, False)
    for mode, key in (("default", "failure"), ("sealed", "error")):
        assert verification(None, threshold=1.0, exit_code=0, timed_out=False, seconds=1, output="",
                             mode=mode)[key] == "reward_missing"
        assert verification(parse_txt(b"1"), threshold=1.0, exit_code=None, timed_out=True, seconds=9, output="",
                            mode=mode)[key] == "verifier_timeout"
        assert verification(parse_json(b'{"a": 1, "b": 2}'), threshold=1.0, exit_code=0, timed_out=False,
                            seconds=1, output="", mode=mode)[key] == "reward_invalid"
    long = verification(None, threshold=1, exit_code=0, timed_out=False, seconds=1, output="x" * 100_000)
    assert len(long["detail"]["tests"]["output"]) < 33_000


def test_atif_document_of_a_session_pairs_calls_and_observations() -> None:
    c1, c2 = ToolCall("call_a", "terminal", '{"command": "ls"}'), ToolCall("call_b", "read_file", "not json")
    turns = [Turn("", "Look first.", [c1, c2], [ToolResult(c1, '{"output": "x"}', False),
                                                 ToolResult(c2, "error: bad arguments", True)],
                  usage=Usage(prompt_tokens=10, completion_tokens=5, cost=0.001)),
             Turn("Done.", "All good.", [], usage=Usage(prompt_tokens=20, completion_tokens=2, reasoning_tokens=1))]
    session = SessionResult("do it", [{"type": "function", "function": {"name": "terminal", "parameters": {}}}], turns,
                            True, False, 2, Usage(prompt_tokens=30, completion_tokens=7, cost=0.001), "answer")
    messages, usage = messages_of(session)
    doc = document(messages, session.tools, session_id="s1", model="m", step_usage=usage,
                   total_usage=session.usage.as_dict(), extra={"task": "t"})
    parsed = atif.Trajectory.model_validate(doc)
    assert parsed.schema_version == "ATIF-v1.7" and [s.source for s in parsed.steps] == ["system", "user", "agent",
                                                                                         "agent"]
    first = parsed.steps[2]
    assert first.reasoning_content == "Look first." and [c.tool_call_id for c in first.tool_calls or []] == \
        ["call_a", "call_b"]
    assert [r.source_call_id for r in first.observation.results] == ["call_a", "call_b"]  # type: ignore[union-attr]
    assert first.tool_calls[1].arguments == {} and first.tool_calls[1].extra == {"raw_arguments": "not json"}  # type: ignore[index]
    assert first.metrics is not None and (first.metrics.prompt_tokens, first.metrics.cost_usd) == (10, 0.001)
    assert parsed.steps[3].metrics.extra == {"reasoning_tokens": 1}  # type: ignore[union-attr]
    assert parsed.final_metrics is not None and parsed.final_metrics.total_prompt_tokens == 30
    assert parsed.final_metrics.total_steps == 4
    json.dumps(doc)  # plain JSON


def test_examples_have_no_stray_directories() -> None:
    """The example set is what the README runs: every subdirectory is a task."""
    assert sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir()) == ["count-lines", "hello-world",
                                                                        "wrong-solution"]
    assert shutil.which("bash") is not None


def test_task_verification_failures_follow_who_could_cause_them() -> None:
    """The docs' copy of the table is tests/test_failures.py's to check."""
    from trajforge import failures

    assert failures.failure_class("verifier_crashed", "default").becomes == failures.REWARD_0
    assert failures.failure_class("verifier_crashed", "sealed").becomes == failures.ERROR
    assert failures.failure_class("build").becomes == failures.FAILED
    assert set(failures.verification_kinds("sealed")) >= set(failures.verification_kinds("default")) - {
        "container_stopped", "reset_failed"}


def test_the_build_key_reads_every_base_a_dockerfile_builds_from() -> None:
    from trajforge.tasks.build_key import base_images

    dockerfile = ("# syntax=docker/dockerfile:1\nARG BASE=debian:12\nARG TAG\nFROM --platform=linux/amd64 ${BASE} AS build\n"
                  "RUN make \\\n  all\nFROM build AS test\nfrom $BASE\nFROM scratch\nFROM python:${TAG:-3.11}-slim\n"
                  "ARG AFTER=x\nFROM busybox\n")
    assert base_images(dockerfile, {}) == ["debian:12", "python:3.11-slim", "busybox"]
    assert base_images(dockerfile, {"BASE": "ubuntu:24.04", "TAG": "3.12"}) == \
        ["ubuntu:24.04", "python:3.12-slim", "busybox"]


def test_the_tamper_report_keeps_what_tests_depend_on_outside_the_outputs() -> None:
    from trajforge.sandbox.interface import Change
    from trajforge.tasks.tamper import report, wanted

    changes = [Change(k, p) for k, p in [
        ("C", "/usr"), ("C", "/usr/bin"), ("C", "/usr/bin/python3"), ("A", "/usr/local/bin/pytest"),
        ("C", "/usr/lib/python3/dist-packages"), ("A", "/usr/lib/python3/dist-packages/zz.pth"),
        ("A", "/usr/lib/python3/dist-packages/newpkg"), ("A", "/usr/lib/python3/dist-packages/newpkg/x.py"),
        ("C", "/usr/lib/python3/dist-packages/pytest/__init__.py"), ("A", "/usr/lib/python3.11/json/evil.py"),
        ("A", "/conftest.py"), ("A", "/pytest.ini"), ("C", "/etc/ld.so.preload"), ("A", "/root/.bashrc"),
        ("A", "/usr/lib/x86_64-linux-gnu/libnew.so.1"), ("C", "/usr/lib/x86_64-linux-gnu/libc.so.6"),
        ("A", "/root/model/weights.bin"), ("C", "/etc/hostname"), ("A", "/var/log/x"), ("A", "/etc/env.sh"),
    ]]
    got = {(t["change"], t["path"]) for t in report(changes, ("/root/model",), extra=("/etc/env.sh",))}
    assert got == {("C", "/usr/bin/python3"), ("A", "/usr/local/bin/pytest"),
                   ("A", "/usr/lib/python3/dist-packages/zz.pth"),
                   ("C", "/usr/lib/python3/dist-packages/pytest/__init__.py"),
                   ("A", "/usr/lib/python3.11/json/evil.py"), ("A", "/conftest.py"), ("A", "/pytest.ini"),
                   ("C", "/etc/ld.so.preload"), ("A", "/root/.bashrc"), ("C", "/usr/lib/x86_64-linux-gnu/libc.so.6"),
                   ("A", "/etc/env.sh")}  # pip's new package, a new library, logs and outputs are not tampering
    accept = wanted(("/app",))
    assert accept("/usr/bin/bash") and not accept("/app/bin/bash") and not accept("/var/log/syslog")
