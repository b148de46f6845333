"""A resume of a run whose dataset gained rows appends their trajectories; it rewrites nothing.

The dataset pass of the earlier invocation (rows.idx) and the merge's state let the resume read
only the new rows and append only the new records, with the same results a run of the whole
dataset gives: every sample once, in dataset order, the duplicate prompts told apart.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.policies import echo_policy
from tests.support.scripted_server import Recorded, Reply, ScriptedServer
from tests.runner.test_e2e import base_args, run_cli, write_dataset
from tests.support.run_state import read_records
from trajforge.run_layout import RunLayout


def test_rows_appended_to_the_dataset_are_appended_to_trajectories(tmp_path: Path, server: ScriptedServer,
                                                                   clean_env) -> None:
    server.handler = echo_policy(turns=1)
    first = [f"say a{i}" for i in range(6)]
    ds = write_dataset(tmp_path / "ds.jsonl", first)
    assert run_cli(tmp_path, clean_env, *base_args(server, ds, "r")).returncode == 0
    run = tmp_path / "data" / "r"
    target = run / "trajectories.jsonl"
    before, inode = target.read_bytes(), target.stat().st_ino
    assert RunLayout(run).rows_cache.exists()
    prompts = [*first, "say b0", "say a1", "say b1"]  # "say a1" again: a sample of its own
    write_dataset(ds, prompts)
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds, "r", "--resume"))
    assert proc.returncode == 0, proc.stderr
    assert "9 samples, 6 already finished, 3 to run" in proc.stderr
    assert target.stat().st_ino == inode and target.read_bytes().startswith(before)  # appended, not rewritten
    records = read_records(run)
    assert [r["conversations"][1]["value"] for r in records] == prompts
    assert [r["prompt_index"] for r in records] == list(range(9))
    assert len({r["sample_id"] for r in records}) == 9
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["run"]["samples"]["finished"] == 9 and stats["merge"]["written"] == 9
    # a whole merge of the same run writes the same file
    (run / "checkpoint.json").write_text(json.dumps({**json.loads((run / "checkpoint.json").read_text()),
                                                     "merge": None}))
    assert run_cli(tmp_path, clean_env, *base_args(server, ds, "r", "--resume")).returncode == 0
    assert target.stat().st_ino != inode and read_records(run) == records


def test_overwrite_starts_without_the_old_runs_state_files(tmp_path: Path, server: ScriptedServer,
                                                           clean_env) -> None:
    run = tmp_path / "data" / "r"
    seen: list[set[str]] = []
    echo = echo_policy(turns=1)

    def handle(req: Recorded) -> Reply:
        seen.append({p.name for p in run.iterdir()})  # what the run directory holds while samples run
        return echo(req)

    server.handler = handle
    ds = write_dataset(tmp_path / "ds.jsonl", ["say x"])
    assert run_cli(tmp_path, clean_env, *base_args(server, ds, "r")).returncode == 0
    assert {p.name for p in RunLayout(run).state()} <= {p.name for p in run.iterdir()}
    seen.clear()
    assert run_cli(tmp_path, clean_env, *base_args(server, ds, "r", "--overwrite")).returncode == 0
    assert seen and RunLayout(run).rows_cache.name not in seen[0]  # the old one is gone; the new one is written at the end
    assert len(read_records(run)) == 1
