"""The compressor's command line: flag spellings, errors, config files, both entry points, resume after kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.commands import run_trajforge
from tests.support.compress_data import pairs_intact, read_jsonl, trajectory, write_jsonl
from tests.support.scripted_server import ScriptedServer, chat
from trajforge.cli.compress import main
from trajforge.compress.resume import DurableWriter, Paths
from trajforge.errors import RunStateError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "in.jsonl", [trajectory(i, steps=8, response_words=120) for i in range(3)])


@pytest.mark.parametrize("flags", [["--target_max_tokens=2000"], ["--target_max_tokens", "2000"],
                                   ["--target-max-tokens", "2000"]])
def test_flag_spellings(src: Path, flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([f"--input={src}", "--dry_run", *flags]) == 0
    out = capsys.readouterr().out
    assert "target 2,000 tokens" in out and "to summarise, will fit:         3" in out
    assert sorted(p.name for p in src.parent.iterdir()) == ["in.jsonl"]  # a dry run writes nothing


@pytest.mark.parametrize(("flags", "message"), [
    (["--inptu=x"], "unknown flag --inptu; did you mean --input?"),
    (["--sample_percent=0"], "--sample_percent: invalid value 0"),
    (["--sample_percent=abc"], "invalid value 'abc': must be a number"),
    (["--sample_percent=10", "--sample_by=best"], "--sample_by: invalid value 'best'"),
    (["--target_max_tokens=0"], "--target_max_tokens: invalid value 0"),
    (["--seed"], "expected one argument"),
    (["stray"], "unexpected argument 'stray'"),
])
def test_bad_flags_exit_2_with_one_clear_line(src: Path, flags: list[str], message: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main([f"--input={src}", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("error: ")


def test_missing_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "missing required flag --input" in capsys.readouterr().err
    assert main([f"--input={tmp_path / 'nope.jsonl'}"]) == 2
    assert "nope.jsonl: no such file or directory" in capsys.readouterr().err


def test_reference_config_file_loads_and_unknown_keys_are_named(src: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    reference = {
        "tokenizer": {"name": "cl100k_base", "trust_remote_code": True},
        "compression": {"target_max_tokens": 1500, "summary_target_tokens": 300},
        "protected_turns": {"first_system": True, "first_human": True, "first_gpt": True, "first_tool": True,
                            "last_n_turns": 2},
        "summarization": {"model": "google/gemini-3-flash-preview", "base_url": None,
                          "api_key_env": "OPENROUTER_API_KEY", "temperature": 0.3, "max_retries": 3,
                          "retry_delay": 2},
        "output": {"add_summary_notice": True, "summary_notice_text": "\n\nSummarised.", "output_suffix": "_small"},
        "processing": {"num_workers": 4, "max_concurrent_requests": 50, "skip_under_target": True,
                       "save_over_limit": True, "per_trajectory_timeout": 300},
        "metrics": {"enabled": True, "per_trajectory": True, "output_file": "compression_metrics.json"},
    }
    cfg = tmp_path / "compression.yaml"
    cfg.write_text(yaml.safe_dump(reference), encoding="utf-8")
    assert main([f"--input={src}", f"--config={cfg}", "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert "target 1,500 tokens" in out and "in_small.jsonl" in out
    # the flag wins over the file
    assert main([f"--input={src}", f"--config={cfg}", "--dry_run", "--target_max_tokens=99999"]) == 0
    assert "target 99,999 tokens" in capsys.readouterr().out
    cfg.write_text("compression:\n  target_max_tokenz: 5\n", encoding="utf-8")
    assert main([f"--input={src}", f"--config={cfg}"]) == 2
    assert f"{cfg}: unknown key 'compression.target_max_tokenz'; did you mean 'target_max_tokens'?" in \
        capsys.readouterr().err
    cfg.write_text("protected_turns:\n  last_n_turns: -1\n", encoding="utf-8")
    assert main([f"--input={src}", f"--config={cfg}"]) == 2
    assert "key 'protected_turns.last_n_turns': invalid value -1" in capsys.readouterr().err


def test_trajforge_compress_subcommand(src: Path, tmp_path: Path) -> None:
    proc = run_trajforge("compress", "--input", src, "--dry-run", "--target-max-tokens", "2000", env=os.environ | {
        "PYTHONPATH": str(ROOT / "src")}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "to summarise, will fit:         3" in proc.stdout


def test_second_writer_on_the_same_output_is_refused(tmp_path: Path) -> None:
    paths = Paths.for_output(tmp_path / "out.jsonl")
    first = DurableWriter(paths)
    first.open({"x": 1}, fresh=False)
    try:
        with pytest.raises(RunStateError, match="another compressor is writing"):
            DurableWriter(paths).open({"x": 1}, fresh=False)
    finally:
        first.close()


def _compressor(args: list[str], sigint_ignored: bool = False) -> subprocess.Popen[str]:
    """`sigint_ignored`: started as a non-interactive shell starts a background job."""
    return subprocess.Popen([sys.executable, str(ROOT / "trajectory_compressor.py"), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None)


class _SlowRun:
    """30 trajectories to compress against a summariser that answers in 0.25 s; `saved` is set
    once a periodic checkpoint holds some lines (read from the state file itself, not from a
    count of requests, which a loaded machine can reach before the first save), and from then on
    the summariser stalls."""

    def __init__(self, tmp_path: Path) -> None:
        src = write_jsonl(tmp_path / "in.jsonl", [trajectory(i, steps=8, response_words=120) for i in range(30)])
        self.out = tmp_path / "out.jsonl"
        cfg = tmp_path / "c.yaml"
        cfg.write_text(yaml.safe_dump({"processing": {"max_concurrent_requests": 2},
                                       "summarization": {"max_retries": 0}}), encoding="utf-8")
        self.args = [f"--input={src}", f"--output={self.out}", "--target_max_tokens=1500", f"--config={cfg}"]
        self.saved = threading.Event()

    def slow(self, rec: Any) -> Any:
        if not self.saved.is_set():
            try:
                if json.loads(Paths.for_output(self.out).state.read_text())["output_lines"] > 0:
                    self.saved.set()
            except (OSError, ValueError, KeyError):
                pass
        # Once progress is saved, every answer stalls: the run cannot finish before the test's
        # signal lands, however slow the machine is to deliver it.
        return chat("slow summary", delay=120 if self.saved.is_set() else 0.25)

    def resume(self) -> tuple[str, int]:
        """The same command against a fast summariser: its stdout and how many summaries it asked for."""
        with ScriptedServer(lambda rec: chat("fast summary")) as srv:
            proc = _compressor([*self.args, f"--base_url={srv.url}"])
            stdout, stderr = proc.communicate(timeout=60)
            assert proc.returncode == 0, stderr
            return stdout, len(srv.requests)


def test_resume_after_kill_writes_every_line_once_in_order(tmp_path: Path) -> None:
    run = _SlowRun(tmp_path)
    out, args = run.out, run.args
    with ScriptedServer(run.slow) as srv:
        proc = _compressor([*args, f"--base_url={srv.url}"])
        try:
            assert run.saved.wait(30), proc.stderr.read() if proc.poll() is not None else "no progress"
        finally:
            proc.kill()
            proc.communicate()
        first_requests = len(srv.requests)
    assert proc.returncode == -9
    assert not out.exists()  # never a partial file at the output path
    state = json.loads(Paths.for_output(out).state.read_text())
    assert 0 < state["output_lines"] < 30

    stdout, second_requests = run.resume()
    assert "resuming" in stdout
    assert second_requests == 30 - state["output_lines"]  # finished lines are not summarised again
    assert first_requests + second_requests >= 30
    result = read_jsonl(out)
    assert [r["prompt_index"] for r in result] == list(range(30))
    assert all(pairs_intact(r["conversations"]) for r in result)
    m = json.loads((tmp_path / "out_metrics.json").read_text())
    assert m["summary"]["total_trajectories"] == 30 and m["summary"]["compressed"] == 30
    assert [t["input_line"] for t in m["trajectories"]] == list(range(1, 31))
    assert m["tokens"]["total_after"] == sum(t["tokens_after"] for t in m["trajectories"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "in.jsonl", "out.jsonl", "out_metrics.json"]


def test_resume_with_other_settings_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [trajectory(0, steps=1, response_words=5)])
    paths = Paths.for_output(tmp_path / "in_compressed.jsonl")
    # An unfinished run left by someone else's settings.
    writer = DurableWriter(paths)
    writer.open({"other": True}, fresh=False)
    writer.close()
    assert main([f"--input={src}", "--target_max_tokens=100000"]) == 1
    assert "--fresh" in capsys.readouterr().err
    assert main([f"--input={src}", "--target_max_tokens=100000", "--fresh"]) == 0
    assert read_jsonl(paths.output) == read_jsonl(src)


def test_leftover_checkpoint_without_partial_file_is_ignored(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [trajectory(0, steps=1, response_words=5)])
    paths = Paths.for_output(tmp_path / "in_compressed.jsonl")
    paths.state.write_text('{"version": 1, "output_bytes": 999}', encoding="utf-8")
    assert main([f"--input={src}", "--target_max_tokens=100000"]) == 0
    assert read_jsonl(paths.output) == read_jsonl(src)
    assert not paths.state.exists() and not paths.partial.exists()


def test_an_existing_output_is_replaced_only_with_overwrite(src: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    out, metrics = tmp_path / "out.jsonl", tmp_path / "out_metrics.json"
    out.write_text("precious\n")
    args = [f"--input={src}", f"--output={out}", "--target_max_tokens=100000"]
    assert main(args) == 2
    assert f"--output: {out} exists; pass --overwrite" in capsys.readouterr().err
    assert out.read_text() == "precious\n" and sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]
    out.unlink()
    metrics.write_text("{}")  # a metrics file left without its output is somebody's too
    assert main(args) == 2
    assert f"{metrics} (written beside --output {out}) exists" in capsys.readouterr().err
    assert metrics.read_text() == "{}" and not out.exists()
    assert main([*args, "--overwrite"]) == 0
    assert read_jsonl(out) == read_jsonl(src) and json.loads(metrics.read_text())["summary"]["total_trajectories"] == 3
    assert main(args) == 2  # the finished output is not replaced by running the command again
    assert main([*args, "--overwrite"]) == 0


def test_a_run_file_input_writes_beside_the_run_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "data" / "r"
    write_jsonl(run_dir / "trajectories.jsonl", [trajectory(0, steps=1, response_words=5)])
    (run_dir / "config.json").write_text("{}")
    assert main([f"--input={run_dir / 'trajectories.jsonl'}", "--target_max_tokens=100000"]) == 0
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.json", "trajectories.jsonl"]
    assert (tmp_path / "data" / "r_compressed.jsonl").is_file()


def test_a_named_summariser_without_a_key_is_refused_before_any_file_is_written(
        src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENROUTER_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    assert main([f"--input={src}", "--target_max_tokens=100", "--model=openai/gpt-4o"]) == 2
    assert "summariser: no API key for https://openrouter.ai/api/v1" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]  # no .partial, no checkpoint
    # The default summariser's own name, given by the user, is a named model: refused, not replaced.
    assert main([f"--input={src}", "--target_max_tokens=100", "--model=google/gemini-3-flash-preview"]) == 2
    assert "summariser: no API key" in capsys.readouterr().err
    assert main([f"--input={src}", "--target_max_tokens=100", "--model=local:/no/such.gguf"]) == 2
    assert "no such model file" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_input_that_is_not_trajectories_is_refused_before_any_file_or_summary(tmp_path: Path) -> None:
    """A dataset of prompts given as --input, or a bad line after many good ones: named, exit 2,
    and no `.partial*` file left behind that says to re-run the same command."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "say hi"}\n{"prompt": "say ho"}\n', encoding="utf-8")
    good = [trajectory(i, steps=8, response_words=120) for i in range(5)]  # each needs a summary
    late = write_jsonl(tmp_path / "late.jsonl", good)
    with late.open("a", encoding="utf-8") as f:
        f.write('{"conversations": "not a list"}\n')
    with ScriptedServer(lambda rec: chat("summary")) as srv:
        for src, where in ((prompts, f"{prompts}:1: field 'conversations'"), (late, f"{late}:6: field 'conversations'")):
            proc = _compressor([f"--input={src}", "--target_max_tokens=1500", f"--base_url={srv.url}", "--model=m"])
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 2, err
            assert where in err and "re-run" not in err and "Traceback" not in err, err
        assert srv.requests == []  # not one summary paid for
    assert sorted(p.name for p in tmp_path.iterdir()) == ["late.jsonl", "prompts.jsonl"]


