"""Verified trajectories end to end: 40 tasks with known outcomes against the scripted server.

Every row has a check (or an expected answer). What a rollout does is decided by the scripted
model from the request alone, so it is the same under any concurrency and across a resume: for
`mixed` rows it solves the task only when the `file` toolset was drawn for that rollout (the
draw is per sample identity, 50%), which gives rows with 0..4 passes out of 4. Ground truth is
computed here from the task kinds and the draws, then compared with what the run reports.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from math import comb
from pathlib import Path

import pytest

from tests.support.commands import run_trajforge
from tests.conftest import cli
from tests.support.policies import tool_messages, user_prompt
from tests.support.scripted_server import Recorded, Reply, ScriptedServer, chat, tool_call
from tests.support.run_state import read_records
from trajforge.config import RunConfig
from trajforge.dataset import load_dataset, split_rollout
from trajforge.catalog.distributions import draw_toolsets
from trajforge.run_layout import RunLayout
from trajforge.runner.state.checkpoint import Checkpoint
from trajforge.runner.scheduling.rollouts import expand, passes_on_disk, prior_passes
from trajforge.runner.scheduling.rows import RunRows

N = 4
KINDS = ["pass"] * 10 + ["fail"] * 8 + ["mixed"] * 10 + ["hang"] * 4 + ["answer"] * 4 + ["answer_mixed"] * 4
COST = 0.001  # per model call
CONFIG = {"distributions": {"verify_mix": {"toolsets": {"terminal": 100, "file": 50}}}, "check_timeout": 1}


def value(i: int) -> str:
    return f"ANSWER-{i}"


def dataset(path: Path) -> Path:
    rows = []
    for i, kind in enumerate(KINDS):
        row: dict = {"prompt": f"task {i} kind={kind}: write {value(i)} into out.txt", "task_type": kind}
        if kind.startswith("answer"):
            row["expected"] = str(i * 7)
            row["match"] = "number"
        else:
            row["check"] = f"if [ -f hang ]; then sleep 30; fi; grep -qx {value(i)} out.txt"
        rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def policy(req: Recorded) -> Reply:
    """Solve, fail or make the check hang, by the task's kind and the tools offered."""
    body = req.body
    prompt = user_prompt(body)
    i, kind = int(prompt.split()[1]), prompt.split()[2].removeprefix("kind=").rstrip(":")
    file_drawn = any(t["function"]["name"] == "write_file" for t in body.get("tools", []))
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "cost": COST}
    if not tool_messages(body):
        right = kind in ("pass", "hang", "answer") or (kind in ("mixed", "answer_mixed") and file_drawn)
        command = f"echo {value(i) if right else 'WRONG'} > out.txt"
        if kind == "hang" and not file_drawn:
            command += " && touch hang"
        return chat(None, reasoning="Write the file.", tool_calls=[tool_call("terminal", {"command": command})],
                    usage=usage, delay=0.02)
    answer = i * 7 if kind == "answer" or (kind == "answer_mixed" and file_drawn) else i * 7 + 1
    return chat(f"Done. The answer is {answer}.", reasoning="Finished.", usage=usage, delay=0.02)


def truth_outcomes(ds: Path) -> dict[int, list[str]]:
    """Per row index, the outcome of each rollout: pass, fail or check_timeout."""
    dist = RunConfig(**CONFIG).all_distributions()["verify_mix"]  # type: ignore[arg-type]
    out: dict[int, list[str]] = {}
    for s in expand(load_dataset(ds).samples, N):
        kind = KINDS[s.index]
        drawn = "file" in draw_toolsets(dist, 0, s.identity)
        if kind in ("pass", "answer"):
            o = "pass"
        elif kind == "fail":
            o = "fail"
        elif kind == "hang":
            o = "pass" if drawn else "check_timeout"
        else:
            o = "pass" if drawn else "fail"
        out.setdefault(s.index, []).append(o)
    return out


