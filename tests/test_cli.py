"""The command line (issue 2 item 2): every SPEC flag in every spelling, usage errors, --help,
--version, the distribution listing, and that bad input stops a run before it touches anything.

Parsing is tested in-process (fast, precise); the entry points themselves (`python
batch_runner.py` from the repo root, `python -m trajforge`) through real subprocesses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, cli
from tests.support.heap import IN_HEAP
from trajforge import __version__
from trajforge.cli import batch_runner_main, main
from trajforge.cli.run import FLAGS, make_parser, parse_run_args
from trajforge.config import RunConfig
from trajforge.catalog.distributions import BUILTIN

# A valid command-line value for every value flag, and what RunConfig must hold afterwards.
VALUES: dict[str, tuple[str, object]] = {
    "dataset_file": ("tasks.jsonl", Path("tasks.jsonl")),
    "batch_size": ("16", 16),
    "run_name": ("my_run", "my_run"),
    "distribution": ("science", "science"),
    "model": ("openai/gpt-5", "openai/gpt-5"),
    "base_url": ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
    "api_key": ("sk-test-key", "sk-test-key"),
    "max_turns": ("20", 20),
    "num_workers": ("8", 8),
    "max_samples": ("50", 50),
    "max_tokens": ("2048", 2048),
    "temperature": ("0.9", 0.9),
    "top_p": ("0.95", 0.95),
    "providers_allowed": ("anthropic,openai", ["anthropic", "openai"]),
    "providers_ignored": ("together,deepinfra", ["together", "deepinfra"]),
    "providers_order": ("openai, anthropic", ["openai", "anthropic"]),
    "provider_sort": ("throughput", "throughput"),
    "reasoning_effort": ("minimal", "minimal"),
    "ephemeral_system_prompt": ("Think step by step.", "Think step by step."),
    "log_prefix_chars": ("40", 40),
    "prefill_messages_file": ("prefill.json", Path("prefill.json")),
    "output_dir": ("out", Path("out")),
    "timeout": ("90.5", 90.5),
    "sample_wall_timeout": ("3600", 3600.0),
    "tool_timeout": ("30", 30.0),
    "request_timeout": ("45", 45.0),
    "max_retries": ("2", 2),
    "seed": ("7", 7),
    "sandbox": ("local", "local"),
    "sandbox_network": ("none", "none"),
    "max_sandboxes": ("3", 3),
    "sandbox_memory": ("2g", "2g"),
    "sandbox_tmp_size": ("64m", "64m"),
    "sandbox_shm_size": ("8m", "8m"),
    "sandbox_disk": ("0", "0"),
    "sandbox_cpu_seconds": ("30", 30),
    "sandbox_cpus": ("0.5", 0.5),
    "sandbox_nproc": ("64", 64),
    "local_instances": ("2", 2),
    "executor": ("local", "local"),
    "ray_address": ("127.0.0.1:6379", "127.0.0.1:6379"),
    "container_engine": ("podman", "podman"),
    "samples_per_prompt": ("4", 4),
    "stop_after_passes": ("2", 2),
    "keep": ("passed", "passed"),
    "check_timeout": ("12.5", 12.5),
    "judge_model": ("judge-model", "judge-model"),
    "judge_base_url": ("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"),
    "judge_api_key_env": ("JUDGE_KEY", "JUDGE_KEY"),
    "judge_threshold": ("0.7", 0.7),
    "max_cost": ("12.5", 12.5),
    "max_cost_per_sample": ("0.25", 0.25),
    "max_tokens_per_sample": ("50000", 50000),
    "adaptive_concurrency": ("false", False),
    "max_requests_per_minute": ("600", 600.0),
    "max_tokens_per_minute": ("200000", 200000.0),
    "fail_on_error": ("0.25", 0.25),
    "pass_threshold": ("0.5", 0.5),
    "timeout_multiplier": ("2.5", 2.5),
    "task_max_cpus": ("2", 2.0),
    "task_max_memory": ("8g", "8g"),
    "task_max_storage": ("20g", "20g"),
    "verifier": ("sealed", "sealed"),
    "policy_version": ("7", 7),
}
BOOLS = ["resume", "overwrite", "verbose", "reasoning_disabled", "skip_invalid", "keep_no_reasoning",
         "keep_workspaces", "retry_sandbox_limits", "capture_tokens", "rebuild"]
# tested on their own below; tasks and agent (exclusive with --dataset_file) in tests/tasks/test_input.py
SPECIAL = ["parallelism", "list_distributions", "config", "tasks", "agent"]
SPEC_FLAGS = ["dataset_file", "batch_size", "run_name", "distribution", "model", "base_url", "api_key", "max_turns",
              "num_workers", "resume", "verbose", "max_samples", "max_tokens", "providers_allowed",
              "providers_ignored", "providers_order", "provider_sort", "reasoning_effort", "reasoning_disabled",
              "ephemeral_system_prompt", "log_prefix_chars", "prefill_messages_file", "list_distributions", "config",
              "output_dir"]


def parse(*argv: str, strict: bool = True) -> RunConfig:
    config, _ = parse_run_args(list(argv), "batch_runner.py", strict_required=strict)
    assert config is not None
    return config


def value_of(config: RunConfig, name: str) -> object:
    v = getattr(config, name)
    return v.get_secret_value() if name == "api_key" else v


def spelled(name: str, value: str, style: str) -> list[str]:
    if style == "equals":
        return [f"--{name}={value}"]
    if style == "space":
        return [f"--{name}", value]
    return [f"--{name.replace('_', '-')}", value]


def test_every_flag_is_known_and_covered_by_this_test() -> None:
    names = [f.name for f in FLAGS]
    assert len(names) == len(set(names))
    assert set(SPEC_FLAGS) <= set(names)
    assert set(names) == set(VALUES) | set(BOOLS) | set(SPECIAL)


@pytest.mark.parametrize("style", ["equals", "space", "dashes"])
def test_every_flag_parses_in_every_spelling(style: str) -> None:
    argv = [a for name, (text, _) in VALUES.items() for a in spelled(name, text, style)]
    argv += [f"--{b.replace('_', '-')}" if style == "dashes" else f"--{b}" for b in BOOLS]
    config = parse(*argv)
    for name, (_, expected) in VALUES.items():
        assert value_of(config, name) == expected, name
    for b in BOOLS:
        assert getattr(config, b) is True, b


def test_the_reference_command_line() -> None:
    c = parse("--dataset_file=data/prompts.jsonl", "--batch_size=10", "--run_name=my_run", "--distribution=image_gen",
              "--model=anthropic/claude-sonnet-4.6", "--num_workers=4", "--max_turns=10", "--resume", "--verbose")
    assert (c.dataset_file, c.batch_size, c.run_name) == (Path("data/prompts.jsonl"), 10, "my_run")
    assert c.distribution == "image_gen" and c.resume and c.verbose
    untouched = parse("--dataset_file=d.jsonl", "--batch_size=1", "--run_name=r")
    assert untouched.max_turns == 10 and untouched.num_workers == 4 and untouched.api_key is None


def test_trajforge_run_needs_only_the_dataset() -> None:
    """SPEC: `trajforge run --dataset_file tasks.jsonl --parallelism 8`."""
    c = parse("--dataset_file", "tasks.jsonl", "--parallelism", "8", strict=False)
    assert c.num_workers == 8 and c.batch_size == 100 and c.run_name == "tasks"
    assert parse("--dataset-file", "x/nightly.v2.jsonl", strict=False).run_name == "nightly.v2"


def test_batch_size_and_run_name_may_come_from_the_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "cli-config.yaml"
    cfg.write_text("parallelism: {max_workers: 16, batch_size: 128}\nrun_name: from_file\n")
    c = parse("--dataset_file=tasks.jsonl", f"--config={cfg}")  # satisfies batch_runner.py's required flags
    assert (c.batch_size, c.run_name, c.num_workers) == (128, "from_file", 16)
    c = parse("--dataset_file", "tasks.jsonl", "--config", str(cfg), "--batch-size", "5", "--num_workers=2")
    assert (c.batch_size, c.num_workers) == (5, 2)  # the command line wins


def test_list_distributions_needs_no_other_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_run_args(["--list_distributions"], "batch_runner.py", strict_required=True)[0] is None
    assert batch_runner_main(["--list_distributions"]) == 0
    listing = capsys.readouterr().out
    assert main(["run", "--list-distributions"]) == 0
    assert main(["distributions"]) == 0
    assert capsys.readouterr().out == listing * 2
    heads = [ln for ln in listing.splitlines() if not ln.startswith(" ")]
    assert heads == [f"{d.name}: {d.description}" for d in BUILTIN.values()] and len(heads) == 17


def test_custom_distributions_are_listed_and_usable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("distributions: {mine: {description: my mix, toolsets: {terminal: 50, web: 20}}}\n")
    assert main(["distributions", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-2:] == ["mine: my mix", "    terminal 50%, web 20%"]
    assert batch_runner_main(["--list_distributions", f"--config={cfg}"]) == 0
    assert capsys.readouterr().out == out
    c = parse("--dataset_file=d.jsonl", "--batch_size=1", "--run_name=r", "--distribution=mine", f"--config={cfg}")
    assert c.all_distributions()[c.distribution].probabilities == {"terminal": 50.0, "web": 20.0}
    cfg.write_text("distributions: {mine: {toolsets: {termnal: 50}}}\n")
    assert main(["distributions", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"{cfg}: key 'distributions.mine.toolsets'" in err and "did you mean 'terminal'" in err


REQUIRED = ["--dataset_file=d.jsonl", "--batch_size=2", "--run_name=r"]


@pytest.mark.parametrize(("argv", "expected"), [
    ([*REQUIRED, "--distribution=defualt"],
     ["--distribution", "'defualt'", "did you mean 'default'?", "allowed: default, image_gen", "mixed_tasks"]),
    (["--dataset_file=d.jsonl", "--batch_size=0", "--run_name=r"], ["--batch_size: invalid value 0: must be at least 1"]),
    ([*REQUIRED, "--provider_sort=fast"], ["--provider_sort: invalid value 'fast'", "'price', 'throughput' or"]),
    ([*REQUIRED, "--reasoning-effort", "huge"], ["--reasoning_effort: invalid value 'huge'", "'minimal'", "'xhigh'"]),
    ([*REQUIRED, "--parallelism=0"], ["--parallelism: invalid value 0: must be at least 1"]),
    (REQUIRED[:2], ["missing required flag --run_name"]),
    (REQUIRED[1:], ["missing required flag --dataset_file"]),
    ([REQUIRED[0]], ["missing required flags --batch_size, --run_name"]),
    ([*REQUIRED, "--bach_size=3"], ["unknown flag --bach_size; did you mean --batch_size?"]),
    ([*REQUIRED, "--num-workrs", "3"], ["unknown flag --num-workrs; did you mean --num_workers?"]),
    ([*REQUIRED, "--frobnicate"], ["unknown flag --frobnicate; see --help"]),
    ([*REQUIRED, "stray"], ["unexpected argument 'stray'"]),
    ([*REQUIRED, "--max_turns=many"], ["--max_turns: invalid value 'many': must be a whole number"]),
    ([*REQUIRED, "--timeout", "soon"], ["--timeout: invalid value 'soon': must be a number"]),
    ([*REQUIRED, "--resume=yes"], ["--resume", "'yes'"]),
    ([*REQUIRED, "--max_turns"], ["--max_turns: expected one argument"]),
    ([*REQUIRED, "--run_name=.."], ["--run_name: invalid value '..': must be a single directory name"]),
    ([*REQUIRED, "--run_name", "/tmp/r"], ["--run_name: invalid value '/tmp/r': must be a single directory name"]),
    ([*REQUIRED, "--max_turns=100000000000000000000000"], ["--max_turns: invalid value 100000000000000000000000: "
                                                           "must be at most 10000"]),
    ([*REQUIRED, "--dataset_file="], ["--dataset_file: is empty (or '.'): give the path of a file"]),
    ([*REQUIRED, "--base-url", "not a url"], ["--base_url: invalid value 'not a url': not a valid URL: needs a "
                                              "scheme (http or https) and a host"]),
])
def test_invalid_input_exits_2_with_one_clear_line(argv: list[str], expected: list[str],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert batch_runner_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "error: " in lines[0]
    for part in expected:
        assert part in lines[0]


def test_several_invalid_values_are_each_reported(capsys: pytest.CaptureFixture[str]) -> None:
    assert batch_runner_main(["--dataset_file=d", "--batch_size=0", "--run_name=r", "--max_turns=0"]) == 2
    assert capsys.readouterr().err.splitlines() == ["error: --batch_size: invalid value 0: must be at least 1",
                                                    "error: --max_turns: invalid value 0: must be at least 1"]


def test_trajforge_run_requires_only_the_dataset(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--batch_size=3"]) == 2
    assert "missing required flag --dataset_file" in capsys.readouterr().err


def test_top_level_flags_behave_like_batch_runner(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dataset_file=d.jsonl"]) == 2
    assert "missing required flags --batch_size, --run_name" in capsys.readouterr().err


def test_unknown_command_and_bare_trajforge(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rnu"]) == 2
    assert "unknown command 'rnu'; did you mean 'run'?" in capsys.readouterr().err
    assert main([]) == 2
    assert "usage: trajforge" in capsys.readouterr().err
    assert main(["--help"]) == 0
    assert "trajforge run --help" in capsys.readouterr().out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"trajforge {__version__}\n"
    assert main(["run", "--version"]) == 0
    assert capsys.readouterr().out == f"trajforge {__version__}\n"


@pytest.mark.parametrize(("prog", "strict"), [("batch_runner.py", True), ("trajforge run", False)])
def test_help_documents_every_flag_with_its_default(prog: str, strict: bool,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    parser = make_parser(prog, strict)
    documented = {a.dest: a.help or "" for a in parser._actions if a.dest not in ("help", "version")}
    assert set(documented) == {f.name for f in FLAGS}
    for dest, text in documented.items():
        assert "[default: " in text or text.endswith("(required)"), dest
    entry = main if prog == "trajforge run" else batch_runner_main
    assert entry(["run", "--help"] if prog == "trajforge run" else ["--help"]) == 0
    out = capsys.readouterr().out
    squeezed = "".join(out.split())  # argparse wraps lines, sometimes inside words
    for name, text in documented.items():
        assert f"--{name}" in out and "".join(text.split()) in squeezed, name
    for name, default in [("max_turns", "10"), ("num_workers", "4"), ("log_prefix_chars", "100"),
                          ("output_dir", "data"), ("model", "anthropic/claude-sonnet-4.6"), ("resume", "off"),
                          ("distribution", "default"), ("seed", "0")]:
        assert f"[default: {default}]" in documented[name], name
    assert "https://openrouter.ai/api/v1" in documented["base_url"]
    assert "$OPENROUTER_API_KEY" in documented["api_key"]
    if strict:
        assert all(documented[f].endswith("(required)") for f in ("dataset_file", "batch_size", "run_name"))
    else:
        assert documented["dataset_file"].endswith("(required)")
        assert "[default: 100]" in documented["batch_size"] and "dataset file" in documented["run_name"]


# ---- the real entry points, in subprocesses ----

def run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def batch_runner(*args: str) -> list[str]:
    return [sys.executable, str(REPO / "batch_runner.py"), *args]


def test_batch_runner_from_the_repo_root_lists_distributions(clean_env: dict[str, str]) -> None:
    env = {k: v for k, v in clean_env.items() if k != "PYTHONPATH"}  # batch_runner.py finds src/ itself
    proc = run([sys.executable, "batch_runner.py", "--list_distributions"], REPO, env)
    assert proc.returncode == 0 and proc.stderr == ""
    heads = [ln.split(":")[0] for ln in proc.stdout.splitlines() if not ln.startswith(" ")]
    assert heads == list(BUILTIN) and len(heads) == 17
    sub = run(cli("distributions"), REPO, clean_env)
    assert sub.returncode == 0 and sub.stdout == proc.stdout


def test_batch_runner_help_and_usage_errors(tmp_path: Path, clean_env: dict[str, str]) -> None:
    proc = run(batch_runner("--help"), tmp_path, clean_env)
    assert proc.returncode == 0 and "usage: batch_runner.py" in proc.stdout
    assert all(f"--{f.name}" in proc.stdout for f in FLAGS)
    proc = run(batch_runner("--dataset_file=d.jsonl", "--batch_size=0", "--run_name=r"), tmp_path, clean_env)
    assert proc.returncode == 2 and proc.stderr == "error: --batch_size: invalid value 0: must be at least 1\n"
    proc = run(batch_runner("--dataset_file=d.jsonl", "--batch_size=4"), tmp_path, clean_env)
    assert proc.returncode == 2 and "missing required flag --run_name" in proc.stderr
    assert not (tmp_path / "data").exists()


def test_version_subprocess(tmp_path: Path, clean_env: dict[str, str]) -> None:
    proc = run(cli("--version"), tmp_path, clean_env)
    assert proc.returncode == 0 and proc.stdout == f"trajforge {__version__}\n"


def test_closed_stdout_is_not_a_traceback(clean_env: dict[str, str]) -> None:
    """`python batch_runner.py --list_distributions | head -1`: the reader leaves early."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write now fails with EPIPE, deterministically
    try:
        proc = subprocess.run(batch_runner("--list_distributions"), stdout=write_end, stderr=subprocess.PIPE,
                              env=clean_env, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert proc.stderr == ""
    assert proc.returncode == 141  # like a process ended by SIGPIPE


def bad_dataset(tmp_path: Path) -> Path:
    ds = tmp_path / "tasks.jsonl"
    ds.write_text('{"prompt": "fine"}\n\n{"prompt": ""}\nnot json\n')
    return ds


NO_MODEL = ["--base_url=http://127.0.0.1:9/v1", "--model=x"]  # would only be contacted after validation


def test_bad_dataset_stops_the_run_before_anything_is_created(tmp_path: Path, clean_env: dict[str, str]) -> None:
    ds = bad_dataset(tmp_path)
    proc = run(cli("run", "--dataset_file", ds.name, "--parallelism", "8", *NO_MODEL), tmp_path, clean_env)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines() == [
        "error: tasks.jsonl: 2 invalid line(s); fix them or pass --skip_invalid to skip them",
        "  tasks.jsonl:3: field 'prompt' is empty",
        "  tasks.jsonl:4: invalid JSON at column 1: invalid literal, expected 'null'"]
    assert proc.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tasks.jsonl"]  # no data/, no run directory


def test_bad_dataset_leaves_an_existing_run_untouched(tmp_path: Path, clean_env: dict[str, str]) -> None:
    ds = bad_dataset(tmp_path)
    run_dir = tmp_path / "data" / "old"
    run_dir.mkdir(parents=True)
    (run_dir / "batch_0.jsonl").write_text('{"prompt_index": 0}\n')
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in run_dir.iterdir()}
    for args in (batch_runner(f"--dataset_file={ds}", "--batch_size=2", "--run_name=old", *NO_MODEL),
                 cli("run", "--dataset-file", str(tmp_path / "missing.jsonl"), "--run-name", "old", "--overwrite",
                     *NO_MODEL)):
        proc = run(args, tmp_path, clean_env)
        assert proc.returncode == 1 and "error: " in proc.stderr
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in run_dir.iterdir()} == before


