"""What each invocation of a run records (issue 37): its model and settings, how many samples it
ended even when killed, and the rows --skip_invalid left out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.support.policies import echo_policy
from tests.support.run_state import state
from tests.support.scripted_server import ScriptedServer
from tests.runner.test_e2e import base_args, run_cli, write_dataset


def test_a_resume_with_another_model_says_so_and_statistics_list_both(tmp_path: Path, server: ScriptedServer,
                                                                      clean_env) -> None:
    server.handler = echo_policy(turns=1)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a", "say b"])
    args = base_args(server, ds, "r", "--max_samples=1")
    assert run_cli(tmp_path, clean_env, *args).returncode == 0
    other = [a if not a.startswith("--model=") else "--model=other-model" for a in args if a != "--max_samples=1"]
    proc = run_cli(tmp_path, clean_env, *other, "--resume", "--max_turns=7")
    assert proc.returncode == 0, proc.stderr
    assert "other settings than the previous one: model 'scripted-model' -> 'other-model'; max_turns 10 -> 7" \
        in proc.stderr
    run = tmp_path / "data" / "r"
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["models"] == ["scripted-model", "other-model"]
    assert stats["settings_changes"] == [{"invocation": 2, "changed": {"model": ["scripted-model", "other-model"],
                                                                       "max_turns": [10, 7]}}]
    saved = state(run).invocations
    assert [i.model for i in saved] == ["scripted-model", "other-model"] and saved[1].settings["max_turns"] == 7
    again = run_cli(tmp_path, clean_env, *other, "--resume", "--max_turns=7")  # the same again: nothing said
    assert again.returncode == 0 and "other settings" not in again.stderr


def test_a_killed_invocation_says_how_many_samples_it_ended(tmp_path: Path, server: ScriptedServer,
                                                            clean_env) -> None:
    server.handler = echo_policy(turns=1)
    ds = write_dataset(tmp_path / "ds.jsonl", [f"say k{i}" for i in range(200)])
    run = tmp_path / "data" / "r"
    # held (then killed) once a save of the checkpoint says 3 samples ended (tests/support/crash_at.py)
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "support" / "crash_at.py"), "ran-3", "run",
                             *base_args(server, ds, "r", "--num_workers=2")], cwd=tmp_path, env=clean_env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline() == "at ran-3\n"
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert state(run).invocations[-1].ran >= 3  # what its last save saw ended, not 0


def test_skip_invalid_count_reaches_statistics_and_the_checkpoint(tmp_path: Path, server: ScriptedServer,
                                                                  clean_env) -> None:
    server.handler = echo_policy(turns=1)
    ds = tmp_path / "ds.jsonl"
    ds.write_text('{"prompt": "say a"}\nnot json\n{"nope": 1}\n{"prompt": "say b"}\n')
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds, "r", "--skip_invalid"))
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "data" / "r"
    assert json.loads((run / "statistics.json").read_text())["skipped_invalid"] == 2
    assert state(run).invocations[-1].skipped_invalid == 2
