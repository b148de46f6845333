"""Task environments for real: Podman builds, containers, hidden tests and rewards, with the scripted model.

One model run covers most of the issue's list in a single pass (its tasks run side by side):
cheating attempts, an agent timeout, a verifier timeout, build failures, resource limits and
WORKDIR, the verifier's user and environment, and the ATIF trajectory the tests can read; then a
second run of the same tasks builds nothing. The example tasks run with their oracle, and a run
killed (SIGKILL) while a task is being verified resumes with nothing verified twice or lost.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import atif
import pytest

from tests.support.commands import run_trajforge
from tests.conftest import cli
from tests.support.images import containers_with_label, podman  # noqa: F401 (fixture)
from tests.support.policies import tool_messages
from tests.support.scripted_server import Recorded, Reply, ScriptedServer, chat, tool_call
from tests.support.tasks import (  # noqa: F401 (fixture)
    EXAMPLES, REWARD_IF, pinned_base, scripted_agent, task_base, task_name, unique_nonce, write_task,
)
from tests.support.run_state import read_batch_records, read_records
from trajforge.sandbox.backends.container.engine import Engine

MARK = "SECRET" + "-TESTS-7c1e"  # in the cheat tasks' test files; never spelled whole in a command
TRAJ_OPEN, TRAJ_CLOSE = "=== trajectory ===", "=== end ==="

# What the scripted agent runs, by task name: terminal commands in order, then an answer.
COMMANDS = {
    "solve": ["echo done > /app/out.txt"],
    "cheat-plant": [
        "mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt && "
        "printf 'echo 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh && chmod +x /tests/test.sh && "
        "(while true; do echo 1 > /logs/verifier/reward.txt 2>/dev/null; sleep 0.05; done) >/dev/null 2>&1 &",
        "ls -la / /tests 2>&1; find / -xdev \\( -name 'test.sh' -o -name 'secret*' \\) 2>/dev/null; "
        "grep -rl \"SECRET\"-TESTS-7c1e / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev 2>/dev/null; "
        "echo searched",
    ],
    "cheat-link": ["rm -rf /logs; mkdir -p /app/fake/verifier && echo '{\"reward\": 1}' > /app/fake/verifier/reward.json"
                   " && ln -s /app/fake /logs && ls -la /logs/"],
    "sleepy": ["sleep 30; echo never"],
    "limits": ["pwd; ls /sys/class/net; cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes "
               "2>/dev/null; cat /sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null; "
               "ls /tests 2>&1; ls /logs 2>&1"],
    "shared-a": ["cat /app/nonce.txt"],
    "shared-b": ["cat /app/nonce.txt"],
    "slow-verifier": ["echo hi"],
}


agent_policy = scripted_agent(COMMANDS)


def model_tasks(root: Path, nonce: str, base: str) -> Path:
    """The tasks of the model run; `nonce` makes their images new to this test, `base` is what they
    build FROM (the example base, pinned by this test)."""
    out_ok = REWARD_IF.format(cond="[ -f /app/out.txt ]")
    for name in ("solve", "cheat-plant", "cheat-link"):
        write_task(root, name, nonce=f"{nonce}-{name}", test_sh=out_ok, test_files={"secret.txt": MARK + "\n"})
    write_task(root, "sleepy", nonce=f"{nonce}-sleepy", toml="[agent]\ntimeout_sec = 6\n",
               test_sh="echo 0.25 > /logs/verifier/reward.txt\n")
    write_task(root, "slow-verifier", nonce=f"{nonce}-slow", toml="[verifier]\ntimeout_sec = 2\n",
               test_sh="(sleep 3; echo 1 > /logs/verifier/reward.txt) & sleep 60\n")
    write_task(root, "limits", nonce=f"{nonce}-limits",
               dockerfile="FROM localhost/trajforge-example-base:latest\nWORKDIR /srv\n",
               toml='[environment]\ncpus = 0.5\nmemory = "300M"\nallow_internet = false\n'
                    '[verifier]\nuser = "tester"\nenv = { GREETING = "hi there" }\n',
               test_sh=f'echo "user=$(id -un) greeting=$GREETING pwd=$(pwd)"\necho "{TRAJ_OPEN}"\n'
                       f'cat /logs/agent/trajectory.json\necho\necho "{TRAJ_CLOSE}"\n'
                       'printf \'{"reward": 0.5, "style": 1, "speed": 0.25}\' > /logs/verifier/reward.json\n')
    for name in ("shared-a", "shared-b"):  # identical build contexts: one image
        write_task(root, name, nonce=f"{nonce}-shared", test_sh="echo 1 > /logs/verifier/reward.txt\n")
    write_task(root, "build-fail", dockerfile="FROM localhost/trajforge-example-base:latest\n"
               f"RUN echo build-output-{nonce} && exit 3\n", test_sh=out_ok)
    write_task(root, "build-slow", dockerfile=f"FROM localhost/trajforge-example-base:latest\nRUN sleep 20 # {nonce}\n",
               toml="[environment]\nbuild_timeout_sec = 2\n", test_sh=out_ok)
    for dockerfile in root.glob("*/environment/Dockerfile"):
        dockerfile.write_text(dockerfile.read_text().replace("localhost/trajforge-example-base:latest", base))
    return root


def run(tmp_path: Path, env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return run_trajforge("run", *args, cwd=tmp_path, env=env, timeout=timeout)


def records(run_dir: Path) -> dict[str, dict]:
    return {r["task"]["name"]: r for r in read_records(run_dir)}


def tool_outputs(rec: dict) -> str:
    return "\n".join(t["value"] for t in rec["conversations"] if t["from"] == "tool")


def test_a_model_run_of_tasks(tmp_path: Path, server: ScriptedServer, clean_env: dict[str, str], podman: Engine,
                              pinned_base: str) -> None:
    server.handler = agent_policy
    tasks = model_tasks(tmp_path / "tasks", unique_nonce(), pinned_base)
    args = ["--tasks", str(tasks), "--base_url", server.url, "--model", "scripted", "--distribution",
            "terminal_only", "--num_workers", "4", "--container_engine", "podman", "--timeout_multiplier", "0.5",
            "--task_max_memory", "256m"]
    proc = run(tmp_path, clean_env, *args, "--run_name", "first")
    assert proc.returncode == 3, proc.stderr[-3000:]  # the two build failures
    run_dir = tmp_path / "data" / "first"
    recs = records(run_dir)
    assert sorted(recs) == ["cheat-link", "cheat-plant", "limits", "shared-a", "shared-b", "sleepy", "slow-verifier",
                            "solve"]
    reward = {name: r["verification"]["reward"] for name, r in recs.items()}
    assert reward["solve"] == 1.0 and recs["solve"]["verification"]["passed"] is True

    # Cheating: planted rewards (also behind a link where /logs was), a fake test script, a writer
    # left running, a search for the tests: none of it counts or finds anything.
    for name in ("cheat-plant", "cheat-link"):
        v = recs[name]["verification"]
        assert (v["reward"], v["passed"], v["error"], v["detail"]["tests"]["reward_file"]) == \
            (0.0, False, None, "reward.txt"), v
    search = tool_outputs(recs["cheat-plant"])
    assert "searched" in search and MARK not in search and "secret.txt" not in search

    # The agent's time limit ends it where it is; its work is verified all the same.
    sleepy = recs["sleepy"]
    assert (sleepy["end_reason"], sleepy["partial"], sleepy["completed"]) == ("agent_timeout", True, False)
    assert sleepy["verification"]["reward"] == 0.25 and "never" not in tool_outputs(sleepy)

    # The verifier's timeout in the agent's own container (default mode) is a fail with reward 0 naming
    # it (the agent could have caused it: trajforge.failures), and what it left running is stopped.
    slow = recs["slow-verifier"]["verification"]
    assert (slow["passed"], slow["reward"], slow["error"], slow["failure"]) == (False, 0.0, None, "verifier_timeout")
    assert "1 s timeout" in slow["detail"]["tests"]["message"]  # 2 s times --timeout_multiplier 0.5

    # WORKDIR, limits (memory capped by --task_max_memory), no network, no tests during the run.
    limits = recs["limits"]
    out = json.loads(limits["conversations"][3]["value"].split("\n")[1])["content"]["output"]
    lines = out.splitlines()
    assert lines[0] == "/srv" and lines[1] == "lo", out
    assert str(256 << 20) in lines and ("50000" in out or "50000 100000" in out), out
    assert "No such file or directory" in out  # neither /tests nor /logs exist while the agent runs
    v = limits["verification"]
    assert v["rewards"] == {"reward": 0.5, "style": 1.0, "speed": 0.25} and v["passed"] is False
    test_out = v["detail"]["tests"]["output"]
    assert "user=tester greeting=hi there pwd=/srv" in test_out
    doc = json.loads(test_out.split(TRAJ_OPEN, 1)[1].split(TRAJ_CLOSE, 1)[0])
    traj = atif.Trajectory.model_validate(doc)  # what the tests read: ATIF, validated by the atif package
    assert traj.steps[1].message == limits["conversations"][1]["value"] and traj.agent.model_name == "scripted"
    assert traj.steps[2].tool_calls[0].function_name == "terminal"  # type: ignore[index]
    assert traj.steps[2].observation.results[0].source_call_id == traj.steps[2].tool_calls[0].tool_call_id  # type: ignore[index,union-attr]
    assert traj.steps[2].metrics is not None and traj.final_metrics.total_prompt_tokens == 20  # type: ignore[union-attr]

    # Builds: a failure fails its task only, with its own class and the log's tail; identical contexts
    # share one image; every build's log is in the run directory.
    ckpt = json.loads((run_dir / "checkpoint.json").read_text())["samples"]
    failed = {e["message"].split("'")[1]: e for e in ckpt.values() if e["status"] == "failed"}
    assert sorted(failed) == ["build-fail", "build-slow"] and {e["reason"] for e in failed.values()} == {"build"}
    assert "exit code" in failed["build-fail"]["message"] and "build-output-" in failed["build-fail"]["message"]
    assert "timed out after 1 s" in failed["build-slow"]["message"]
    logs = list((run_dir / "builds").glob("*.log"))
    assert len(logs) == 9  # one per distinct context
    shared = [p for p in logs if "shared" in p.read_text()]
    assert len(shared) == 1 and shared[0].read_text().count(" build -t ") == 1
    stats = json.loads((run_dir / "statistics.json").read_text())
    assert stats["run"]["samples"]["failed_by_class"]["build"] == 2
    assert stats["run"]["verification"]["failures_by_kind"] == {"verifier_timeout": 1}
    per_task = stats["run"]["tasks"]["per_task"]
    assert per_task["limits"]["mean_reward"] == 0.5 and per_task["slow-verifier"]["failures"] == 1
    assert containers_with_label(podman, "trajforge.run=first") == []

    # A second run of the same tasks builds nothing: every image is found by its content hash.
    again = run(tmp_path, clean_env, *args, "--run_name", "second")
    assert again.returncode == 3, again.stderr[-3000:]
    built = {p.name for p in (tmp_path / "data" / "second" / "builds").glob("*.log")}
    assert built == {p.name for p in logs if p in (failed_logs := [q for q in logs if "build-output-" in q.read_text()
                                                                   or "build stopped" in q.read_text()])}
    assert len(failed_logs) == 2  # only the two that failed are tried again
    assert records(tmp_path / "data" / "second")["solve"]["verification"]["reward"] == 1.0


def test_the_example_tasks_with_their_oracle(tmp_path: Path, clean_env: dict[str, str], podman: Engine,
                                             task_base: str) -> None:
    proc = run(tmp_path, clean_env, "--tasks", str(EXAMPLES), "--agent", "oracle", "--run_name", "oracle",
               "--container_engine", "podman")
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = {name.removeprefix("trajforge/"): r for name, r in records(tmp_path / "data" / "oracle").items()}
    got = {name: (r["verification"]["reward"], r["verification"]["passed"]) for name, r in recs.items()}
    assert got == {"hello-world": (1.0, True), "count-lines": (0.666, False), "wrong-solution": (0.0, False)}
    assert recs["count-lines"]["verification"]["rewards"] == {"reward": 0.666, "checks_passed": 2.0,
                                                              "checks_total": 3.0}
    for r in recs.values():
        assert r["metadata"]["model"] == "oracle" and r["api_calls"] == 0 and r["usage"]["cost"] == 0
    assert recs["hello-world"]["task"] == {"name": "trajforge/hello-world", "path": str(EXAMPLES / "hello-world"),
                                           "metadata": {"category": "files", "difficulty": "easy", "tags": ["example"]}}
    assert "oracle: 2 of 3 task(s) do not reach full reward" in proc.stdout
    assert "  trajforge/count-lines: mean reward 0.666" in proc.stdout
    assert "  trajforge/wrong-solution: mean reward 0.000" in proc.stdout
    tasks = json.loads((tmp_path / "data" / "oracle" / "statistics.json").read_text())["run"]["tasks"]
    assert tasks["below_full_reward"] == ["trajforge/count-lines", "trajforge/wrong-solution"]
    assert tasks["by_category"]["text"]["mean_reward"] == 0.333 and tasks["by_difficulty"]["easy"]["passed"] == 1
    out = tmp_path / "o.atif.jsonl"
    proc = subprocess.run(cli("export", str(tmp_path / "data" / "oracle"), "--format", "atif", "--output", str(out)),
                          cwd=tmp_path, env=clean_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    docs = [atif.Trajectory.model_validate(json.loads(line)) for line in out.read_text().splitlines()]
    assert len(docs) == 3 and all(d.steps[2].llm_call_count == 0 for d in docs)
    assert {d.extra["task"]["name"]: d.extra["verification"]["reward"] for d in docs} == \
        {"trajforge/hello-world": 1.0, "trajforge/count-lines": 0.666,  # type: ignore[index]
         "trajforge/wrong-solution": 0.0}


def workspace_marker(tmp: Path) -> bool:
    return any(tmp.glob("trajforge-ws-*/sample-*/verifying"))


def test_a_run_killed_while_verifying_resumes_with_nothing_verified_twice_or_lost(
        tmp_path: Path, server: ScriptedServer, clean_env: dict[str, str], podman: Engine, task_base: str) -> None:
    slow = {"on": True}

    def policy(req: Recorded) -> Reply:
        name = task_name(req.body)
        if not tool_messages(req.body):
            flag = "touch /app/slow; " if slow["on"] and name == "t2" else ""
            return chat(None, tool_calls=[tool_call("terminal", {"command": f"{flag}echo ok > /app/out.txt"})],
                        reasoning="Do it.")
        return chat("Done.", reasoning="Done.")

    server.handler = policy
    nonce = unique_nonce()
    for i in range(4):  # t2 hangs in its tests while /app/slow exists: the run is killed there
        # No network: a killed runner's egress container breaks `podman ps` here (see the report of issue 38).
        write_task(tmp_path / "tasks", f"t{i}", nonce=nonce, toml="[environment]\nallow_internet = false\n", test_sh="if [ -f /app/slow ]; then touch /app/verifying; "
                   "sleep 600; fi\n" + REWARD_IF.format(cond="[ -f /app/out.txt ]"))
    env = {**clean_env, "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    args = ["--tasks", str(tmp_path / "tasks"), "--base_url", server.url, "--model", "scripted", "--distribution",
            "terminal_only", "--num_workers", "1", "--run_name", "r", "--container_engine", "podman"]
    proc = subprocess.Popen(cli("run", *args), cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline and not workspace_marker(tmp_path / "tmp"):
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    run_dir = tmp_path / "data" / "r"
    before = [json.loads(line)["task"]["name"] for line in (run_dir / "batch_0.jsonl").read_text().splitlines()]
    assert before == ["t0", "t1"]  # one worker: t0 and t1 were verified and saved, t2 was being verified

    slow["on"] = False
    server.requests.clear()
    proc2 = run(tmp_path, env, *args, "--resume")
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    rerun = {task_name(b) for b in server.chat_requests()}
    assert rerun == {"t2", "t3"}  # nothing verified twice
    lines = (run_dir / "batch_0.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["task"]["name"] for line in lines) == ["t0", "t1", "t2", "t3"]
    recs = records(run_dir)
    assert sorted(recs) == ["t0", "t1", "t2", "t3"] and all(r["verification"]["reward"] == 1.0 for r in recs.values())
    assert containers_with_label(podman, "trajforge.run=r") == []  # the killed run's container was swept


def test_tasks_without_a_container_engine_stop_at_start(tmp_path: Path, clean_env: dict[str, str]) -> None:
    env = {**clean_env, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    proc = run(tmp_path, env, "--tasks", str(EXAMPLES), "--agent", "oracle", "--container_engine", "docker",
               timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--tasks runs each task in a container, and no container engine works here" in proc.stderr
    assert not (tmp_path / "data").exists()
    assert os.environ.get("DOCKER_HOST") != env["DOCKER_HOST"]


def test_task_rollouts_stop_after_passes_and_keep_passed(tmp_path: Path, clean_env: dict[str, str], podman: Engine,
                                                         task_base: str) -> None:
    """Rollouts of tasks work as a dataset's do: a task whose oracle passes stops after its pass,
    the others run every rollout, and --keep passed keeps only the passing record."""
    proc = run(tmp_path, clean_env, "--tasks", str(EXAMPLES), "--agent", "oracle", "--run_name", "roll",
               "--container_engine", "podman", "--samples_per_prompt", "3", "--stop_after_passes", "1",
               "--keep", "passed")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "data" / "roll"
    kept = read_records(run_dir)
    assert [(r["task"]["name"], r["rollout"]) for r in kept] == [("trajforge/hello-world", 0)]
    batches = read_batch_records(run_dir)
    ran = sorted((r["task"]["name"].removeprefix("trajforge/"), r["rollout"]) for r in batches)
    assert ran == [("count-lines", 0), ("count-lines", 1), ("count-lines", 2), ("hello-world", 0),
                   ("wrong-solution", 0), ("wrong-solution", 1), ("wrong-solution", 2)]
    verification = json.loads((run_dir / "statistics.json").read_text())["run"]["verification"]
    assert verification["skipped_solved"] == 2 and verification["not_kept"] == 6, verification


def test_tasks_run_on_ray(tmp_path: Path, clean_env: dict[str, str], podman: Engine, task_base: str) -> None:
    """--executor ray with task directories: the actors build and verify as the local executor does."""
    import shutil
    import tempfile

    ray_tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")
    env = {**clean_env, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": ray_tmp}
    try:
        proc = run(tmp_path, env, "--tasks", str(EXAMPLES), "--agent", "oracle", "--run_name", "ray",
                   "--container_engine", "podman", "--executor", "ray", "--num_workers", "2")
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {name.removeprefix("trajforge/"): r["verification"]["reward"]
           for name, r in records(tmp_path / "data" / "ray").items()}
    assert got == {"hello-world": 1.0, "count-lines": 0.666, "wrong-solution": 0.0}


def test_a_budget_stops_a_task_run_and_a_resume_with_more_finishes_it_once(
        tmp_path: Path, server: ScriptedServer, clean_env: dict[str, str], podman: Engine, task_base: str) -> None:
    """--max_cost on tasks works as on a dataset: the run stops starting tasks once the spend reaches
    the budget (exit 4), the tasks it finished are verified, and a resume with more runs each other
    task once."""
    from tests.support.scripted_server import with_usage

    def one_step(req: Recorded) -> Reply:
        if not tool_messages(req.body):
            return chat(None, tool_calls=[tool_call("terminal", {"command": "echo done > /app/out.txt"})],
                        reasoning="Write it.")
        return chat("Finished.", reasoning="Done.")

    server.handler = with_usage(one_step, 100, 20, cost=0.01)  # $0.02 a task
    tasks = tmp_path / "tasks"
    nonce = unique_nonce()
    for i in range(5):
        write_task(tasks, f"budget-{i}", nonce=f"{nonce}-budget", test_sh=REWARD_IF.format(cond="[ -f /app/out.txt ]"))
    conf = tmp_path / "config.yaml"
    conf.write_text("pricing:\n  scripted: {prompt: 10, completion: 100}\n")
    args = ["--tasks", str(tasks), "--base_url", server.url, "--model", "scripted", "--distribution",
            "terminal_only", "--num_workers", "1", "--container_engine", "podman", "--run_name", "b",
            f"--config={conf}"]
    first = run(tmp_path, clean_env, *args, "--max_cost=0.03")
    assert first.returncode == 4, first.stderr[-3000:]
    assert "budget reached" in first.stderr and "Traceback" not in first.stderr
    run_dir = tmp_path / "data" / "b"
    done = records(run_dir)
    assert len(done) == 2, (first.stderr[-3000:], sorted(p.name for p in run_dir.iterdir()))
    assert all(r["verification"]["reward"] == 1.0 for r in done.values())  # $0.02, then $0.04
    stats = json.loads((run_dir / "statistics.json").read_text())
    assert stats["spend"]["budget_reached"] is True and stats["spend"]["spent"] == pytest.approx(0.04)
    calls = len(server.chat_requests())

    more = run(tmp_path, clean_env, *args, "--resume", "--max_cost=1")
    assert more.returncode == 0, more.stderr[-3000:]
    recs = records(run_dir)
    assert sorted(recs) == [f"budget-{i}" for i in range(5)]
    assert all(r["verification"]["reward"] == 1.0 for r in recs.values())
    assert len(server.chat_requests()) == calls + 3 * 2  # the three others, once each
    assert json.loads((run_dir / "statistics.json").read_text())["spend"]["spent"] == pytest.approx(0.10)