def expected_figures(outcomes: dict[int, list[str]], stop_after: int | None) -> dict:
    """What statistics.json must say, computed from the per-rollout ground truth."""
    rows = {}
    skipped = 0
    for i, seq in outcomes.items():
        ran = seq
        if stop_after is not None:
            passes, ran = 0, []
            for o in seq:
                if passes >= stop_after:
                    break
                ran.append(o)
                passes += o == "pass"
            skipped += len(seq) - len(ran) if passes >= stop_after else 0
        rows[i] = ran
    passed = sum(r.count("pass") for r in rows.values())
    failed = sum(r.count("fail") for r in rows.values())
    hung = sum(r.count("check_timeout") for r in rows.values())

    def pk(n: int, c: int, k: int) -> float:
        return 0.0 if c == 0 else 1.0 if n - c < k else 1 - comb(n - c, k) / comb(n, k)

    verdicts = [(len(r) - r.count("check_timeout"), r.count("pass")) for r in rows.values()]
    verdicts = [(n, c) for n, c in verdicts if n]
    by_type: dict[str, list[int]] = {}
    for i, r in rows.items():
        t = by_type.setdefault(KINDS[i], [0, 0, 0])
        t[0] += r.count("pass")
        t[1] += r.count("fail")
        t[2] += r.count("check_timeout")
    return {
        "passed": passed, "failed": failed, "hung": hung, "skipped": skipped, "records": passed + failed + hung,
        "pass_at_1": round(sum(c / n for n, c in verdicts) / len(verdicts), 6),
        "pass_at_k": round(sum(pk(n, c, N) for n, c in verdicts) / len(verdicts), 6),
        "per_row": [{"prompt_index": i, "rollouts": len(r), "passes": r.count("pass"),
                     "verdicts": len(r) - r.count("check_timeout")} for i, r in sorted(rows.items())],
        "by_type": by_type,
    }


@pytest.fixture
def setup(tmp_path: Path, server: ScriptedServer) -> tuple[Path, Path, dict]:
    server.handler = policy
    ds = dataset(tmp_path / "tasks.jsonl")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(json.dumps(CONFIG))  # JSON is YAML
    outcomes = truth_outcomes(ds)
    flat = [o for seq in outcomes.values() for o in seq]
    # the data set really has every kind of outcome, and rows with every number of passes
    assert {"pass", "fail", "check_timeout"} <= set(flat)
    assert len({seq.count("pass") for seq in outcomes.values()}) >= 4
    assert any(seq[0] != "pass" and "pass" in seq for seq in outcomes.values())  # solved only on a later try
    return ds, cfg, outcomes


def args(server: ScriptedServer, ds: Path, cfg: Path, name: str, *extra: str) -> list[str]:
    return ["run", f"--dataset_file={ds}", f"--config={cfg}", "--batch_size=10", f"--run_name={name}",
            f"--base_url={server.url}", "--model=scripted-model", "--distribution=verify_mix", "--sandbox=local",
            "--num_workers=8", f"--samples_per_prompt={N}", *extra]


def run(tmp_path: Path, env: dict[str, str], argv: list[str]) -> subprocess.CompletedProcess[str]:
    return run_trajforge(*argv, cwd=tmp_path, env=env, timeout=600)


def assert_figures(run_dir: Path, want: dict, *, keep_passed: bool) -> dict:
    stats = json.loads((run_dir / "statistics.json").read_text())
    v = stats["run"]["verification"]
    assert (v["passed"], v["failed"], v["errors_by_kind"]["check_timeout"]) == (want["passed"], want["failed"],
                                                                                  want["hung"])
    assert v["errors"] == want["hung"] and v["unverified"] == 0
    assert v["pass_rate"] == round(want["passed"] / (want["passed"] + want["failed"]), 4)
    assert v["pass_at_1"] == want["pass_at_1"] and v["pass_at_k"] == {"k": N, "value": want["pass_at_k"]}
    assert v["per_row"] == want["per_row"]
    assert v["skipped_solved"] == want["skipped"]
    assert {t: [f["passed"], f["failed"], f["errors"]] for t, f in v["by_task_type"].items()} == want["by_type"]
    assert v["cost_per_pass"] == pytest.approx(2 * COST * want["records"] / want["passed"], rel=1e-5)
    assert stats["run"]["samples"]["finished"] == want["records"]
    lines = read_records(run_dir)
    if keep_passed:
        assert len(lines) == want["passed"] and all(r["verification"]["passed"] is True for r in lines)
        assert v["not_kept"] == want["records"] - want["passed"] == stats["merge"]["not_kept"]
    else:
        assert len(lines) == want["records"] and v["not_kept"] == 0
    batch_ids = [json.loads(line)["sample_id"] for p in run_dir.glob("batch_*.jsonl")
                 for line in p.read_text().splitlines()]
    assert len(batch_ids) == want["records"] == len(set(batch_ids))  # every rollout ran exactly once
    return stats


