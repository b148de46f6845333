"""A real run SIGKILLed at each point where its bookkeeping is between two writes, then resumed.

tests/support/crash_at.py holds the run at the named point (it says so on stdout) and the test
kills it there with SIGKILL, then resumes it to the end. Whatever the point: every sample of the
dataset ends in trajectories.jsonl exactly once, in dataset order, statistics.json counts each
once, the checkpoint knows every one as done, and no sample whose record had reached a batch file
before the kill runs again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support.policies import echo_policy, tool_messages, user_prompt
from tests.support.run_state import read_batch_records, read_records, state, statuses
from tests.support.scripted_server import ScriptedServer
from tests.runner.test_e2e import base_args, run_cli, write_dataset

FIRST = [f"say a{i}" for i in range(4)]
NEW = ["say b0", "say b1", "say b2"]  # prompts are told apart by the server: all distinct

POINTS = ["batch-appended", "journal-torn", "index-appended", "snapshot-written", "trajectories-torn",
          "trajectories-appended", "merged-anew"]


def recorded(run: Path) -> list[str]:
    """Prompts of the whole records in the batch files (a sample's first record counts)."""
    return sorted(rec["conversations"][1]["value"] for rec in read_batch_records(run))


def started(server: ScriptedServer) -> list[str]:
    """The prompts of the samples the model was asked to start, in order."""
    return [user_prompt(b) for b in server.chat_requests() if not tool_messages(b)]


@pytest.mark.parametrize("point", POINTS)
def test_a_kill_at_each_point_loses_nothing_and_counts_nothing_twice(tmp_path: Path, server: ScriptedServer,
                                                                    clean_env, point: str) -> None:
    server.handler = echo_policy(turns=1)
    ds = write_dataset(tmp_path / "ds.jsonl", FIRST)
    args = base_args(server, ds, "r", "--num_workers=2")
    assert run_cli(tmp_path, clean_env, *args).returncode == 0
    run = tmp_path / "data" / "r"
    # rows appended: the resume appends to trajectories.jsonl; a row put first: it writes it anew
    prompts = ["say c0", *FIRST, *NEW] if point == "merged-anew" else [*FIRST, *NEW]
    write_dataset(ds, prompts)
    child = subprocess.Popen([sys.executable, str(REPO / "tests" / "support" / "crash_at.py"), point, "run", *args,
                              "--resume"], cwd=tmp_path, env=clean_env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert child.stdout is not None
    line = child.stdout.readline()  # blocks until the run is at the point (or ends without reaching it)
    os.killpg(child.pid, signal.SIGKILL)
    _, err = child.communicate(timeout=60)
    assert line == f"at {point}\n", f"the run never reached {point}: {err}"
    kept, asked = recorded(run), len(started(server))
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds, "r", "--num_workers=2", "--resume"))
    assert proc.returncode == 0, proc.stderr
    again = started(server)[asked:]
    assert not set(again) & set(kept), f"ran again though their record was kept: {set(again) & set(kept)}"
    records = read_records(run)
    assert [r["conversations"][1]["value"] for r in records] == prompts
    assert [r["prompt_index"] for r in records] == list(range(len(prompts)))
    assert len({r["sample_id"] for r in records}) == len(prompts)
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["run"]["samples"]["finished"] == stats["merge"]["written"] == len(prompts)
    assert stats["merge"]["duplicates_ignored"] == 0
    assert sorted(statuses(run).values()) == ["done"] * len(prompts) and state(run).finished == len(prompts)
    # and the next resume finds nothing to do and changes nothing
    before = (run / "trajectories.jsonl").read_bytes()
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds, "r", "--num_workers=2", "--resume"))
    assert proc.returncode == 0 and f"{len(prompts)} already finished, 0 to run" in proc.stderr
    assert (run / "trajectories.jsonl").read_bytes() == before
