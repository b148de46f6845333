"""The batch job end to end through the real CLI against the scripted model server."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.support.commands import run_trajforge
from tests.conftest import REPO
from tests.support.policies import echo_policy
from tests.support.scripted_server import ScriptedServer
from tests.support.run_state import read_records, statuses


def write_dataset(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


def run_cli(tmp_path: Path, env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_trajforge("run", *args, cwd=tmp_path, env=env, timeout=timeout)


def base_args(server: ScriptedServer, dataset: Path, run_name: str = "r", *extra: str) -> list[str]:
    return [f"--dataset_file={dataset}", "--batch_size=2", f"--run_name={run_name}", f"--base_url={server.url}",
            "--model=scripted-model", "--distribution=terminal_only", "--sandbox=local", *extra]


def test_run_produces_trajectories_with_real_tool_output(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    server.handler = echo_policy(turns=1)
    ds = write_dataset(tmp_path / "ds.jsonl", [f"say token{i}" for i in range(5)])
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds, "r", "--num_workers=3"))
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "data" / "r"
    lines = read_records(run)
    assert [r["prompt_index"] for r in lines] == list(range(5))
    for i, rec in enumerate(lines):
        conv = rec["conversations"]
        assert [t["from"] for t in conv] == ["system", "human", "gpt", "tool", "gpt"]
        assert "<tools>" in conv[0]["value"] and '"terminal"' in conv[0]["value"]
        assert conv[2]["value"].startswith("<think>")
        assert "<tool_call>" in conv[2]["value"]
        resp = conv[3]["value"]
        assert resp.startswith("<tool_response>")
        body = json.loads(resp.removeprefix("<tool_response>\n").removesuffix("\n</tool_response>"))
        assert body["name"] == "terminal" and f"token{i}" in body["content"]["output"]
        assert rec["tool_stats"]["terminal"] == {"count": 1, "success": 1, "failure": 0}
        assert rec["tool_stats"]["browser_click"]["count"] == 0  # normalised over every known tool
        assert rec["completed"] is True and rec["partial"] is False and rec["api_calls"] == 2
        assert rec["metadata"]["batch_num"] == i // 2 and rec["metadata"]["model"] == "scripted-model"
    assert sorted(p.name for p in run.glob("batch_*.jsonl")) == ["batch_0.jsonl", "batch_1.jsonl", "batch_2.jsonl"]
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["run"]["samples"]["finished"] == 5
    assert stats["run"]["tools"]["terminal"]["count"] == 5
    assert stats["run"]["reasoning"]["coverage"] == 1.0
    assert stats["run"]["tokens"]["prompt"] == 5 * 2 * 10
    assert set(statuses(run).values()) == {"done"} and len(statuses(run)) == 5
    assert "api_key" in json.loads((run / "config.json").read_text())


def test_no_reasoning_samples_are_discarded_and_counted(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    server.handler = echo_policy(turns=1, reasoning=False)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a", "say b"])
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds))
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "data" / "r"
    assert (run / "trajectories.jsonl").read_text() == ""
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["run"]["samples"]["discarded_by_reason"] == {"no_reasoning": 2}
    # discarded samples are final: a resume runs nothing
    before = len(server.requests)
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds), "--resume")
    assert proc.returncode == 0, proc.stderr
    assert len(server.requests) == before


def test_keep_no_reasoning_keeps_them(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    server.handler = echo_policy(turns=1, reasoning=False)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a"])
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds), "--keep_no_reasoning")
    assert proc.returncode == 0, proc.stderr
    assert len(read_records(tmp_path / "data" / "r")) == 1


def test_existing_run_needs_resume_or_overwrite(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    server.handler = echo_policy(turns=1)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a", "say b"])
    assert run_cli(tmp_path, clean_env, *base_args(server, ds)).returncode == 0
    traj = (tmp_path / "data" / "r" / "trajectories.jsonl").read_bytes()
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds))
    assert proc.returncode != 0 and "--resume" in proc.stderr and "--overwrite" in proc.stderr
    assert (tmp_path / "data" / "r" / "trajectories.jsonl").read_bytes() == traj
    mine = tmp_path / "data" / "r" / "notes.txt"  # a file of the user's in the run directory
    mine.write_text("kept")
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds), "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert len(read_records(tmp_path / "data" / "r")) == 2
    # --overwrite deletes the run's own files, not its directory, as its --help says
    assert mine.read_text() == "kept"
    help_text = " ".join(run_trajforge("run", "--help", env=clean_env, timeout=60).stdout.split())
    assert "--overwrite delete the run's own files" in help_text and "other files in its directory stay" in help_text


def test_batch_runner_script_from_repo_root_form(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    server.handler = echo_policy(turns=1)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say x"])
    import sys

    proc = subprocess.run([sys.executable, str(REPO / "batch_runner.py"), *base_args(server, ds, "viaroot")],
                          cwd=tmp_path, env=clean_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert len(read_records(tmp_path / "data" / "viaroot")) == 1


def test_mixed_tool_trajectories_load_with_hugging_face_datasets(tmp_path: Path, server: ScriptedServer,
                                                                 clean_env) -> None:
    """Samples that used different tools (and one that used none) load as one schema."""
    from tests.support.scripted_server import chat, tool_call

    def handle(req):
        body = req.body
        prompt = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
        if any(m["role"] == "tool" for m in body["messages"]):
            return chat("finished", reasoning="done")
        if "file" in prompt:
            return chat(None, reasoning="w", tool_calls=[tool_call("write_file", {"path": "f", "content": "x"})])
        if "none" in prompt:
            return chat("no tools needed", reasoning="easy")
        return chat(None, reasoning="t", tool_calls=[tool_call("terminal", {"command": "echo hi"})])

    server.handler = handle
    ds = write_dataset(tmp_path / "ds.jsonl", ["use file", "use terminal", "use none"])
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds))
    assert proc.returncode == 0, proc.stderr
    import datasets

    loaded = datasets.load_dataset("json", data_files=str(tmp_path / "data" / "r" / "trajectories.jsonl"),
                                   split="train", cache_dir=str(tmp_path / "hf-cache"))
    assert loaded.num_rows == 3
    assert loaded[0]["tool_stats"]["write_file"]["count"] == 1
    assert loaded[1]["tool_stats"]["terminal"]["count"] == 1
    assert loaded[2]["tool_stats"]["terminal"]["count"] == 0
