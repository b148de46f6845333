"""The benchmark harness itself (bench/): its scripted server, one small end-to-end scenario through
the real CLI, and the resume-planning measurement on a small synthetic run."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import orjson
import pytest

from tests.conftest import REPO


def _load(name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


throughput = _load("throughput")
resume_plan = _load("resume_plan")
server_mod = _load("server")


def test_scripted_replies_call_terminal_then_answer_with_reasoning() -> None:
    replies = [orjson.loads(r) for r in server_mod.scripted_replies(2, "echo hi")]
    assert len(replies) == 3
    for k, reply in enumerate(replies[:2]):
        msg = reply["choices"][0]["message"]
        assert msg["tool_calls"][0]["function"]["name"] == "terminal"
        assert orjson.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"command": "echo hi"}
        assert msg["tool_calls"][0]["id"] == f"call_{k + 1}" and msg["reasoning"]
    final = replies[2]["choices"][0]
    assert final["finish_reason"] == "stop" and "tool_calls" not in final["message"]
    assert final["message"]["content"] and final["message"]["reasoning"]


def test_scenario_runs_the_cli_end_to_end_and_measures_it(tmp_path: Path) -> None:
    row = asyncio.run(throughput.run_scenario(prompts=6, turns=2, latency=0.05, jitter=0.2, workers=3,
                                              sandbox="local", batch_size=4, workdir=tmp_path))
    assert row["errors"] == 0, row["notes"]
    assert row["requests"] == 6 * 3  # two tool turns and an answer per prompt
    assert 1 <= row["max_in_flight"] <= 3
    assert row["runner_cpu_s"] > 0 and row["peak_rss_mb"] > 10 and row["server_cpu_s"] >= 0
    assert row["ideal_s"] == pytest.approx(2 * 3 * 0.05)  # ceil(6 / 3) rounds x 3 calls x latency
    assert row["efficiency"] == pytest.approx(row["ideal_s"] / row["wall_s"])
    lines = (tmp_path / "out" / "bench" / "trajectories.jsonl").read_bytes().splitlines()
    rec = orjson.loads(lines[0])
    assert rec["tool_stats"]["terminal"] == {"count": 2, "success": 2, "failure": 0}
    assert "bench-42" in rec["conversations"][3]["value"]  # the real command ran in a real shell


def test_the_tokens_scenario_gets_ids_in_one_segment_per_trajectory(tmp_path: Path) -> None:
    row = asyncio.run(throughput.run_scenario(prompts=4, turns=2, latency=0.05, jitter=0.2, workers=2,
                                              sandbox="local", batch_size=4, workdir=tmp_path,
                                              flags=["--capture_tokens"]))
    assert row["errors"] == 0, row["notes"]  # every record has its 3 calls' ids in one segment
    rec = orjson.loads((tmp_path / "out" / "bench" / "trajectories.jsonl").read_bytes().splitlines()[0])
    [seg] = rec["tokens"]["segments"]
    turns = rec["tokens"]["turns"]
    assert sum(seg["loss_mask"]) == 3 * 60 and turns[0]["prompt_tokens"] > 500  # a conversation-sized prompt
    assert seg["input_ids"] == [(i * 7919) % 49152 for i in range(len(seg["input_ids"]))]
    # Without the flag, the same server sends no ids, and the harness counts records without them.
    (tmp_path / "plain").mkdir()
    again = asyncio.run(throughput.run_scenario(prompts=2, turns=1, latency=0.05, jitter=0.2, workers=2,
                                                sandbox="local", batch_size=4, workdir=tmp_path / "plain"))
    assert again["errors"] == 0
    assert throughput.check_output(tmp_path / "plain" / "out" / "bench", 2, 1, tokens=True)[0] == 2


@pytest.mark.parametrize("mode", ["loop", "helper"])
def test_floor_client_runs_the_same_scenario_in_the_same_harness(tmp_path: Path, mode: str) -> None:
    """bench/floor.py is started like the CLI and checked like it: every prompt's command must have
    printed bench-42 in a real shell, and the server must have seen both requests of each prompt."""
    floor = f"{sys.executable} {REPO / 'bench' / 'floor.py'} {mode}"
    row = asyncio.run(throughput.run_scenario(prompts=8, turns=1, latency=0.05, jitter=0.2, workers=3,
                                              sandbox=f"floor:{mode}", batch_size=4, workdir=tmp_path, runner=floor))
    assert row["errors"] == 0, row["notes"]
    assert row["requests"] == 16 and row["runner_cpu_s"] > 0
    assert len((tmp_path / "out" / "bench" / "trajectories.jsonl").read_bytes().splitlines()) == 8


def test_floor_client_counts_a_command_that_did_not_print_the_expected_output(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, bytes]:
        server = server_mod.BenchServer(turns=1, latency=0.01, command="echo something-else")
        await server.start()
        try:
            dataset = tmp_path / "d.jsonl"
            throughput.write_dataset(dataset, 3)
            proc = await asyncio.create_subprocess_exec(
                sys.executable, str(REPO / "bench" / "floor.py"), "helper", "run", f"--dataset_file={dataset}",
                f"--base_url={server.url}", "--num_workers=2", f"--output_dir={tmp_path}", "--run_name=r")
            return await proc.wait(), (tmp_path / "r" / "trajectories.jsonl").read_bytes()
        finally:
            await server.aclose()

    code, lines = asyncio.run(scenario())
    assert code == 1
    errors, _ = throughput.check_output(tmp_path / "r", prompts=3, turns=1)
    assert errors == 3 and len(lines.splitlines()) == 3


def test_capped_scenario_says_where_the_runner_settled(tmp_path: Path) -> None:
    row = asyncio.run(throughput.run_scenario(prompts=40, turns=1, latency=0.1, jitter=0.1, workers=16,
                                              sandbox="local", batch_size=10, workdir=tmp_path, cap=4,
                                              settle=0.5, flags=["--max_retries=50"]))
    assert row["errors"] == 0, row["notes"]
    assert row["cap"] == 4 and row["max_in_flight"] <= 4  # the server never serves more than its cap
    assert row["rejected"] > 0 and row["requests"] == 80 + row["rejected"]
    assert row["late_requests"] > 0 and row["late_mean_in_flight"] is not None
    assert 0 <= row["late_rejected_share"] < row["rejected_share"]


def test_check_output_counts_missing_and_incomplete_trajectories(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    good = {"prompt_index": 0, "completed": True, "tool_stats": {"terminal": {"count": 1, "success": 1}}}
    bad = {"prompt_index": 1, "completed": False, "tool_stats": {"terminal": {"count": 1, "success": 0}}}
    (run / "trajectories.jsonl").write_bytes(orjson.dumps(good) + b"\n" + orjson.dumps(bad) + b"\n")
    samples = {"failed": 1, "failed_by_class": {"timeout": 1, "sandbox": 0}, "discarded": 0,
               "discarded_by_reason": {}}
    (run / "statistics.json").write_bytes(orjson.dumps({"run": {"samples": samples}}))
    errors, notes = throughput.check_output(run, prompts=3, turns=1)
    assert errors == 2  # one incomplete, one missing
    assert any("bad record 1" in n for n in notes) and any("timeout" in n for n in notes)


def test_resume_planning_finds_new_rows_and_failed_samples(capsys: pytest.CaptureFixture[str]) -> None:
    result = resume_plan.main(["--samples", "300", "--extra", "10"])
    # rows 300..309 are new; samples 8, 108, 208 failed before and are retried; 7, 107, 207 were discarded
    assert result["dataset_rows"] == 310 and result["to_run"] == 13 and result["problems"] == 0
    assert result["peak_rss_mb"] > 10 and result["process_wall_s"] > 0
    assert "13 of 310 samples left" in capsys.readouterr().out


def test_table_has_every_column(capsys: pytest.CaptureFixture[str]) -> None:
    row = {name: 1 for name, _ in throughput.COLUMNS} | {"notes": ["x"], "num_workers": 4}
    row.update({k: 1.5 for k in ("latency", "wall_s", "ideal_s", "efficiency", "cpu_ms_per_traj",
                                 "peak_rss_mb", "server_cpu_s")})
    throughput.print_table([row])
    header, line, note = capsys.readouterr().out.splitlines()
    assert header.split() == [name for name, _ in throughput.COLUMNS]
    assert len(line.split()) == len(throughput.COLUMNS) and note.strip() == "[4 workers] x"