def test_verbose_prints_the_config_with_the_key_masked(tmp_path: Path, clean_env: dict[str, str]) -> None:
    ds = bad_dataset(tmp_path)
    proc = run(cli("run", f"--dataset_file={ds}", "--verbose", "--api_key=sk-or-SECRET-123", *NO_MODEL),
               tmp_path, clean_env)
    assert proc.returncode == 1
    assert "SECRET" not in proc.stderr + proc.stdout
    printed = json.loads(proc.stderr.splitlines()[0])
    assert printed["api_key"] == "***" and printed["verbose"] is True and printed["run_name"] == "tasks"
    assert printed["batch_size"] == 100 and printed["model"] == "x"


def test_validate_counts_skipped_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ds = bad_dataset(tmp_path)
    assert main(["validate", "--dataset_file", str(ds)]) == 1
    assert f"{ds}:3: field 'prompt' is empty" in capsys.readouterr().err
    assert main(["validate", "--dataset-file", str(ds), "--skip-invalid"]) == 0
    assert capsys.readouterr().out == f"{ds}: 1 valid samples, 0 duplicate prompts, 2 invalid lines skipped\n"
    assert main(["validate", "--dataset_file="]) == 2  # not ".: is a directory"
    assert "--dataset_file: is empty (or '.'): give the path of a file" in capsys.readouterr().err


