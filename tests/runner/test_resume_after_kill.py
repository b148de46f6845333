"""A run killed (SIGKILL) between writing records and saving its checkpoint, then resumed.

Records reach the batch files as samples finish; the checkpoint's journal is committed about once a
second (runner.state.checkpoint; tests.support.run_state reads it as the runner does). The
runner is killed at a moment when the batch files hold records the checkpoint does not know, the
state every kill of a busy run leaves. The resume must put those samples back into the checkpoint
(README: it holds the outcome of every finished sample) and count what they cost towards
`--max_cost` and `statistics.json`'s spend, without counting any of it twice.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import cli
from tests.support.run_state import outcomes, read_batch_records, read_records, state, statuses
from tests.support.policies import echo_policy
from tests.support.scripted_server import ScriptedServer, with_usage
from tests.runner.test_e2e import base_args, run_cli, write_dataset
from trajforge.run_layout import RunLayout
from trajforge.runner.state.checkpoint import Checkpoint
from trajforge.runner.state.recovery import missed_spend, record_cost, restore
from trajforge.runner.state.store import scan

CALL_USD = 0.5  # what the priced server charges per call: $1 a sample (two calls)
PRICED = "pricing:\n  scripted-model: {prompt: 10, completion: 100}\n"  # --max_cost needs a price


def first_records(run: Path) -> dict[str, dict]:
    """The first whole record of every sample in the batch files (the one the merge keeps)."""
    return {rec["sample_id"]: rec for rec in read_batch_records(run)}


def settled(run: Path) -> set[str]:
    """The samples the checkpoint calls done or discarded (none before its first save)."""
    if not (run / "checkpoint.json").exists():
        return set()
    return {k for k, status in statuses(run).items() if status in ("done", "discarded")}


def saved_invocations(run: Path) -> list[dict]:
    return [i.model_dump(exclude_unset=True) for i in state(run).invocations]


def caught(run: Path, gap: int) -> bool:
    """The checkpoint was saved with finished samples (and so with the spend of those in flight),
    and at least `gap` finished samples have been recorded since."""
    done = settled(run)
    return bool(done) and len(set(first_records(run)) - done) >= gap


def unsaved(run: Path) -> set[str]:
    return set(first_records(run)) - settled(run)


def kill_with_unsaved_records(tmp_path: Path, env: dict[str, str], args: list[str], run: Path, gap: int) -> None:
    """Start the run and SIGKILL it as soon as it is `caught`; check that the kill left it so (a save
    racing the kill makes the test try again, on --resume)."""
    for _ in range(5):
        proc = subprocess.Popen(cli("run", *args, *(["--resume"] if run.exists() else [])), cwd=tmp_path,
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline and not caught(run, gap):
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL, "the run ended before it could be killed"
        if caught(run, gap):
            return
    pytest.fail("never caught the batch files ahead of checkpoint.json")


def test_samples_recorded_after_the_last_checkpoint_save_are_put_back_into_it(
        tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    server.handler = echo_policy(turns=1, delay=0.05)
    prompts = [f"say k{i}" for i in range(60)]
    args = base_args(server, write_dataset(tmp_path / "ds.jsonl", prompts), "r", "--num_workers=4")
    run = tmp_path / "data" / "r"
    kill_with_unsaved_records(tmp_path, clean_env, args, run, gap=3)
    missing = unsaved(run)

    proc = run_cli(tmp_path, clean_env, *args, "--resume")
    assert proc.returncode == 0, proc.stderr[-2000:]
    ckpt = {k: (e.status, e.batch) for k, e in outcomes(run).items()}
    records = read_records(run)
    assert [r["prompt_index"] for r in records] == list(range(len(prompts)))
    assert {r["sample_id"] for r in records} - set(ckpt) == set(), "finished samples missing from the checkpoint"
    assert {r["sample_id"] for r in records} == set(ckpt)
    for r in records:  # the outcome and the batch file each record shows
        assert ckpt[r["sample_id"]] == ("done", r["metadata"]["batch_num"])
    assert f"checkpoint.json lacked {len(missing)} finished sample(s)" in proc.stderr

    again = run_cli(tmp_path, clean_env, *args, "--resume")  # nothing left to put back, nothing lost
    assert again.returncode == 0 and "lacked" not in again.stderr, again.stderr[-2000:]
    assert {k: (e.status, e.batch) for k, e in outcomes(run).items()} == ckpt


def test_max_cost_and_statistics_count_what_a_killed_run_spent_on_records_it_never_saved(
        tmp_path: Path, clean_env) -> None:
    with ScriptedServer(with_usage(echo_policy(turns=1, delay=0.05), 100, 20, cost=CALL_USD)) as srv:
        (tmp_path / "cfg.yaml").write_text(PRICED)
        prompts = [f"say b{i}" for i in range(60)]
        # Two in flight: their partial spend at the last save ($1 at most each) is less than what the
        # unsaved records cost ($1 each), so a resume that misses those records counts too little.
        args = base_args(srv, write_dataset(tmp_path / "ds.jsonl", prompts), "r", "--num_workers=2",
                         "--config=cfg.yaml")
        run = tmp_path / "data" / "r"
        kill_with_unsaved_records(tmp_path, clean_env, args, run, gap=4)
        records = first_records(run)
        recorded = sum(r["usage"]["cost"] for r in records.values())
        assert recorded == pytest.approx(len(records) * 2 * CALL_USD)
        # What the killed run's last save counted for samples in flight that then left no record is
        # spent for good; what it counted for those that did finish is part of their record's cost.
        invocations = saved_invocations(run)
        lost = sum(usd for identity, usd in invocations[-1].get("in_flight", {}).items() if identity not in records)

        # A budget the records alone use up: nothing may start. Its calls would come under a path of
        # their own: a call the killed run sent just before the kill may reach the server any time
        # (a loaded full run counted one after this resume), so counting all calls cannot tell.
        own = [a.replace("/v1", "/budgeted/v1") if a.startswith("--base_url=") else a for a in args]
        spent = run_cli(tmp_path, clean_env, *own, "--resume", f"--max_cost={recorded}")
        assert spent.returncode == 4, spent.stderr[-2000:]
        assert [r.path for r in srv.requests if r.path.startswith("/budgeted/")] == []
        charged = len(srv.chat_requests()) * CALL_USD  # the server's count: calls the kill cut short too
        stats = json.loads((run / "statistics.json").read_text())["spend"]
        assert recorded - 1e-9 <= stats["spent"] <= charged + 1e-9, (recorded, stats, charged)
        if len(invocations) == 1:  # killed at the first try: exactly what is known to be spent
            assert stats["spent"] == pytest.approx(recorded + lost), (recorded, lost, stats)
        assert stats["budget_reached"] is True and stats["this_invocation"] == 0

        more = run_cli(tmp_path, clean_env, *args, "--resume", "--max_cost=1000")
        assert more.returncode == 0, more.stderr[-2000:]
        records = read_records(run)
        assert [r["prompt_index"] for r in records] == list(range(len(prompts)))
        stats = json.loads((run / "statistics.json").read_text())["spend"]
        charged = len(srv.chat_requests()) * CALL_USD
        # Every record's cost once; at most what the server was asked for (no double counting).
        assert len(prompts) * 2 * CALL_USD - 1e-9 <= stats["spent"] <= charged + 1e-9, (stats, charged)


def test_spend_of_a_sample_still_running_reaches_the_checkpoint_and_survives_a_kill(tmp_path: Path,
                                                                                      clean_env) -> None:
    # One long sample: no outcome for seconds, yet every call it makes is paid for.
    with ScriptedServer(with_usage(echo_policy(turns=60, delay=0.1), 100, 20, cost=CALL_USD)) as srv:
        (tmp_path / "cfg.yaml").write_text(PRICED)
        args = base_args(srv, write_dataset(tmp_path / "ds.jsonl", ["say long"]), "r", "--config=cfg.yaml",
                         "--max_turns=100")
        run = tmp_path / "data" / "r"
        proc = subprocess.Popen(cli("run", *args), cwd=tmp_path, env=clean_env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        saved: dict = {}
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline and not saved.get("spent"):
            time.sleep(0.01)
            with contextlib.suppress(FileNotFoundError, IndexError):
                saved = saved_invocations(run)[-1]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not first_records(run), "the sample finished before its spend reached the checkpoint"
        assert saved.get("spent", 0) > 0 and list(saved["in_flight"].values()) == [saved["spent"]], saved
        calls = len(srv.chat_requests())

        # What the checkpoint kept of it is the run's spend: a budget of that much lets nothing start.
        again = run_cli(tmp_path, clean_env, *args, "--resume", f"--max_cost={saved['spent']}")
        assert again.returncode == 4, again.stderr[-2000:]
        assert len(srv.chat_requests()) == calls
        assert json.loads((run / "statistics.json").read_text())["spend"]["spent"] == pytest.approx(saved["spent"])


# --- the pure parts ------------------------------------------------------------------------------


def test_missed_spend_is_each_records_cost_less_what_the_last_save_counted_of_it() -> None:
    costs = {"a": 1.0, "b": 1.0, "c": 0.25}
    # a was in flight at the save with $0.4 of its attempt spent; b was not; c's attempt had spent
    # more by the save than its record says (a provider's odd usage): nothing is given back.
    assert missed_spend(costs, {"a": 0.4, "c": 0.5, "gone": 3.0}) == pytest.approx(0.6 + 1.0)
    assert missed_spend({}, {"a": 1.0}) == 0


@pytest.mark.parametrize("usage, cost", [({"cost": 0.5}, 0.5), ({"cost": 2}, 2.0), ({}, 0.0), (None, 0.0),
                                         ({"cost": -1.0}, 0.0), ({"cost": float("nan")}, 0.0),
                                         ({"cost": True}, 0.0), ({"cost": "1"}, 0.0)])
def test_record_cost_reads_usage_cost_and_counts_nonsense_as_free(usage: object, cost: float) -> None:
    assert record_cost({"usage": usage}) == cost


def test_restore_gives_unsaved_records_done_entries_and_charges_them_once(tmp_path: Path) -> None:
    for n, ids in ((0, ["a", "b"]), (3, ["c"])):
        (tmp_path / f"batch_{n}.jsonl").write_text("".join(json.dumps(
            {"prompt_index": i, "sample_id": s, "usage": {"cost": 1.0}}) + "\n" for i, s in enumerate(ids)))
    ckpt = Checkpoint(RunLayout(tmp_path), "r")
    ckpt.begin_invocation(1.0).in_flight = {"b": 0.25}
    refs = [ref for ref in scan(RunLayout(tmp_path)) if ref.identity != "a"]
    restored = restore(ckpt, refs)
    assert (restored.samples, restored.spent) == (2, pytest.approx(0.75 + 1.0))
    assert {k: ckpt.status(k) for k in "abc"} == {"a": None, "b": "done", "c": "done"}
    assert [ckpt.done.location(i) for i in range(2)] == [(ref.path.name == "batch_3.jsonl" and 3 or 0, ref.offset,
                                                          ref.length) for ref in refs]