@pytest.mark.parametrize("sig, sigint_ignored", [(signal.SIGTERM, False), (signal.SIGTERM, True), (signal.SIGINT, True)],
                         ids=["sigterm-foreground", "sigterm-background-job", "sigint-background-job"])
def test_sigterm_and_sigint_keep_the_progress_like_ctrl_c(tmp_path: Path, sig: signal.Signals,
                                                          sigint_ignored: bool) -> None:
    """Also in a process whose SIGINT is ignored (a job a script started with `&`, then stopped by
    a scheduler's SIGTERM): it raised KeyboardInterrupt inside a task, leaving a traceback; and
    SIGINT, which such a job ignored, stops it too, as it stops `trajforge run`."""
    run = _SlowRun(tmp_path)
    with ScriptedServer(run.slow) as srv:
        proc = _compressor([*run.args, f"--base_url={srv.url}"], sigint_ignored)
        try:
            assert run.saved.wait(60), "no progress"
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted; re-run the same command to resume" in err, err
    assert "trajectories done) is kept in" in err
    assert not run.out.exists() and Paths.for_output(run.out).partial.exists()
    stdout, _ = run.resume()
    assert "resuming" in stdout and [r["prompt_index"] for r in read_jsonl(run.out)] == list(range(30))


def test_the_dry_run_estimate_holds_against_real_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The tokens after compression depend on the summaries' length: a real run with summaries at
    their ~750-token target lands on the dry run's upper figure, one with summaries of a quarter of
    that where the dry run says (it said "about" the upper figure, 20% off such a run)."""
    import random
    import re

    from trajforge.compress.config import load_config
    from trajforge.compress.tokenize import load_counter

    rng = random.Random(1)
    src = write_jsonl(tmp_path / "in.jsonl", [trajectory(i, steps=rng.randint(1, 14), response_words=rng.randint(20, 300))
                                              for i in range(30)])
    args = [f"--input={src}", "--target_max_tokens=2000"]
    assert main([*args, "--dry_run"]) == 0
    dry = capsys.readouterr().out
    m = re.search(r"tokens: ([\d,]+) -> ([\d,]+) to ([\d,]+), .* ([\d,]+) fewer for each 100 tokens .*summary calls: (\d+)",
                  dry)
    assert m, dry
    before, low, high, per_100, calls = (int(g.replace(",", "")) for g in m.groups())
    counter = load_counter(load_config(None, {}).tokenizer.name)
    assert calls > 5 and per_100 == 100 * calls and low == high - 750 * calls
    for words, n in ((750, "full"), (190, "short")):  # " word" is one cl100k token
        with ScriptedServer(lambda rec: chat(" ".join(["word"] * words))) as srv:
            out = tmp_path / f"{n}.jsonl"
            assert main([*args, f"--output={out}", f"--base_url={srv.url}", "--model=m"]) == 0
        capsys.readouterr()
        after = sum(sum(counter.turn_counts(r["conversations"])) for r in read_jsonl(out))  # the real count
        metrics = json.loads((tmp_path / f"{n}_metrics.json").read_text())
        assert metrics["tokens"]["total_after"] == after and metrics["summarization"]["api_calls"] == calls
        expected = high - calls * (750 - words)  # each summary's own length, where the dry run says
        assert low <= after <= high and abs(after - expected) <= calls * 2, (low, after, expected, high)