def test_validate_help_says_what_skip_invalid_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Without it every invalid line is listed, not just the first; with it they are counted, exit 0.
    assert main(["validate", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "stopping at the first" not in help_text
    assert "count the invalid lines and exit 0" in help_text and "listing them (up to 20" in help_text
    ds = tmp_path / "many.jsonl"
    ds.write_text("".join("not json\n" for _ in range(25)) + '{"prompt": "fine"}\n')
    assert main(["validate", "--dataset_file", str(ds)]) == 1
    listed = [line for line in capsys.readouterr().err.splitlines() if line.startswith(f"  {ds}:")]
    assert len(listed) == 20 and listed[1].startswith(f"  {ds}:2: ")


def test_a_verbose_run_never_shows_the_api_key(tmp_path: Path, clean_env: dict[str, str]) -> None:
    """The key reaches neither the terminal nor any file of the run (saved config, checkpoint, statistics)."""
    from tests.support.scripted_server import ScriptedServer, http_error

    (tmp_path / "tasks.jsonl").write_text('{"prompt": "say hi"}\n')
    env = {**clean_env, "OPENROUTER_API_KEY": "sk-env-SECRET-1"}
    with ScriptedServer(lambda req: http_error(500, "down")) as server:  # answers the start's probe, fails the call
        proc = run(cli("run", "--dataset_file=tasks.jsonl", "--verbose", "--api_key=sk-cli-SECRET-2",
                       f"--base_url={server.url}", "--model=x", "--max_retries=0", "--sandbox=local",
                       "--distribution=terminal_only"), tmp_path, env)
    assert proc.returncode == 3, proc.stderr  # its one sample failed: the model's server is down
    assert json.loads(proc.stderr.splitlines()[0])["api_key"] == "***"
    assert "SECRET" not in proc.stdout + proc.stderr
    files = [p for p in (tmp_path / "data").rglob("*") if p.is_file()]
    assert any(p.name == "config.json" for p in files)
    for p in files:
        assert b"SECRET" not in p.read_bytes(), p
    assert json.loads((tmp_path / "data" / "tasks" / "config.json").read_text())["api_key"] == "***"


def _exit_now_child(body: str) -> subprocess.CompletedProcess[str]:
    """`body` then exit_now(3) in a child Python whose stdout and stderr are pipes (block-buffered)."""
    code = "import atexit, sys, threading, time\nfrom trajforge.cli import exit_now\n" + body + "\nexit_now(3)\n"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)


def test_the_fast_exit_still_flushes_the_streams_and_runs_the_atexit_handlers() -> None:
    """exit_now skips the interpreter's teardown, not what the teardown is for: text still in the
    streams' buffers, atexit handlers (registered last, run first), the exit code."""
    done = _exit_now_child("atexit.register(print, 'handler ran'); print('x' * 5000, end='|');"
                           "print('to stderr', file=sys.stderr, end='')")
    assert done.returncode == 3
    assert done.stdout == "x" * 5000 + "|handler ran\n"
    assert done.stderr == "to stderr"


def test_the_fast_exit_skips_the_teardown_through_public_atexit_alone() -> None:
    """The module-level object's __del__ would print during the interpreter's teardown: the fast
    exit ends the process before it. And it gets there without atexit's private _run_exitfuncs."""
    import ast

    done = _exit_now_child("class A:\n    def __del__(self): print('teardown ran')\na = A()\n"
                           "atexit.register(print, 'handler ran')")
    assert (done.returncode, done.stdout) == (3, "handler ran\n"), done.stderr
    source = ast.parse((REPO / "src" / "trajforge" / "cli" / "__init__.py").read_text())
    private = [n.attr for n in ast.walk(source) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
               and n.value.id == "atexit" and n.attr.startswith("_")]
    assert private == []


def test_the_fast_exit_waits_for_a_thread_that_still_works() -> None:
    """A non-daemon thread alive at the end: the normal exit, which joins it, is taken instead."""
    done = _exit_now_child("threading.Thread(target=lambda: (time.sleep(0.5), print('thread finished'))).start()")
    assert done.returncode == 3 and done.stdout == "thread finished\n"


def test_python_m_trajforge_and_the_console_script_exit_with_mains_code(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    for argv in ([sys.executable, "-m", "trajforge"], [str(Path(sys.executable).parent / "trajforge")]):
        done = subprocess.run([*argv, "--version"], capture_output=True, text=True, env=env, timeout=60)
        assert (done.returncode, done.stdout) == (0, f"trajforge {__version__}\n"), argv
        done = subprocess.run([*argv, "nosuch"], capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 2 and "unknown command 'nosuch'" in done.stderr, argv


def test_the_fast_exit_copes_with_a_stdout_that_is_gone() -> None:
    """Closed and set to None (a detached process): the exit code and stderr still come out."""
    done = _exit_now_child("sys.stdout.close(); sys.stdout = None; print('still here', file=sys.stderr, end='')")
    assert (done.returncode, done.stderr) == (3, "still here")


def test_the_command_keeps_a_256_kib_buffer_in_the_heap() -> None:
    """tune_allocator: the buffer an asyncio transport reads into (256 KiB) comes from the heap
    instead of an mmap and munmap per read. Where a block lands is read from /proc/self/maps;
    the first half shows glibc's default does map it, so the second can fail."""
    code = IN_HEAP + """
from trajforge.cli import tune_allocator
before = tuned()
tune_allocator()
print(before, tuned())
"""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.stdout.split() == ["False", "True"], done.stderr


@pytest.mark.parametrize("script", ["batch_runner.py", "trajectory_compressor.py"])
def test_the_reference_entry_scripts_tune_the_allocator_too(script: str) -> None:
    """They are processes of their own that read model replies, like the `trajforge` command."""
    code = IN_HEAP + f"""
import runpy, sys
sys.argv = [{script!r}, "--help"]
try:
    runpy.run_path({str(REPO / script)!r}, run_name="__main__")
except SystemExit:
    pass
print("tuned:", tuned())
"""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "tuned: True", done.stderr
