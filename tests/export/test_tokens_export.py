"""`trajforge export --format tokens`: a real run that captured ids (a server rendering a real chat
template with a real tokenizer), exported through the real CLI and read back with pyarrow and
datasets; the docs' example (docs/training.md) run as written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.docs import page
from tests.conftest import REPO
from tests.support.commands import user_env
from tests.support.export_run import run_export
from tests.support.policies import echo_policy
from tests.support.scripted_server import ScriptedServer
from tests.support.token_server import TokenServer, check_segment, terminal_policy

ROWS = [{"prompt": "say alpha", "expected": "Done"}, {"prompt": "say beta", "expected": "nothing like it"},
        {"prompt": "say gamma"}]


def _run(tmp: Path, server: ScriptedServer, name: str, *extra: str) -> Path:
    ds = tmp / f"{name}.jsonl"
    ds.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    proc = subprocess.run([sys.executable, "-m", "trajforge", "run", f"--dataset_file={ds}", f"--run_name={name}",
                           f"--base_url={server.url}", "--model=policy-model", "--distribution=terminal_only",
                           "--sandbox=local", "--samples_per_prompt=2", "--keep_no_reasoning", *extra],
                          cwd=tmp, env=user_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    return tmp / "data" / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, TokenServer]]:
    """A run with ids (turns 0 and 2 reason: every prompt extends the last) and a plain one."""
    tmp = tmp_path_factory.mktemp("runs")
    ts = TokenServer(terminal_policy(turns=2, reasoning_at=(0, 2)))
    with ScriptedServer(ts) as server:
        captured = _run(tmp, server, "cap", "--capture_tokens", "--policy_version=3")
    with ScriptedServer(echo_policy(turns=1)) as server:
        plain = _run(tmp, server, "plain")
    yield captured, plain, ts


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout


def by_sample(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["sample_id"]: r for r in records}


def test_each_row_is_a_segment_of_the_ids_the_server_reported(runs: tuple[Path, Path, TokenServer],
                                                              tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    captured, _, ts = runs
    out = ok(run_export(tmp_path, captured, "--format", "tokens", "--output", "t.parquet"))
    assert "exported 6 of 6 trajectories" in out and "rows: 6" in out
    table = pq.read_table(tmp_path / "t.parquet")
    assert table.schema.field("input_ids").type.value_type.bit_width == 32
    rows = table.to_pylist()
    records = by_sample([json.loads(x) for x in (captured / "trajectories.jsonl").read_text().splitlines()])
    assert {r["sample_id"] for r in rows} == set(records) and len(rows) == 6
    for row in rows:
        rec = records[row["sample_id"]]
        prompt = rec["conversations"][1]["value"]
        # Both rollouts of a prompt got the same scripted replies: any one of its calls per turn will do.
        check_segment(row, {c["turn"]: c for c in ts.calls if c["prompt"] == prompt})
        assert row["turns"] == [0, 1, 2] and row["segment"] == 0 and row["prefix_breaks"] == 0
        assert row["policy_versions"] == [3, 3, 3] and row["model"] == "policy-model"
        assert row["row_id"] == row["sample_id"].split("#")[0] and row["rollout"] == rec["rollout"]
        assert row["prompt_index"] == rec["prompt_index"]
        expected = {"say alpha": (1.0, True), "say beta": (0.0, False), "say gamma": (None, None)}[prompt]
        assert (row["reward"], row["passed"]) == expected
    assert sorted(r["rollout"] for r in rows) == [0, 0, 0, 1, 1, 1]


def test_the_export_loads_in_datasets_and_as_jsonl(runs: tuple[Path, Path, TokenServer], tmp_path: Path) -> None:
    import datasets

    captured, _, _ = runs
    ok(run_export(tmp_path, captured, "--format", "tokens", "--output", "t.parquet"))
    ok(run_export(tmp_path, captured, "--format", "tokens", "--jsonl", "--output", "t.jsonl"))
    datasets.disable_progress_bars()
    from_parquet = datasets.load_dataset("parquet", data_files=str(tmp_path / "t.parquet"), split="train")
    from_jsonl = datasets.load_dataset("json", data_files=str(tmp_path / "t.jsonl"), split="train")
    assert from_parquet.num_rows == from_jsonl.num_rows == 6
    lines = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    for a, b in zip(sorted(from_parquet, key=lambda r: r["sample_id"]), sorted(lines, key=lambda r: r["sample_id"])):
        assert a == b  # the same rows, field for field
    assert list(lines[0]) == from_parquet.column_names  # JSON lines in the schema's order


def test_splits_and_filters_apply_and_rows_without_ids_are_counted(runs: tuple[Path, Path, TokenServer],
                                                                  tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    captured, plain, _ = runs
    out = ok(run_export(tmp_path, captured, "--format", "tokens", "--only", "passed", "--split", "train=0.5,test=0.5",
                        "--output", "split"))
    parts = {p: pq.read_table(tmp_path / "split" / f"{p}.parquet").to_pylist() for p in ("train", "test")}
    kept = [r for rows in parts.values() for r in rows]
    assert len(kept) == 2 and all(r["passed"] for r in kept)
    assert all(r["split"] == name for name, rows in parts.items() for r in rows)
    assert "splits: train" in out
    # A file holding both runs' records: those without ids are left out, and said why.
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes((captured / "trajectories.jsonl").read_bytes() + (plain / "trajectories.jsonl").read_bytes())
    out = ok(run_export(tmp_path, mixed, "--format", "tokens", "--jsonl", "--output", "m.jsonl"))
    assert "exported 6 of 12 trajectories" in out
    assert "6 trajectories without token ids (tokens_missing: 6 not_requested" in out
    assert len((tmp_path / "m.jsonl").read_text().splitlines()) == 6
    # A run that never captured: an empty export that says why, not an error.
    out = ok(run_export(tmp_path, plain, "--format", "tokens", "--output", "none.parquet"))
    assert "exported 0 of 6 trajectories" in out and "--capture_tokens" in out
    assert pq.read_table(tmp_path / "none.parquet").num_rows == 0


def test_other_formats_leave_the_ids_out_and_say_so(runs: tuple[Path, Path, TokenServer], tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    captured, plain, _ = runs
    out = ok(run_export(tmp_path, captured, "--format", "parquet", "--output", "p.parquet"))
    assert "captured token ids (tokens, tokens_missing: --format tokens exports them)" in out
    rows = pq.read_table(tmp_path / "p.parquet").to_pylist()
    assert all("input_ids" not in (r["extra"] or "") for r in rows)
    assert all(json.loads(r["extra"]) == {"policy_versions": [3, 3, 3]} for r in rows)
    ok(run_export(tmp_path, plain, "--format", "parquet", "--output", "p2.parquet"))
    plain_rows = pq.read_table(tmp_path / "p2.parquet").to_pylist()
    assert len(plain_rows) == 6 and all(r["extra"] is None for r in plain_rows)  # as before token capture


@pytest.mark.parametrize(("flags", "message"), [
    (["--format", "openai", "--jsonl"], "--jsonl: --format openai has one output format; --jsonl applies to tokens"),
    (["--format", "tokens", "--no_reasoning"], "--no_reasoning: --format tokens exports the token ids"),
    (["--format", "tokens", "--reasoning", "inline"], "--reasoning: --format tokens exports the token ids"),
])
def test_options_that_do_not_apply_are_refused(runs: tuple[Path, Path, TokenServer], tmp_path: Path,
                                               flags: list[str], message: str) -> None:
    proc = run_export(tmp_path, runs[0], *flags, "--output", "x.out")
    assert proc.returncode == 2 and message in proc.stderr
    assert not (tmp_path / "x.out").exists()


def test_a_segment_that_is_not_what_a_run_writes_names_its_line(runs: tuple[Path, Path, TokenServer],
                                                                tmp_path: Path) -> None:
    lines = (runs[0] / "trajectories.jsonl").read_text().splitlines()
    bad = json.loads(lines[1])
    bad["tokens"]["segments"][0]["loss_mask"].pop()
    src = tmp_path / "bad.jsonl"
    src.write_text("\n".join([lines[0], json.dumps(bad)]) + "\n")
    (tmp_path / "out.parquet").write_bytes(b"earlier export")
    proc = run_export(tmp_path, src, "--format", "tokens", "--output", "out.parquet", "--overwrite")
    assert proc.returncode == 2
    assert f"{src}:2: tokens.segments[0]: input_ids, loss_mask and logprobs must be lists of one length" in proc.stderr
    assert (tmp_path / "out.parquet").read_bytes() == b"earlier export"


def readme_example() -> tuple[str, str]:
    """The export command and the Python example of the docs' token page (docs/training.md)."""
    section = page("training.md")
    command = next(line.strip() for line in section.splitlines()
                   if line.strip().startswith("trajforge export") and "--format tokens" in line)
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "the section has a python example"
    return command, code.group(1)


def test_the_readme_example_loads_the_export(runs: tuple[Path, Path, TokenServer], tmp_path: Path) -> None:
    command, code = readme_example()
    assert len(code.strip().splitlines()) <= 12
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "my_run").symlink_to(runs[0], target_is_directory=True)
    words = command.split()
    ok(run_export(tmp_path, *words[2:]))
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=user_env(), capture_output=True, text=True,
                          timeout=120)
    assert ok(proc).strip(), "the example prints what it loaded"
