"""`trajforge export` end to end: a real run (scripted model server, real terminal tool) exported
through the real CLI in every format, then read back with datasets / pyarrow."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.docs import page
from tests.conftest import REPO
from tests.support.commands import user_env
from tests.support.export_run import make_run, run_export
from tests.support.scripted_server import ScriptedServer


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with ScriptedServer() as server:
        yield make_run(tmp_path_factory.mktemp("run"), server)


export = run_export


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_openai_export_loads_with_datasets_and_pairs_every_tool_message(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "openai.jsonl"
    ok(export(tmp_path, run_dir, "--format", "openai", "--output", out))
    items = lines(out)
    assert len(items) == 6
    saw_parallel = saw_failed = saw_reused = 0
    for item in items:
        assert set(item) == {"messages", "tools", "metadata"}
        assert [t["function"]["name"] for t in item["tools"]][:1] == ["terminal"]
        ids: list[str] = []
        for i, msg in enumerate(item["messages"]):
            if msg["role"] == "assistant":
                assert msg["reasoning_content"]  # every turn of this run has reasoning
                for call in msg.get("tool_calls", []):
                    ids.append(call["id"])
                    json.loads(call["function"]["arguments"])  # a JSON string, as OpenAI sends it
                saw_parallel += len(msg.get("tool_calls", [])) == 2
            if msg["role"] == "tool":
                earlier = [c["id"] for m in item["messages"][:i] for c in m.get("tool_calls", [])]
                assert earlier.count(msg["tool_call_id"]) == 1, (msg, earlier)
                assert msg["name"] == "terminal"
                saw_failed += "missing required argument" in msg["content"]
        assert len(ids) == len(set(ids))
        saw_reused += "sharegpt" in item["metadata"]  # the reused id was renamed, the original kept
        assert item["messages"][0]["role"] == "system" and "<tools>" not in item["messages"][0]["content"]
        assert item["metadata"]["model"] == "scripted-model" and "sample_id" in item["metadata"]
    assert saw_parallel == 3 and saw_failed == 3 and saw_reused == 3

    import datasets

    ds = datasets.load_dataset("json", data_files=str(out), split="train")
    assert ds.num_rows == 6
    row = ds[0]
    assert row["messages"][2]["tool_calls"][1]["function"]["name"] == "terminal"
    assert row["messages"][3]["tool_call_id"] == row["messages"][2]["tool_calls"][0]["id"]


def test_sharegpt_openai_sharegpt_round_trip_is_byte_for_byte(run_dir: Path, tmp_path: Path) -> None:
    saved = (run_dir / "trajectories.jsonl").read_bytes()
    ok(export(tmp_path, run_dir, "--format", "sharegpt", "--output", "copy.jsonl"))
    assert (tmp_path / "copy.jsonl").read_bytes() == saved
    ok(export(tmp_path, "copy.jsonl", "--format", "openai", "--output", "o.jsonl"))
    ok(export(tmp_path, "o.jsonl", "--format", "sharegpt", "--output", "back.jsonl"))
    assert (tmp_path / "back.jsonl").read_bytes() == saved  # whole records, conversations included
    # inline reasoning also comes back unchanged: <think> leads the content as in the saved turn
    ok(export(tmp_path, run_dir, "--format", "openai", "--reasoning", "inline", "--output", "i.jsonl"))
    first = lines(tmp_path / "i.jsonl")[0]["messages"][2]
    assert first["content"].startswith("<think>\nI will echo") and "reasoning_content" not in first
    ok(export(tmp_path, "i.jsonl", "--format", "sharegpt", "--output", "back2.jsonl"))
    assert (tmp_path / "back2.jsonl").read_bytes() == saved


def test_no_reasoning_drops_it_and_says_so(run_dir: Path, tmp_path: Path) -> None:
    out = ok(export(tmp_path, run_dir, "--format", "openai", "--no_reasoning", "--output", "o.jsonl"))
    assert "not in this format: reasoning" in out
    text = (tmp_path / "o.jsonl").read_text()
    assert "reasoning_content" not in text and "<think>" not in text
    ok(export(tmp_path, run_dir, "--format", "sharegpt", "--no_reasoning", "--output", "s.jsonl"))
    recs = lines(tmp_path / "s.jsonl")
    assert all("<think>" not in t["value"] for r in recs for t in r["conversations"])
    assert recs[0]["conversations"][2]["value"].startswith("Let me run two things at once.")


def test_parquet_reads_back_with_the_documented_schema(run_dir: Path, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from trajforge.export.schema import DOC, SCHEMA

    out = ok(export(tmp_path, run_dir, "--format", "parquet", "--output", "t.parquet"))
    assert "tool_error_counts" in out  # what the format leaves out is said
    table = pq.read_table(tmp_path / "t.parquet")
    assert table.schema.remove_metadata().equals(SCHEMA)
    documented = {name.strip() for key in DOC for name in key.split(",")}
    assert documented == set(SCHEMA.names)
    documented_page = page("exports.md")
    assert all(f"`{name}`" in documented_page for name in SCHEMA.names)
    rows = table.to_pylist()
    saved = lines(run_dir / "trajectories.jsonl")
    assert [r["sample_id"] for r in rows] == [r["sample_id"] for r in saved]
    first = rows[0]
    assert first["messages"][2]["reasoning_content"] == "I will echo alpha and try a bad call."
    assert first["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"command":"echo alpha"}'
    assert first["messages"][4]["role"] == "tool" and first["messages"][4]["content"].startswith('{"success":false')
    assert first["tool_stats"] == [{"name": "terminal", "count": 3, "success": 2, "failure": 1}]
    assert first["usage"]["prompt_tokens"] == saved[0]["usage"]["prompt_tokens"]
    assert first["verification"] is None and first["split"] is None
    assert first["timing"] == saved[0]["timing"] and 0 <= first["timing"]["working_s"] <= first["timing"]["wall_s"]
    assert json.loads(first["tools"])[0]["function"]["name"] == "terminal"
    assert sum(r["completed"] for r in rows) == 5


def test_hf_directory_loads_and_its_card_has_the_run_figures(run_dir: Path, tmp_path: Path) -> None:
    import datasets

    run_copy = tmp_path / "run"
    shutil.copytree(run_dir, run_copy)
    config = json.loads((run_dir / "config.json").read_text())
    config.update(api_key="sk-or-v1-SECRETVALUE", base_url="https://alice:PASSWORD@llm.example/v1?token=TOKVALUE")
    config["tools"]["web"]["brave_api_key"] = "BRAVESECRET"
    (run_copy / "config.json").write_text(json.dumps(config))
    ok(export(tmp_path, run_copy, "--format", "hf", "--output", "hfds"))
    ds = datasets.load_from_disk(str(tmp_path / "hfds"))
    assert ds.num_rows == 6 and ds[1]["messages"][1]["content"] == "plain beta"
    card = (tmp_path / "hfds" / "README.md").read_text()
    stats = json.loads((run_dir / "statistics.json").read_text())["run"]
    s = stats["samples"]
    for figure, value in (("samples total", s["total"]), ("completed", s["completed"]), ("partial", s["partial"]),
                          ("api calls", stats["api_calls"])):
        assert f"| {figure} | {value} |" in card
    t = stats["tools"]["terminal"]
    assert f"| terminal | {t['count']} | {t['success']} | {t['failure']} |" in card
    assert f"{100 * stats['reasoning']['coverage']:.1f}%" in card
    tok = stats["tokens"]
    assert f"{tok['prompt']} / {tok['completion']} / {tok['reasoning']}" in card
    assert "model `scripted-model`" in card and "distribution `terminal_only`" in card
    assert "trajforge export" in card and "--format hf" in card
    for secret in ("SECRETVALUE", "PASSWORD", "TOKVALUE", "alice", "BRAVESECRET", "\napi_key:"):
        assert secret not in card
    assert "base_url: https://llm.example/v1" in card and "max_tokens" in card  # ordinary settings stay


def test_filters_and_deterministic_splits(run_dir: Path, tmp_path: Path) -> None:
    out = ok(export(tmp_path, run_dir, "--format", "openai", "--only", "completed", "--min_tool_calls", "3",
                    "--output", "f.jsonl"))
    assert "left out: 2 fewer than 3 tool calls, 1 not completed" in out
    assert [i["metadata"]["prompt_index"] for i in lines(tmp_path / "f.jsonl")] == [0, 2, 4]
    out = ok(export(tmp_path, run_dir, "--format", "sharegpt", "--task_type", "loopy", "--output", "t.jsonl"))
    assert [r["prompt_index"] for r in lines(tmp_path / "t.jsonl")] == [3]  # task types from the run's dataset
    out = ok(export(tmp_path, run_dir, "--format", "sharegpt", "--only", "passed", "--output", "p.jsonl"))
    assert "no record carries a verification result" in out and (tmp_path / "p.jsonl").read_text() == ""

    def split_ids(fmt: str, name: str, seed: str = "42") -> dict[str, list[str]]:
        ok(export(tmp_path, run_dir, "--format", fmt, "--split", "train=0.5,test=0.5", "--seed", seed,
                  "--output", name))
        if fmt == "parquet":
            import pyarrow.parquet as pq

            return {s: pq.read_table(tmp_path / name / f"{s}.parquet").column("sample_id").to_pylist()
                    for s in ("train", "test")}
        return {s: [r["sample_id"] for r in lines(tmp_path / name / f"{s}.jsonl")] for s in ("train", "test")}

    a = split_ids("sharegpt", "s1")
    assert sorted(a["train"] + a["test"]) == sorted(r["sample_id"] for r in lines(run_dir / "trajectories.jsonl"))
    assert split_ids("parquet", "p1") == a  # the same split whatever the format
    b = split_ids("sharegpt", "s2", seed="7")
    assert sorted(b["train"] + b["test"]) == sorted(a["train"] + a["test"])
    ok(export(tmp_path, run_dir, "--format", "openai", "--split", "train=0.5,test=0.5", "--output", "o1"))
    import datasets

    dd = datasets.load_dataset("json", data_dir=str(tmp_path / "o1"))  # split names from the file names
    assert {s: [r["sample_id"] for r in dd[s]["metadata"]] for s in ("train", "test")} == a
    out = ok(export(tmp_path, run_dir, "--format", "sharegpt", "--sample_percent", "50", "--output", "half.jsonl"))
    kept = [r["sample_id"] for r in lines(tmp_path / "half.jsonl")]
    ok(export(tmp_path, run_dir, "--format", "sharegpt", "--sample_percent", "50", "--output", "half.jsonl",
              "--overwrite"))
    assert [r["sample_id"] for r in lines(tmp_path / "half.jsonl")] == kept  # deterministic


def test_hf_with_splits_is_a_dataset_dict(run_dir: Path, tmp_path: Path) -> None:
    import datasets

    out = ok(export(tmp_path, run_dir, "--format", "hf", "--split", "train=0.5,test=0.5", "--output", "d"))
    dd = datasets.load_from_disk(str(tmp_path / "d"))
    assert set(dd) == {"train", "test"} and dd["train"].num_rows + dd["test"].num_rows == 6
    assert Counter(dd["train"]["split"]) == Counter({"train": dd["train"].num_rows})
    assert f"splits: train {dd['train'].num_rows}, test {dd['test'].num_rows}" in out


def test_bad_input_names_file_and_line_and_leaves_output_untouched(run_dir: Path, tmp_path: Path) -> None:
    good = (run_dir / "trajectories.jsonl").read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([good[0], good[1], '{"conversations": [{"from": "tool", "value": "x"}]}']) + "\n")
    for fmt, name in (("openai", "o.jsonl"), ("parquet", "o.parquet"), ("hf", "o_hf")):
        target = tmp_path / name
        if fmt == "hf":
            target.mkdir()
            (target / "README.md").write_text("old card")
        else:
            target.write_text("old")
        proc = export(tmp_path, bad, "--format", fmt, "--output", name, "--overwrite")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        # after its "exporting ..." line: the bad line is found once the export is under way
        assert proc.stderr.splitlines()[-1].startswith(f"error: {bad}:3: conversations[0]: a tool turn without any "
                                                       "<tool_response>"), proc.stderr
        assert (target / "README.md").read_text() == "old card" if fmt == "hf" else target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "o.jsonl", "o.parquet", "o_hf"]
    wrong = json.loads(good[1])
    wrong["completed"] = "yes"
    bad.write_text("\n".join([good[0], json.dumps(wrong)]) + "\n")
    for fmt in ("parquet", "hf"):
        proc = export(tmp_path, bad, "--format", fmt, "--output", f"w_{fmt}")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert proc.stderr.splitlines()[-1].startswith(f"error: {bad}:2: a field has the wrong type"), proc.stderr
        assert not (tmp_path / f"w_{fmt}").exists()
    bad.write_text(good[0] + "\n{not json\n")
    proc = export(tmp_path, bad, "--format", "sharegpt", "--output", "x.jsonl")
    assert proc.returncode == 2 and f"{bad}:2: invalid JSON" in proc.stderr and not (tmp_path / "x.jsonl").exists()


def test_output_safety_and_flag_errors(run_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "exists.jsonl").write_text("keep")
    proc = export(tmp_path, run_dir, "--format", "openai", "--output", "exists.jsonl")
    assert proc.returncode == 2 and "--overwrite" in proc.stderr
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    proc = export(tmp_path, run_dir, "--format", "hf", "--output", "mine", "--overwrite")
    assert proc.returncode == 2 and "refusing" in proc.stderr and (mine / "notes.txt").read_text() == "precious"
    proc = export(tmp_path, run_dir / "trajectories.jsonl", "--format", "sharegpt", "--output",
                  run_dir / "trajectories.jsonl", "--overwrite")
    assert proc.returncode == 2 and "would replace the input" in proc.stderr
    for args, msg in ((["--format", "csv"], "--format: invalid value 'csv'"),
                      (["--format", "openai", "--split", "train=0.9,test=0.2"], "add up to 1.1"),
                      (["--format", "openai", "--only", "good"], "--only: invalid value 'good'"),
                      (["--format", "openai", "--no_reasoning", "--reasoning", "inline"], "contradicts"),
                      (["--format", "openai", "--sample_pct", "5"], "did you mean --sample_percent")):
        proc = export(tmp_path, run_dir, *args, "--output", "z.jsonl")
        assert proc.returncode == 2 and msg in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    proc = export(tmp_path, tmp_path / "missing", "--format", "openai", "--output", "z.jsonl")
    assert proc.returncode == 2 and "no such file or directory" in proc.stderr
    assert not (tmp_path / "z.jsonl").exists()
    # an earlier export directory is replaced with --overwrite, in one piece
    ok(export(tmp_path, run_dir, "--format", "hf", "--output", "h"))
    ok(export(tmp_path, run_dir, "--format", "hf", "--output", "h", "--overwrite", "--only", "completed"))
    import datasets

    assert datasets.load_from_disk(str(tmp_path / "h")).num_rows == 5
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_an_empty_input_gives_empty_outputs_that_load(tmp_path: Path) -> None:
    import datasets
    import pyarrow.parquet as pq

    (tmp_path / "empty.jsonl").write_text("\n")
    ok(export(tmp_path, "empty.jsonl", "--format", "hf", "--output", "h"))
    assert datasets.load_from_disk(str(tmp_path / "h")).num_rows == 0
    ok(export(tmp_path, "empty.jsonl", "--format", "hf", "--split", "a=0.5,b=0.5", "--output", "hs"))
    assert {k: v.num_rows for k, v in datasets.load_from_disk(str(tmp_path / "hs")).items()} == {"a": 0, "b": 0}
    ok(export(tmp_path, "empty.jsonl", "--format", "parquet", "--output", "p.parquet"))
    assert pq.read_table(tmp_path / "p.parquet").num_rows == 0


def test_verified_records_with_row_fields(run_dir: Path, tmp_path: Path) -> None:
    """Records carrying the fields verification and dataset-row tracking add (verification,
    dataset_line, row) fill their columns, drive --only passed and the card's pass rate."""
    import datasets
    import pyarrow.parquet as pq

    recs = lines(run_dir / "trajectories.jsonl")
    for i, rec in enumerate(recs):
        rec["dataset_line"] = 10 + i
        rec["row"] = {"answer": str(i), "source": "unit"}
        rec["rollout"] = 0
        rec["verification"] = {"passed": i % 3 != 0, "score": i / 10, "method": "exact",
                               "detail": {"expected": str(i)} if i % 2 else "ok", "error": None}
    src = tmp_path / "verified.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = ok(export(tmp_path, src, "--format", "parquet", "--only", "passed", "--output", "v.parquet"))
    assert "left out: 2 not passed" in out
    rows = pq.read_table(tmp_path / "v.parquet").to_pylist()
    assert [r["dataset_line"] for r in rows] == [11, 12, 14, 15]
    assert json.loads(rows[0]["row"]) == {"answer": "1", "source": "unit"}
    assert rows[0]["verification"] == {"passed": True, "score": 0.1, "method": "exact", "detail": '{"expected":"1"}',
                                       "error": None}
    assert rows[0]["rollout"] == 0
    assert rows[1]["verification"]["detail"] == "ok" and rows[0]["extra"] is None
    ok(export(tmp_path, src, "--format", "hf", "--output", "vh"))
    assert datasets.load_from_disk(str(tmp_path / "vh"))[4]["verification"]["passed"] is True
    card = (tmp_path / "vh" / "README.md").read_text()
    assert "| pass rate | 66.7% (4 passed, 2 failed) |" in card
    assert card.count("| pass rate |") == 1  # once per table: the export's (the input has no run)
    # the openai form keeps them in metadata and comes back unchanged
    ok(export(tmp_path, src, "--format", "openai", "--output", "v.jsonl"))
    assert lines(tmp_path / "v.jsonl")[1]["metadata"]["verification"]["detail"] == {"expected": "1"}
    ok(export(tmp_path, "v.jsonl", "--format", "sharegpt", "--output", "back.jsonl"))
    back = lines(tmp_path / "back.jsonl")
    assert back == recs and [list(r) for r in back] == [list(r) for r in recs]  # same values, same key order