def test_four_rollouts_per_prompt_match_the_ground_truth(tmp_path: Path, server: ScriptedServer, clean_env,
                                                        setup) -> None:
    ds, cfg, outcomes = setup
    proc = run(tmp_path, clean_env, args(server, ds, cfg, "all4", "--keep=passed"))
    assert proc.returncode == 0, proc.stderr
    want = expected_figures(outcomes, None)
    run_dir = tmp_path / "data" / "all4"
    assert_figures(run_dir, want, keep_passed=True)
    assert "pass@1 / pass@4" in proc.stdout and "verification error: check_timeout" in proc.stdout
    rec = read_records(run_dir)[0]
    assert rec["verification"]["method"] == "check" and rec["verification"]["detail"]["check"]["exit_code"] == 0
    assert rec["rollout"] in range(N)
    # the check command is never shown to the model nor saved in a record
    assert not any("grep -qx" in json.dumps(r.body) for r in server.requests)
    assert "grep -qx" not in "".join(p.read_text() for p in run_dir.glob("batch_*.jsonl"))
    hung = [json.loads(line) for p in run_dir.glob("batch_*.jsonl") for line in p.read_text().splitlines()
            if '"check_timeout"' in line]
    assert hung and all(r["verification"]["passed"] is None and r["verification"]["detail"]["check"]["timeout"] == 1
                        for r in hung)
    answer = [json.loads(line) for p in run_dir.glob("batch_*.jsonl") for line in p.read_text().splitlines()
              if '"method":"expected"' in line]
    assert len(answer) == 8 * N and {r["verification"]["passed"] for r in answer} == {True, False}


def test_stop_after_one_pass_matches_the_ground_truth(tmp_path: Path, server: ScriptedServer, clean_env,
                                                      setup) -> None:
    ds, cfg, outcomes = setup
    want = expected_figures(outcomes, 1)
    assert want["skipped"] > 0
    proc = run(tmp_path, clean_env, args(server, ds, cfg, "straight", "--stop_after_passes=1"))
    assert proc.returncode == 0, proc.stderr
    assert_figures(tmp_path / "data" / "straight", want, keep_passed=False)
    assert "rollouts skipped (solved)" in proc.stdout
    assert f"progress {want['records']}/{want['records']} " in proc.stderr  # skipped rollouts leave the total
    # a resume of a finished run starts nothing, not even the skipped rollouts of solved rows
    before = len(server.requests)
    proc = run(tmp_path, clean_env, [*args(server, ds, cfg, "straight", "--stop_after_passes=1"), "--resume"])
    assert proc.returncode == 0, proc.stderr
    assert len(server.requests) == before
    assert_figures(tmp_path / "data" / "straight", want, keep_passed=False)
    # the passes a resume starts from, from the merge's figures, are those the batch files hold
    run_dir = tmp_path / "data" / "straight"
    rows = RunRows.read(RunConfig(dataset_file=ds, run_name="straight", sandbox="local", samples_per_prompt=N))
    ckpt = Checkpoint.load(RunLayout(run_dir), "straight")
    assert ckpt.merge is not None and rows.extends(ckpt.merge["dataset"])
    known, on_disk = prior_passes(rows, ckpt), passes_on_disk(RunLayout(run_dir))
    samples = list(rows.todo())
    assert [known(s) for s in samples] == [on_disk.get(split_rollout(s.identity)[0], 0) for s in samples]
    assert sum(on_disk.values()) > 0


