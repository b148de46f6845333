"""A hostile agent against task verification, in default and in sealed mode, for real.

The agent is root in its container and scripted (the scripted model server plays it): it plants
reward files and a fake test script, leaves a loop running and one waiting to swap the tests,
plants pytest's configuration at /, a .pth file, replaces python3, bash and sh, fills its disk,
starts a fork bomb and stops its own container; two tasks' tests write malformed rewards. Each
task is a Terminal-Bench-style task verified with pytest (tests/support/python_image.py). One run
per mode, side by side, and what each attack comes to is asserted:
- no reward 1 without solving in sealed mode;
- none through trajforge's own steps in default mode (a planted reward, a swapped test, a
  replaced `sh`); what default mode cannot prevent (the tests run the agent's python, bash,
  pytest configuration) gets reward 1 there, and is listed in `verification.tampered`;
- sabotage (a full disk, a stopped container, tests that cannot give a reward) is a fail with
  reward 0 naming the cause, never an error left out of the mean, where the agent could cause it.
Then the oracle of a Harbor-format task and of the example tasks gets the same rewards in both
modes, the verifier's logs are in the run directory and the viewer shows them, --keep
untampered leaves the tampered samples out, and `trajforge tasks prune` removes what this user built.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.conftest import cli
from tests.support.images import podman  # noqa: F401 (fixture)
from tests.support.python_image import python_base  # noqa: F401 (fixture)
from tests.support.scripted_server import ScriptedServer
from tests.support.tasks import EXAMPLES, scripted_agent, task_base, unique_nonce, write_task  # noqa: F401 (fixture)
from trajforge.sandbox.backends.container.engine import Engine
from trajforge.sandbox.host.disk import disk_usable

DOCKERFILE = "FROM localhost/trajforge-test-python:latest\nWORKDIR /app\n"
TEST_SH = ("cd /tests\npython3 -m pytest -q -p no:cacheprovider test_outputs.py > /logs/verifier/test-stdout.txt 2>&1\n"
           "if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n")
TEST_PY = 'from pathlib import Path\n\n\ndef test_out():\n    assert Path("/app/out.txt").read_text() == "done\\n"\n'
SITE = "/usr/lib/python3/dist-packages"
PASS_ALL = ("import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
            "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n")
FAKE = "printf '#!/usr/bin/dash\\n{body}\\n' > {path}.new && chmod 755 {path}.new && mv -f {path}.new {path}"
REWARD_1 = "mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; exit 0"
SOLVE = "echo done > /app/out.txt"

# What the scripted agent runs, by task name: terminal commands in order, then an answer.
COMMANDS: dict[str, list[str]] = {
    "honest": [SOLVE],
    "plant": ["mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt && "
              "printf 'echo 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh && "
              "(while :; do mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; done >/dev/null 2>&1 &) && "
              "echo planted"],
    "swap": ["(while :; do [ -f /tests/test.sh ] && printf 'echo 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh;"
             " done >/dev/null 2>&1 &) && echo waiting"],
    "conftest": [f"printf '[pytest]\\n' > /pytest.ini && printf \"{PASS_ALL}\" > /conftest.py && echo planted"],
    "pth": [f"printf \"{PASS_ALL}\" > {SITE}/evilplugin.py && "
            f"printf 'import os; os.environ[\"PYTEST_PLUGINS\"] = \"evilplugin\"\\n' > {SITE}/zz.pth && echo planted"],
    "python": [FAKE.format(body="exit 0", path="/usr/bin/python3.11") + " && echo replaced"],
    "bash": [FAKE.format(body=REWARD_1, path="/usr/bin/bash") + " && echo replaced"],
    "sh": [FAKE.format(body=REWARD_1, path="/usr/bin/dash") + " && echo replaced"],
    "disk": ["head -c 512M /dev/zero > /app/fill; echo filled"],
    "bomb": ["(f(){ f & f & wait; }; f) >/dev/null 2>&1 & echo started"],
    "stopper": [SOLVE + " && for p in /proc/[0-9]*; do [ \"$(tr '\\0' ' ' < $p/cmdline)\" = 'sleep infinity ' ] && "
                "kill -9 ${p#/proc/}; done; echo stopped"],
    "bad-reward": [SOLVE],
    "link-reward": [SOLVE],
}
INHERENT = {"conftest", "pth", "python", "bash"}  # what default mode cannot prevent: the tests run the agent's
TAMPERED = {"conftest": "/conftest.py", "pth": f"{SITE}/zz.pth", "python": "/usr/bin/python3.11",
            "bash": "/usr/bin/bash", "sh": "/usr/bin/dash"}


agent_policy = scripted_agent(COMMANDS)


def attack_tasks(root: Path, nonce: str) -> Path:
    for name in COMMANDS:
        test_sh = TEST_SH
        if name == "bad-reward":  # the task's own tests write a reward.json with no main reward
            test_sh += "printf '{\"a\": 1, \"b\": 2}' > /logs/verifier/reward.json\n"
        if name == "link-reward":  # ... or make it a link
            test_sh += "ln -s /etc/passwd /logs/verifier/reward.json\n"
        toml = '[environment]\nstorage = "200M"\n' if name == "disk" else ""
        write_task(root, name, dockerfile=DOCKERFILE + f"# {nonce}\n", toml=toml, test_sh=test_sh,
                   test_files={"test_outputs.py": TEST_PY}, solve_sh=SOLVE + "\n")
    return root


def records(run_dir: Path) -> dict[str, dict]:
    return {r["task"]["name"]: r for r in map(json.loads, (run_dir / "trajectories.jsonl").read_text().splitlines())}


def start(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(cli("run", *args), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 1200) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def test_a_hostile_agent_in_default_and_sealed_mode(tmp_path: Path, server: ScriptedServer,
                                                     clean_env: dict[str, str], podman: Engine,
                                                     python_base: str) -> None:
    server.handler = agent_policy
    tasks = attack_tasks(tmp_path / "tasks", unique_nonce())
    (tmp_path / "cfg.yaml").write_text("container_pids_limit: 256\n")  # what the fork bomb fills
    common = ["--tasks", str(tasks), "--base_url", server.url, "--model", "scripted", "--distribution",
              "terminal_only", "--num_workers", "3", "--container_engine", "podman", "--config", "cfg.yaml"]
    procs = {mode: start(tmp_path, clean_env, *common, "--run_name", mode, "--verifier", mode)
             for mode in ("default", "sealed")}
    results = {mode: finish(p) for mode, p in procs.items()}
    for mode, (code, _, err) in results.items():
        assert code == 0, (mode, err[-3000:])
    got = {mode: records(tmp_path / "data" / mode) for mode in results}
    limited = disk_usable() is None  # the disk attack needs the sample disks of a root runner
    for mode, recs in got.items():
        assert sorted(recs) == sorted(COMMANDS), mode
        for name, rec in recs.items():
            v = rec["verification"]
            assert v["isolation"] == mode, (mode, name)
            if name == "disk" and not limited:
                continue
            sealed_passes = name in ("honest", "stopper")
            if mode == "sealed":  # no reward 1 without solving; the solved ones pass
                want = 1.0 if sealed_passes else (None if name in ("bad-reward", "link-reward") else 0.0)
            elif name in INHERENT or name == "honest":
                want = 1.0  # the tests ran the agent's own programs: what default mode cannot prevent
            else:
                want = 0.0  # never through trajforge's own steps; sabotage is scored 0
            assert v["reward"] == want, (mode, name, v)
    d, s = got["default"], got["sealed"]
    # Sabotage in default mode: a fail with reward 0 and the cause named, never an error.
    assert d["stopper"]["verification"]["failure"] == "container_stopped"
    assert d["bad-reward"]["verification"]["failure"] == "reward_invalid"
    assert d["link-reward"]["verification"]["failure"] == "reward_invalid"
    assert all(d[n]["verification"]["error"] is None for n in COMMANDS)
    if limited:
        assert d["disk"]["verification"]["failure"] in ("disk_full", "verifier_crashed"), d["disk"]["verification"]
        assert s["disk"]["verification"]["failure"] in ("disk_full", "verifier_crashed"), s["disk"]["verification"]
    # Sealed: the tests' own failures are errors (the agent could not reach them); the stopped
    # container's outputs were still verified (and were right: reward 1 above).
    for name in ("bad-reward", "link-reward"):
        assert (s[name]["verification"]["error"], s[name]["verification"]["passed"]) == ("reward_invalid", None)
    # The fork bomb was stopped from the host, and the record says so.
    for recs in (d, s):
        assert "fork bomb" in recs["bomb"]["verification"]["detail"]["tests"]["stopped"]
    # The tamper report, the same in both modes: each replaced or planted file, nothing for honest work.
    for recs in (d, s):
        assert recs["honest"]["verification"]["tampered"] == []
        for name, path in TAMPERED.items():
            paths = {t["path"] for t in recs[name]["verification"]["tampered"]}
            assert path in paths, (name, recs[name]["verification"]["tampered"])
        assert "/pytest.ini" in {t["path"] for t in recs["conftest"]["verification"]["tampered"]}
    stats = json.loads((tmp_path / "data" / "default" / "statistics.json").read_text())["run"]
    assert stats["tasks"]["all"]["tampered"] == len(TAMPERED)
    assert stats["verification"]["failures_by_kind"]["container_stopped"] == 1
    # What the tests wrote beside the reward is kept in the run directory, and the record says where.
    logs = d["honest"]["verification"]["detail"]["tests"]["logs"]
    assert sorted(logs["files"]) == ["reward.txt", "test-stdout.txt"]
    kept = tmp_path / "data" / "default" / logs["dir"]
    assert "1 passed" in (kept / "test-stdout.txt").read_text()
    failing = s["swap"]["verification"]["detail"]["tests"]["logs"]
    assert "No such file or directory: '/app/out.txt'" in \
        (tmp_path / "data" / "sealed" / failing["dir"] / "test-stdout.txt").read_text()
    # The viewer shows them, with the tamper report.
    view = subprocess.Popen(cli("view", str(tmp_path / "data" / "default"), "--port", "0"), cwd=tmp_path,
                            env=clean_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert view.stdout is not None
        url = re.search(r"(http://127\.0\.0\.1:\d+/)", view.stdout.readline()).group(1)  # type: ignore[union-attr]
        with urllib.request.urlopen(url + "api/sample?key=" + urllib.parse.quote(d["python"]["sample_id"])) as r:
            body = json.load(r)
        assert body["record"]["verification"]["tampered"][0]["path"].startswith("/usr/bin/python3")
        with urllib.request.urlopen(url + "api/sample?key=" + urllib.parse.quote(d["honest"]["sample_id"])) as r:
            shown = {f["name"]: f["text"] for f in json.load(r)["verifier_logs"]}
        assert "1 passed" in shown["test-stdout.txt"] and shown["reward.txt"] == "1\n"
    finally:
        view.terminate()
        view.wait(10)
    # --keep untampered leaves the samples whose agent tampered out of trajectories.jsonl.
    again = subprocess.run(cli("run", *common, "--run_name", "default", "--verifier", "default", "--resume",
                               "--keep", "untampered"), cwd=tmp_path, env=clean_env, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert sorted(records(tmp_path / "data" / "default")) == sorted(set(COMMANDS) - set(TAMPERED))


def test_oracle_rewards_are_the_same_in_both_modes(tmp_path: Path, clean_env: dict[str, str], podman: Engine,
                                                  python_base: str) -> None:
    """A Harbor-format task (pytest tests, a solution) and the example tasks: their oracle's rewards
    do not depend on where the tests run."""
    harbor = write_task(tmp_path / "harbor", "harbor-style", dockerfile=DOCKERFILE, test_sh=TEST_SH,
                        test_files={"test_outputs.py": TEST_PY}, solve_sh=SOLVE + "\n",
                        toml='[verifier]\ntimeout_sec = 120\n[agent]\ntimeout_sec = 60\n')
    rewards = {}
    for mode in ("default", "sealed"):
        for name, path in (("examples", EXAMPLES), ("harbor", harbor)):
            proc = subprocess.run(cli("run", "--tasks", str(path), "--agent", "oracle", "--run_name", f"{name}-{mode}",
                                      "--container_engine", "podman", "--verifier", mode),
                                  cwd=tmp_path, env=clean_env, capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, proc.stderr[-3000:]
            for task, rec in records(tmp_path / "data" / f"{name}-{mode}").items():
                rewards.setdefault(task, {})[mode] = rec["verification"]["reward"]
                assert rec["verification"]["isolation"] == mode
    assert rewards == {"trajforge/hello-world": {"default": 1.0, "sealed": 1.0},
                       "trajforge/count-lines": {"default": 0.666, "sealed": 0.666},
                       "trajforge/wrong-solution": {"default": 0.0, "sealed": 0.0},
                       "harbor-style": {"default": 1.0, "sealed": 1.0}}


def test_tasks_prune_removes_only_what_this_user_built(tmp_path: Path, clean_env: dict[str, str], podman: Engine,
                                                       task_base: str) -> None:
    """Images carry the uid that built them, and prune goes by it. The command itself runs with
    --dry_run only: other test suites on this machine build task images as the same uid."""
    import asyncio

    from trajforge.sandbox.factory import SandboxProvider
    from trajforge.sandbox.sandbox_settings import ContainerSettings, SandboxSettings
    from trajforge.tasks.environment import prune

    task = write_task(tmp_path / "t", "prunable", nonce=unique_nonce(), test_sh="echo 1 > /logs/verifier/reward.txt\n",
                      solve_sh="true\n")
    proc = subprocess.run(cli("run", "--tasks", str(task), "--agent", "oracle", "--run_name", "p",
                              "--container_engine", "podman"), cwd=tmp_path, env=clean_env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dry = subprocess.run(cli("tasks", "prune", "--dry_run", "--container_engine", "podman"), cwd=tmp_path,
                         env=clean_env, capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0, dry.stderr
    assert re.search(rf"would remove [1-9]\d* task image\(s\) built by uid {os.getuid()}", dry.stdout), dry.stdout
    # Two images as two other users built them: pruning for one removes its image only.
    mine, theirs = 4_000_000_000 + os.getpid(), 4_100_000_000 + os.getpid()
    tags = {}
    for uid in (mine, theirs):
        tags[uid] = f"localhost/trajforge-test-prune:{uid}"
        built = subprocess.run([podman.binary, "build", "-q", "--label", f"trajforge.task-env={uuid.uuid4().hex}",
                                "--label", f"trajforge.task-env.user={uid}", "-t", tags[uid],
                                str(task / "environment")], env=podman.env, capture_output=True, text=True,
                               timeout=300)
        assert built.returncode == 0, built.stderr

    async def prune_for(uid: int) -> list[str]:
        settings = SandboxSettings(container=ContainerSettings(engine="podman"))
        async with SandboxProvider(settings) as provider:
            return (await prune(await provider.image_store(), uid)).removed

    try:
        assert len(asyncio.run(prune_for(mine))) == 1
        present = {uid: subprocess.run([podman.binary, "image", "exists", tag], env=podman.env).returncode == 0
                   for uid, tag in tags.items()}
        assert present == {mine: False, theirs: True}
    finally:
        for tag in tags.values():
            subprocess.run([podman.binary, "rmi", "-f", tag], env=podman.env, capture_output=True, timeout=120)


@pytest.mark.timeout(1200)  # thirteen oracle runs, eight of them building
def test_the_build_cache_follows_its_base_and_trusts_no_tag(tmp_path: Path, clean_env: dict[str, str],
                                                            podman: Engine, task_base: str) -> None:
    """A cached task image is used only while its base is the same image, its context has the same
    bytes, mode bits and owners, its build arguments are the same and its label carries the key: a
    base changed under the same tag, a file's mode or owner changed, another build argument, or an
    impostor under the task image's tag, is built over; --rebuild builds anyway."""
    base = f"localhost/trajforge-test-cachebase:{unique_nonce()}"  # its task images: this session's own
    engine = lambda *a: subprocess.run([podman.binary, *a], env=podman.env, capture_output=True, text=True,  # noqa: E731
                                       timeout=300)
    assert engine("tag", task_base, base).returncode == 0
    task = write_task(tmp_path / "t", "cached", dockerfile=f"FROM {base}\nARG GREETING=hi\nCOPY data.txt /data.txt\n"
                      "WORKDIR /app\n", test_sh="echo 1 > /logs/verifier/reward.txt\n", solve_sh="true\n",
                      files={"data.txt": "the same bytes throughout\n"})
    data = task / "environment" / "data.txt"
    os.chmod(data, 0o644)

    def run(name: str, *extra: str) -> bool:
        """Whether the run built the task's image."""
        proc = subprocess.run(cli("run", "--tasks", str(task), "--agent", "oracle", "--run_name", name,
                                  "--container_engine", "podman", *extra), cwd=tmp_path, env=clean_env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert records(tmp_path / "data" / name)["cached"]["verification"]["reward"] == 1.0
        return any((tmp_path / "data" / name / "builds").glob("*.log"))

    try:
        assert run("first") and not run("again")
        # The base changes under its tag: a new key, a new build.
        (tmp_path / "base2").mkdir()
        (tmp_path / "base2" / "Dockerfile").write_text(f"FROM {task_base}\nLABEL changed=yes\n")
        assert engine("build", "-q", "-t", base, str(tmp_path / "base2")).returncode == 0
        assert run("new-base") and not run("new-base-again")
        # An impostor under the task image's tag, without the key's label: built over.
        log = next((tmp_path / "data" / "new-base" / "builds").glob("*.log")).read_text()
        tag = re.search(r" build -t (\S+) ", log).group(1)  # type: ignore[union-attr]
        assert engine("tag", task_base, tag).returncode == 0
        assert run("impostor")
        info = engine("image", "inspect", "--format", '{{index .Config.Labels "trajforge.task-env"}}', tag)
        assert info.stdout.strip() and tag.endswith(info.stdout.strip()[:32])
        assert run("rebuilt", "--rebuild")
        # What a COPY carries beside the bytes: a mode bit, then the owner.
        os.chmod(data, 0o640)
        assert run("mode") and not run("mode-again")
        if os.geteuid() == 0:  # (only root gives a file away)
            os.chown(data, 4242, 4242)
            assert run("owner") and not run("owner-again")
        # Another build argument.
        with (task / "task.toml").open("a") as f:
            f.write('[environment]\nbuild_args = { GREETING = "hello" }\n')
        assert run("argument") and not run("argument-again")
    finally:
        engine("rmi", base)


def test_a_task_asks_for_its_own_sealed_verifier_and_names_its_outputs(tmp_path: Path, clean_env: dict[str, str],
                                                                       podman: Engine, task_base: str) -> None:
    """task.toml's [verifier] isolation = "sealed" and outputs: only those paths reach the tests."""
    check = ('[ "$(cat /root/result/out.txt)" = done ] && [ ! -e /app/scratch.txt ] && [ ! -e /etc/agent-was-here ] '
             '&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n')
    task = write_task(tmp_path / "t", "outputs", test_sh=check,
                      toml='[verifier]\nisolation = "sealed"\noutputs = ["/root/result"]\n',
                      solve_sh="mkdir -p /root/result && echo done > /root/result/out.txt && echo x > /app/scratch.txt"
                               " && touch /etc/agent-was-here\n")
    proc = subprocess.run(cli("run", "--tasks", str(task), "--agent", "oracle", "--run_name", "o",
                              "--container_engine", "podman"), cwd=tmp_path, env=clean_env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    v = records(tmp_path / "data" / "o")["outputs"]["verification"]
    assert (v["isolation"], v["reward"]) == ("sealed", 1.0), v