def test_interrupted_export_leaves_the_old_output_and_no_staging(tmp_path: Path) -> None:
    """The SIGINT must land while the export is under way, whatever the machine's speed: its
    stderr is a pipe the test filled, so the export blocks on its "exporting ..." line (written
    once its staging file exists) until the test has sent the signal and starts reading."""
    import fcntl
    import os
    import signal
    import sys
    import time

    from tests.test_bench_export import bench

    bench.synthesise(tmp_path / "big.jsonl", 50)  # small: the pipe, not the size, holds the export back
    (tmp_path / "out.jsonl").write_text("old export\n")
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETFL, os.O_NONBLOCK)
    filler = 0
    try:
        while True:
            filler += os.write(write_end, b"x" * 4096)
    except BlockingIOError:
        pass
    fcntl.fcntl(write_end, fcntl.F_SETFL, 0)
    proc = subprocess.Popen([sys.executable, "-m", "trajforge", "export", "big.jsonl", "--format", "openai",
                             "--output", "out.jsonl", "--overwrite"], cwd=tmp_path, env=user_env(),
                            stdout=subprocess.PIPE, stderr=write_end)
    os.close(write_end)
    deadline = time.monotonic() + 60
    # Waits for the staging directory: from then on the export cannot pass its first stderr line.
    while not [p for p in tmp_path.iterdir() if p.name.endswith(".export")]:
        assert proc.poll() is None and time.monotonic() < deadline, "the export never began"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    with os.fdopen(read_end, "rb") as r:
        err = r.read()[filler:].decode()
    proc.communicate(timeout=60)
    assert proc.returncode == 130 and "left as it was" in err and "Traceback" not in err, err
    assert (tmp_path / "out.jsonl").read_text() == "old export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.jsonl", "out.jsonl"]
