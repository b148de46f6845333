"""Error paths of the runner as a user meets them: damaged files, a full or read-only disk, a closed
pipe, leftovers of a killed run, contradicting flags. Each ends in one clear line, loses nothing,
and a later --resume finishes every sample exactly once."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import cli
from tests.support.policies import echo_policy, tool_messages, user_prompt
from tests.support.scripted_server import Recorded, Reply, ScriptedServer, chat, http_error, tool_call
from tests.support.run_state import read_records, statuses
from tests.runner.test_e2e import base_args, run_cli, write_dataset
from trajforge.runner.reporting.progress import Progress


def _can_mount() -> str | None:
    if os.geteuid() != 0:
        return "mounting a small tmpfs needs root"
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", d], capture_output=True, text=True)
        if proc.returncode != 0:
            return f"cannot mount a tmpfs here: {proc.stderr.strip()}"
        subprocess.run(["umount", d], check=True)
    return None


_NO_MOUNT = _can_mount()
needs_mount = pytest.mark.skipif(_NO_MOUNT is not None, reason=_NO_MOUNT or "")


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` at `path`: a disk that fills up, or turns read-only, on demand."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def remount(path: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(path)], check=True)


def fill(path: Path, leave: int) -> Path:
    """Fill the file system of `path` until only `leave` bytes are free."""
    st = os.statvfs(path)
    filler = path / "filler"
    with filler.open("wb") as f:
        f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))
    return filler


def big_answer_policy(size: int) -> object:
    """One `terminal` turn, then an answer of `size` characters: records of a known, large size."""

    def handle(req: Recorded) -> Reply:
        if not tool_messages(req.body):
            word = user_prompt(req.body).split()[-1]
            return chat(None, tool_calls=[tool_call("terminal", {"command": f"echo {word}"})], reasoning="Run it.")
        return chat("Done " + "x" * size, reasoning="Finished.")

    return handle


def assert_one_clear_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode not in (0, 2), proc.stderr
    assert "Traceback" not in proc.stderr and "ExceptionGroup" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def assert_every_sample_once(run: Path, prompts: list[str]) -> None:
    lines = read_records(run)
    assert Counter(r["conversations"][1]["value"] for r in lines) == Counter(prompts)
    assert [r["prompt_index"] for r in lines] == list(range(len(prompts)))
    stats = json.loads((run / "statistics.json").read_text())
    assert stats["run"]["samples"]["finished"] == len(prompts)


# 1. A record cut short in the middle of a batch file -----------------------------------------------

def test_record_cut_short_mid_file_is_run_again_and_counted(tmp_path: Path, server: ScriptedServer,
                                                            clean_env) -> None:
    server.handler = echo_policy(turns=1)
    prompts = [f"say m{i}" for i in range(12)]
    ds = write_dataset(tmp_path / "ds.jsonl", prompts)
    args = base_args(server, ds, "r", "--batch_size=12")
    assert run_cli(tmp_path, clean_env, *args).returncode == 0
    run = tmp_path / "data" / "r"
    batch = run / "batch_0.jsonl"
    lines = batch.read_bytes().splitlines(keepends=True)
    victim = json.loads(lines[5])["conversations"][1]["value"]
    lines[5] = lines[5][: len(lines[5]) // 2] + b"\n"  # a disk or copy error: the newline survived
    batch.write_bytes(b"".join(lines))
    before = len(server.requests)
    proc = run_cli(tmp_path, clean_env, *args, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert "recovered 1 sample" in proc.stderr
    assert len(server.requests) == before + 2  # exactly the damaged sample ran again (2 model calls)
    assert victim in json.dumps(server.requests[-1].body)
    assert_every_sample_once(run, prompts)
    again = run_cli(tmp_path, clean_env, *args, "--resume")  # and it stays finished
    assert again.returncode == 0 and len(server.requests) == before + 2 and "recovered" not in again.stderr
    assert_every_sample_once(run, prompts)


def test_recovered_sample_that_fails_again_counts_as_failed(tmp_path: Path, server: ScriptedServer,
                                                             clean_env) -> None:
    server.handler = echo_policy(turns=1)
    prompts = [f"say n{i}" for i in range(4)]
    ds = write_dataset(tmp_path / "ds.jsonl", prompts)
    args = base_args(server, ds, "r", "--batch_size=4")
    assert run_cli(tmp_path, clean_env, *args).returncode == 0
    run = tmp_path / "data" / "r"
    batch = run / "batch_0.jsonl"
    lines = batch.read_bytes().splitlines(keepends=True)
    batch.write_bytes(b"".join(lines[:1] + [lines[1][:40] + b"\n"] + lines[2:]))
    server.handler = lambda req: http_error(400, "down")
    proc = run_cli(tmp_path, clean_env, *args, "--resume")
    assert proc.returncode == 3, proc.stderr  # the recovered sample failed: a failed sample's exit code
    stats = json.loads((run / "statistics.json").read_text())["run"]["samples"]
    assert (stats["finished"], stats["failed"]) == (3, 1)
    assert Counter(statuses(run).values()) == {"done": 3, "failed": 1}


# 2. Checkpoints of the wrong shape, read-only and full disks, other OS errors -----------------------

@pytest.mark.parametrize("samples", [{"x": "y"}, [1], {"abc": {"status": "exploded", "batch": 0, "attempts": 1}}])
def test_checkpoint_of_the_wrong_shape_is_refused_like_a_corrupt_one(tmp_path: Path, server: ScriptedServer,
                                                                     clean_env, samples: object) -> None:
    server.handler = echo_policy(turns=1)
    prompts = ["say a", "say b", "say c"]
    ds = write_dataset(tmp_path / "ds.jsonl", prompts)
    args = base_args(server, ds)
    assert run_cli(tmp_path, clean_env, *args).returncode == 0
    run = tmp_path / "data" / "r"
    ckpt = json.loads((run / "checkpoint.json").read_text())
    ckpt["samples"] = samples
    (run / "checkpoint.json").write_text(json.dumps(ckpt))
    write_dataset(ds, [*prompts, "say d"])
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"}
    proc = run_cli(tmp_path, clean_env, *args, "--resume")
    assert_one_clear_error(proc, "checkpoint.json", "move it away")
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"} == before
    (run / "checkpoint.json").rename(tmp_path / "bad-checkpoint.json")
    proc = run_cli(tmp_path, clean_env, *args, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert_every_sample_once(run, [*prompts, "say d"])


@needs_mount
def test_resume_in_a_read_only_run_directory(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    server.handler = echo_policy(turns=1)
    prompts = ["say a", "say b"]
    ds = write_dataset(tmp_path / "ds.jsonl", prompts)
    with tmpfs(tmp_path / "out", "4m") as out:
        args = base_args(server, ds, "r", f"--output_dir={out}")
        assert run_cli(tmp_path, clean_env, *args).returncode == 0
        write_dataset(ds, [*prompts, "say c"])
        remount(out, "ro")
        proc = run_cli(tmp_path, clean_env, *args, "--resume")
        assert_one_clear_error(proc, str(out / "r" / ".lock"), "Read-only", "writable", "--resume")
        remount(out, "rw")
        proc = run_cli(tmp_path, clean_env, *args, "--resume")
        assert proc.returncode == 0, proc.stderr
        assert_every_sample_once(out / "r", [*prompts, "say c"])


@needs_mount
def test_disk_full_while_writing_batch_lines(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    server.handler = big_answer_policy(40_000)
    prompts = [f"say e{i}" for i in range(5)]
    ds = write_dataset(tmp_path / "ds.jsonl", prompts)
    with tmpfs(tmp_path / "out", "2m") as out:
        args = base_args(server, ds, "r", f"--output_dir={out}", "--batch_size=10", "--num_workers=1")
        assert run_cli(tmp_path, clean_env, *args).returncode == 0
        run = out / "r"
        old = (run / "trajectories.jsonl").read_bytes()
        more = [*prompts, *(f"say e{i}" for i in range(5, 10))]
        write_dataset(ds, more)
        filler = fill(out, 24_000)  # room for config.json and the checkpoint, not for one 40 KB record
        proc = run_cli(tmp_path, clean_env, *args, "--resume")
        assert_one_clear_error(proc, str(run / "batch_0.jsonl"), "No space left on device", "--resume")
        assert (run / "trajectories.jsonl").read_bytes() == old and not list(run.glob(".*.tmp"))
        assert len(read_records(run)) == 5
        filler.unlink()
        calls = len(server.requests)
        proc = run_cli(tmp_path, clean_env, *args, "--resume")
        assert proc.returncode == 0, proc.stderr
        assert "removed a torn last line" in proc.stderr  # the part of the record that fitted
        assert len(server.requests) == calls + 2 * 5  # only the 5 new samples ran
        assert_every_sample_once(run, more)


@needs_mount
def test_disk_filling_up_mid_run(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    server.handler = big_answer_policy(40_000)
    prompts = [f"say f{i}" for i in range(30)]  # ~1.2 MB of records for a 512 KB disk
    ds = write_dataset(tmp_path / "ds.jsonl", prompts)
    with tmpfs(tmp_path / "out", "512k") as out:
        args = base_args(server, ds, "r", f"--output_dir={out}", "--batch_size=10", "--num_workers=2")
        proc = run_cli(tmp_path, clean_env, *args)
        line = assert_one_clear_error(proc, "No space left on device", "--resume", str(out / "r"))
        assert "batch_" in line or "checkpoint.json" in line  # whichever write found the disk full first
        run = out / "r"
        assert not (run / "trajectories.jsonl").exists() and not list(run.glob(".*.tmp"))
        kept = sum(len(p.read_bytes().splitlines()) for p in run.glob("batch_*.jsonl"))
        assert 0 < kept < len(prompts)
        calls = len(server.requests)
        remount(out, "size=16m")
        proc = run_cli(tmp_path, clean_env, *args, "--resume")
        assert proc.returncode == 0, proc.stderr
        assert_every_sample_once(run, prompts)
        # what was written before the disk filled was kept: at most the torn line's sample and the
        # few in flight at the failure ran again, never the whole run
        assert len(server.requests) - calls <= 2 * (len(prompts) - kept + 1)


@needs_mount
def test_disk_full_while_writing_the_checkpoint(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    server.handler = lambda req: http_error(400, "refused: " + "r" * 400)  # failures fill the checkpoint
    prompts = [f"say c{i}" for i in range(60)]
    ds = write_dataset(tmp_path / "ds.jsonl", prompts)
    with tmpfs(tmp_path / "out", "2m") as out:
        args = base_args(server, ds, "r", f"--output_dir={out}", "--num_workers=8")
        assert run_cli(tmp_path, clean_env, *args).returncode == 3  # every sample failed, as intended
        run = out / "r"
        size = (run / "checkpoint.json").stat().st_size
        assert size > 24_000
        filler = fill(out, 12_000)  # room for config.json, not for a new checkpoint
        before = (run / "checkpoint.json").read_bytes()
        proc = run_cli(tmp_path, clean_env, *args, "--resume")
        assert_one_clear_error(proc, str(run / "checkpoint.json"), "No space left on device", "--resume")
        assert (run / "checkpoint.json").read_bytes() == before and not list(run.glob(".*.tmp"))
        filler.unlink()
        server.handler = echo_policy(turns=1)
        proc = run_cli(tmp_path, clean_env, *args, "--resume")
        assert proc.returncode == 0, proc.stderr
        assert_every_sample_once(run, prompts)


JOURNAL_ROOM = 20000


@needs_mount
def test_disk_full_while_committing_the_journal(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    """Outcomes go to journal.jsonl as committed groups: a group the disk had no room for is cut
    at the next start, and the samples it held run again (nothing of theirs reached a record)."""
    server.handler = lambda req: http_error(400, "refused: " + "r" * 400)  # failures: journal lines, no records
    prompts = [f"say j{i}" for i in range(80)]
    ds = write_dataset(tmp_path / "ds.jsonl", prompts)
    with tmpfs(tmp_path / "out", "4m") as out:
        args = base_args(server, ds, "r", f"--output_dir={out}", "--num_workers=8")
        filler = fill(out, JOURNAL_ROOM)  # room for the run's first files, not for its journal
        proc = run_cli(tmp_path, clean_env, *args)
        run = out / "r"
        assert_one_clear_error(proc, str(run / "journal.jsonl"), "No space left on device", "--resume")
        filler.unlink()
        server.handler = echo_policy(turns=1)
        proc = run_cli(tmp_path, clean_env, *args, "--resume")
        assert proc.returncode == 0, proc.stderr
        assert_every_sample_once(run, prompts)


@needs_mount
@pytest.mark.parametrize("merge", ["whole", "append"])
def test_disk_full_during_the_final_merge(tmp_path: Path, server: ScriptedServer, clean_env, merge: str) -> None:
    """A new first row moves every other one: trajectories.jsonl is written anew, and there is no
    room for it. A new last row is appended to it, and there is no room for that either."""
    server.handler = big_answer_policy(40_000)
    prompts = [f"say g{i}" for i in range(20)]
    ds = write_dataset(tmp_path / "ds.jsonl", prompts)
    with tmpfs(tmp_path / "out", "4m") as out:
        args = base_args(server, ds, "r", f"--output_dir={out}", "--batch_size=10")
        assert run_cli(tmp_path, clean_env, *args).returncode == 0
        run = out / "r"
        old = (run / "trajectories.jsonl").read_bytes()
        assert len(old) > 600_000
        prompts = ["say new", *prompts] if merge == "whole" else [*prompts, "say new"]
        write_dataset(ds, prompts)
        # room for the new sample's record (40 KB), not for a new trajectories.jsonl, nor, when it
        # is appended to, for the record once more
        filler = fill(out, 300_000 if merge == "whole" else 64_000)
        proc = run_cli(tmp_path, clean_env, *args, "--resume")
        assert_one_clear_error(proc, str(run / "trajectories.jsonl"), "No space left on device", "--resume")
        assert (run / "trajectories.jsonl").read_bytes() == old and not list(run.glob(".*.tmp"))
        filler.unlink()
        calls = len(server.requests)
        proc = run_cli(tmp_path, clean_env, *args, "--resume")
        assert proc.returncode == 0, proc.stderr
        assert len(server.requests) == calls  # the new sample was kept from the failed invocation
        assert_every_sample_once(run, prompts)


@pytest.mark.parametrize(("name", "plant"), [("statistics.json", "dir"), ("batch_0.jsonl", "dir"),
                                             ("batch_0.jsonl", "fifo")])
def test_other_os_error_on_a_file_of_the_run(tmp_path: Path, server: ScriptedServer, clean_env, name: str,
                                             plant: str) -> None:
    server.handler = echo_policy(turns=1)
    prompts = ["say a", "say b"]
    ds = write_dataset(tmp_path / "ds.jsonl", prompts)
    args = base_args(server, ds, "r", "--batch_size=10")
    assert run_cli(tmp_path, clean_env, *args).returncode == 0
    run = tmp_path / "data" / "r"
    (run / name).rename(tmp_path / name)
    if plant == "dir":  # a path of the run that cannot be read or replaced: EISDIR
        (run / name).mkdir()
        (run / name / "x").write_text("x")
    else:  # scanning a FIFO batch file for finished samples used to block the resume forever
        os.mkfifo(run / name)
    proc = run_cli(tmp_path, clean_env, *args, "--resume")  # run_cli's timeout catches a hang
    assert_one_clear_error(proc, f"data/r/{name}", "Is a directory" if plant == "dir" else "not a regular file",
                           "--resume")
    if plant == "dir":
        (run / name / "x").unlink()
        (run / name).rmdir()
    else:
        (run / name).unlink()
    (tmp_path / name).rename(run / name)
    calls = len(server.requests)
    proc = run_cli(tmp_path, clean_env, *args, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert len(server.requests) == calls
    assert_every_sample_once(run, prompts)


# 3. Nobody reads stdout or stderr any more ---------------------------------------------------------

@pytest.mark.parametrize("closed", ["stdout", "both"])
def test_closed_output_streams_do_not_stop_the_run(tmp_path: Path, server: ScriptedServer, clean_env,
                                                   closed: str) -> None:
    server.handler = echo_policy(turns=1, delay=0.05)
    prompts = [f"say p{i}" for i in range(8)]
    ds = write_dataset(tmp_path / "ds.jsonl", prompts)
    err = subprocess.PIPE if closed == "both" else subprocess.DEVNULL
    p = subprocess.Popen(cli("run", *base_args(server, ds), "--verbose"), cwd=tmp_path, env=clean_env,
                         stdout=subprocess.PIPE, stderr=err)
    assert p.stdout is not None
    p.stdout.close()  # `| head -1` that already left
    if p.stderr is not None:
        p.stderr.close()
    assert p.wait(120) == 0
    assert_every_sample_once(tmp_path / "data" / "r", prompts)


# 4. Leftovers of a killed run ------------------------------------------------------------------------

def test_temporary_files_of_a_killed_merge_are_removed_at_the_next_start(tmp_path: Path, server: ScriptedServer,
                                                                         clean_env) -> None:
    server.handler = echo_policy(turns=1)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a", "say b"])
    args = base_args(server, ds)
    assert run_cli(tmp_path, clean_env, *args).returncode == 0
    run = tmp_path / "data" / "r"
    # what SIGKILL during the final merge and a checkpoint save leaves behind
    (run / ".trajectories.jsonl.k3j9x2.tmp").write_bytes(b"x" * 3_000_000)
    (run / ".checkpoint.json.a8f0q1.tmp").write_bytes(b"{")
    proc = run_cli(tmp_path, clean_env, *args, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert "removed 2 temporary file(s)" in proc.stderr
    assert not list(run.glob(".*.tmp"))
    assert_every_sample_once(run, ["say a", "say b"])


def test_torn_last_line_is_cut_once_not_reported_on_every_resume(tmp_path: Path, server: ScriptedServer,
                                                                 clean_env) -> None:
    server.handler = echo_policy(turns=1)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a", "say b"])
    args = base_args(server, ds, "r", "--batch_size=10")
    assert run_cli(tmp_path, clean_env, *args).returncode == 0
    batch = tmp_path / "data" / "r" / "batch_0.jsonl"
    good = batch.read_bytes()
    batch.write_bytes(good + good.splitlines(keepends=True)[0][:100])  # a crash mid-write of a duplicate
    first = run_cli(tmp_path, clean_env, *args, "--resume")
    assert first.returncode == 0, first.stderr
    assert "removed a torn last line of 100 bytes" in first.stderr
    assert batch.read_bytes() == good
    second = run_cli(tmp_path, clean_env, *args, "--resume")
    assert second.returncode == 0 and "torn" not in second.stderr, second.stderr


# 5. Settings that can only fail (or harm) are refused before any work ----------------------------------

HUGE = "100000000000000000000000"  # beyond 64 bits: once passed validation, then crashed the started run

CONTRADICTIONS = [
    (["--sandbox=local", "--sandbox_network=none"], "--sandbox local cannot apply --sandbox_network none"),
    (["--resume", "--overwrite"], "--resume and --overwrite"),
    (["--reasoning_disabled", "--reasoning_effort=high"], "--reasoning_disabled contradicts --reasoning_effort"),
    (["--reasoning_disabled"], "would discard every sample"),
    (["--providers_allowed=a,b", "--providers_ignored=b"], "both name b"),
    (["--ray_address=127.0.0.1:6379"], "--ray_address is only used with --executor ray"),
    (["--executor=ray", "--keep_workspaces"], "--keep_workspaces is not supported with --executor ray"),
]
_ONE_NAME = "must be a single directory name (no '/' or NUL character, not '.' or '..')"
BAD_VALUES = [
    # a run name that is not one new directory under data/: `..` made the current directory the run's,
    # and --overwrite then deleted its trajectories.jsonl and workspaces/
    (["--run_name=..", "--overwrite"], f"--run_name: invalid value '..': {_ONE_NAME}"),
    (["--run_name=.", "--overwrite"], f"--run_name: invalid value '.': {_ONE_NAME}"),
    (["--run_name={tmp}/elsewhere"], "--run_name: invalid value '{tmp}/elsewhere': must be a single directory name"),
    (["--run_name=../escape"], "--run_name: invalid value '../escape': must be a single directory name"),
    *[([f"--{flag}={HUGE}"], f"--{flag}: invalid value {HUGE}: must be at most {bound}")
      for flag, bound in [("batch_size", 1_000_000), ("max_samples", 1_000_000_000), ("max_turns", 10_000),
                          ("max_tokens", 10_000_000), ("max_retries", 10_000), ("seed", 2**63 - 1)]],
    (["--dataset_file="], "--dataset_file: is empty (or '.'): give the path of a file"),
    (["--config="], "--config: invalid value '': must be the path of a YAML file"),
    (["--base_url", "not a url"], "--base_url: invalid value 'not a url': not a valid URL: needs a scheme "
                                  "(http or https) and a host"),
    (["--judge_base_url=127.0.0.1:8000/v1"], "--judge_base_url: invalid value '127.0.0.1:8000/v1': not a valid URL"),
]
BAD_CONFIG_FILES = [
    ("run_name: '..'\noverwrite: true\n", f"cfg.yaml: key 'run_name': invalid value '..': {_ONE_NAME}"),
    ('run_name: "a\\0b"\n', "cfg.yaml: key 'run_name': invalid value 'a\\x00b': must be a single directory name"),
    (f"batch_size: {HUGE}\n", f"cfg.yaml: key 'batch_size': invalid value {HUGE}: must be at most 1000000"),
    (f"task_types: {{code: {{retry_limit: {HUGE}}}}}\n", "cfg.yaml: key 'task_types.code.retry_limit': invalid "
                                                      f"value {HUGE}: must be at most 1000"),
    (f"tools: {{web: {{max_bytes: {HUGE}}}}}\n", f"cfg.yaml: key 'tools.web.max_bytes': invalid value {HUGE}: "
                                              "must be at most 1073741824"),
    (f"tools: {{moa: {{min_successes: {HUGE}}}}}\n", "cfg.yaml: key 'tools.moa.min_successes': invalid value"),
    (f"sandbox_disk: {HUGE}t\n", f"cfg.yaml: key 'sandbox_disk': invalid value '{HUGE}t': must be at most 16t"),
    ("x: " + "[" * 5000 + "]" * 5000 + "\n", "cfg.yaml: not valid YAML: collections nested too deeply to read"),
    ("dataset_file: ''\n", "cfg.yaml: key 'dataset_file': is empty"),
    ("base_url: localhost:8000\n", "cfg.yaml: key 'base_url': invalid value 'localhost:8000': not a valid URL"),
]


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize(("flags", "config", "named"), [
    *[pytest.param(flags, None, named, id=" ".join(flags)) for flags, named in CONTRADICTIONS + BAD_VALUES],
    *[pytest.param([], text, named, id=f"cfg {text[:40].strip()}") for text, named in BAD_CONFIG_FILES],
])
def test_bad_or_contradicting_settings_are_refused_at_start(tmp_path: Path, server: ScriptedServer, clean_env,
                                                            flags: list[str], config: str | None, named: str) -> None:
    server.handler = echo_policy(turns=1)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a"])
    args = base_args(server, ds)
    if config is not None:
        (tmp_path / "cfg.yaml").write_text(config)
        in_file = set(re.findall(r"^(\w+):", config, re.M))  # the file's keys: the flags must not override them
        args = [a for a in args if a.split("=")[0].removeprefix("--") not in in_file] + ["--config=cfg.yaml"]
    # what a run directory of `.` or `..` would clobber: none of it may be created, changed or deleted
    (tmp_path / "trajectories.jsonl").write_text('{"mine": 1}\n')
    (tmp_path / "workspaces").mkdir()
    (tmp_path / "workspaces" / "important.txt").write_text("user data\n")
    before = _tree(tmp_path)
    proc = run_cli(tmp_path, clean_env, *args, *(f.format(tmp=tmp_path) for f in flags))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()  # one line per problem, nothing else (several contradictions: several)
    assert lines and all(line.startswith("error: ") for line in lines), proc.stderr
    assert any(named.format(tmp=tmp_path) in line for line in lines), proc.stderr
    assert not server.requests and _tree(tmp_path) == before


def test_a_run_name_taken_from_the_dataset_file_is_checked_too(tmp_path: Path, server: ScriptedServer,
                                                               clean_env) -> None:
    # `...jsonl` gives the stem `..`: the run directory would be data/.., i.e. the current one
    server.handler = echo_policy(turns=1)
    ds = write_dataset(tmp_path / "...jsonl", ["say a"])
    args = [a for a in base_args(server, ds) if not a.startswith("--run_name")]
    (tmp_path / "trajectories.jsonl").write_text('{"mine": 1}\n')
    before = _tree(tmp_path)
    proc = run_cli(tmp_path, clean_env, *args, "--overwrite")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == ("error: the run name taken from --dataset_file, '..', must be a single "
                                   "directory name (no '/' or NUL character, not '.' or '..'); give --run_name")
    assert not server.requests and _tree(tmp_path) == before


# 8. The status line before the first sample finishes --------------------------------------------------

def test_status_line_has_no_nan_eta_before_the_first_sample() -> None:
    class Sink:
        text = ""

        def write(self, s: str) -> None:
            self.text += s

        def flush(self) -> None:
            pass

        def isatty(self) -> bool:
            return False

    p = Progress(10, already=2, stream=Sink())  # type: ignore[arg-type]
    assert "nan" not in p.line() and p.line().endswith("eta -")


# issue 21: a record dropped by the hallucinated-tool filter is discarded in checkpoint.json ----------

def test_hallucinated_tool_record_is_discarded_in_the_checkpoint(tmp_path: Path, server: ScriptedServer,
                                                                 clean_env) -> None:
    def handle(req: Recorded) -> Reply:
        if "stray" in user_prompt(req.body) and not tool_messages(req.body):
            return chat(None, reasoning="r", tool_calls=[tool_call("web_search", {"query": "x"})])
        return echo_policy(1)(req)

    server.handler = handle
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a", "say stray"])
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds))
    assert proc.returncode == 0, proc.stderr
    from tests.support.run_state import outcomes
    found = {e.status: e.reason for e in outcomes(tmp_path / "data" / "r").values()}
    assert found == {"done": None, "discarded": "hallucinated_tool"}