@pytest.mark.parametrize("flags", [("--stop_after_passes=1",), ("--keep=passed",)], ids=["stop1", "all4"])
def test_a_sigkill_and_resume_change_nothing(tmp_path: Path, server: ScriptedServer, clean_env, setup,
                                             flags: tuple[str, ...]) -> None:
    """Killed hard in the middle, then resumed: the same figures as the ground truth, and the
    resume starts exactly the rollouts that had no record (none runs twice)."""
    ds, cfg, outcomes = setup
    want = expected_figures(outcomes, 1 if "--stop_after_passes=1" in flags else None)
    first_requests = lambda: sum(1 for b in server.chat_requests() if not tool_messages(b))  # noqa: E731
    argv = args(server, ds, cfg, "killed", *flags)
    child = subprocess.Popen(cli(*argv), cwd=tmp_path, env=clean_env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    run_dir = tmp_path / "data" / "killed"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done = sum(len(p.read_bytes().splitlines()) for p in run_dir.glob("batch_*.jsonl"))
        if done >= want["records"] // 2:
            break
        time.sleep(0.05)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait(30)
    assert not (run_dir / "statistics.json").exists()  # it really died before the end
    at_kill = sum(1 for p in run_dir.glob("batch_*.jsonl") for line in p.read_bytes().splitlines(keepends=True)
                  if line.endswith(b"\n"))
    assert 0 < at_kill < want["records"]
    before = first_requests()
    proc = run(tmp_path, clean_env, [*argv, "--resume"])
    assert proc.returncode == 0, proc.stderr
    resumed = assert_figures(run_dir, want, keep_passed="--keep=passed" in flags)
    assert resumed["merge"]["duplicates_ignored"] == 0
    assert first_requests() - before == want["records"] - at_kill
    ids = Counter(split_rollout(json.loads(line)["sample_id"])[0] for p in run_dir.glob("batch_*.jsonl")
                  for line in p.read_text().splitlines())
    assert sum(ids.values()) == want["records"] and len(ids) == len(KINDS)


def test_bad_verification_fields_stop_the_run_before_it_starts(tmp_path: Path, server: ScriptedServer,
                                                               clean_env) -> None:
    ds = tmp_path / "bad.jsonl"
    ds.write_text('{"prompt": "a", "check": "true"}\n{"prompt": "b", "expected": "x(", "match": "regex"}\n')
    proc = run(tmp_path, clean_env, ["run", f"--dataset_file={ds}", "--run_name=bad", f"--base_url={server.url}",
                                     "--model=m", "--sandbox=local"])
    assert proc.returncode != 0 and f"{ds}:2: field 'expected' is not a valid regular expression" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "data" / "bad").exists()
    proc = run(tmp_path, clean_env, ["run", f"--dataset_file={ds}", "--run_name=bad", f"--base_url={server.url}",
                                     "--model=m", "--samples_per_prompt=2", "--stop_after_passes=3"])
    assert proc.returncode == 2 and "--stop_after_passes (3) must be at most --samples_per_prompt (2)" in proc.stderr
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"prompt": "a"}\n')
    proc = run(tmp_path, clean_env, ["run", f"--dataset_file={plain}", "--run_name=bad", f"--base_url={server.url}",
                                     "--model=m", "--keep=passed"])
    assert proc.returncode == 2 and "--keep passed: no row of" in proc.stderr
    assert not server.requests and not (tmp_path / "data" / "bad").exists()


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install trajforge[ray])")
def test_ray_executor_verifies_and_stops_rows_the_same_way(tmp_path: Path, server: ScriptedServer, clean_env,
                                                           setup) -> None:
    """Checks run on the Ray actors' sandboxes; the driver's scheduler stops solved rows."""
    ds, cfg, outcomes = setup
    tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # Ray's unix sockets need a short path
    env = {**clean_env, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": tmp}
    try:
        proc = run(tmp_path, env, args(server, ds, cfg, "onray", "--stop_after_passes=1", "--executor=ray"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr
    assert_figures(tmp_path / "data" / "onray", expected_figures(outcomes, 1), keep_passed=False)
