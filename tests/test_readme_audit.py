"""What a README audit found a new user hits (issue 37, part 4), each through the real CLI where
there is behaviour to check, and against the README's own text where the fix was to it."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, cli
from tests.support.policies import echo_policy, tool_messages, user_prompt
from tests.support.scripted_server import Recorded, Reply, ScriptedServer, chat, http_error, tool_call, with_usage
from tests.runner.test_e2e import base_args, run_cli, write_dataset
from tests.support.run_state import read_records
from tests.support.docs import nav_pages, page
from trajforge.runner.console import SafeStream

README = page("README.md")
SANDBOXES = page("sandboxes.md")
ARCHITECTURE = page("architecture.md")


def _paragraph(starting: str, text: str = SANDBOXES) -> str:
    start = text.index(starting)
    return text[start:text.index("\n- ", start + 1)]


def test_the_readme_does_not_claim_docker_support_it_cannot_have_tested() -> None:
    container = re.sub(r"\s+", " ", _paragraph("- `container`: a container per sample"))
    assert "Docker is untested" in container and "no Docker daemon" in container


def _closed(redirect: str, argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`argv` started with one of its standard streams closed, the way a shell's `2>&-` does."""
    return subprocess.run(["sh", "-c", f'exec "$@" {redirect}', "sh", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("redirect", ["2>&-", ">&-", "<&-"])
def test_a_closed_standard_stream_never_stops_a_run(redirect: str, tmp_path: Path, server: ScriptedServer,
                                                    clean_env: dict[str, str]) -> None:
    server.handler = echo_policy(turns=1)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a", "say b"])
    proc = _closed(redirect, cli("run", *base_args(server, ds, "r")), clean_env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr and "error" not in proc.stdout + proc.stderr
    run = tmp_path / "data" / "r"
    assert len(read_records(run)) == 2 and (run / "statistics.json").is_file()
    # Nothing meant for the closed stream went into a file that took its descriptor.
    assert all(b"progress" not in p.read_bytes() for p in run.iterdir() if p.is_file())


def test_a_safe_stream_over_no_stream_drops_what_is_written() -> None:
    stream = SafeStream(None)
    assert stream.write("lost") == 4 and stream.broken and not stream.isatty()
    stream.flush()


def test_429_retries_are_quiet_without_verbose_while_the_limit_adapts(tmp_path: Path, server: ScriptedServer,
                                                                       clean_env: dict[str, str]) -> None:
    policy = echo_policy(turns=0)
    refusals = iter(range(4))

    def handler(req: Recorded) -> Reply:  # the first four requests of the run are refused
        if next(refusals, None) is not None:
            return http_error(429, "slow down", headers={"Retry-After": "0.1"})
        return policy(req)

    server.handler = handler
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a", "say b"])
    quiet = run_cli(tmp_path, clean_env, *base_args(server, ds, "r"))
    assert quiet.returncode == 0, quiet.stderr
    assert "slow down" not in quiet.stderr and "retry" not in quiet.stderr, quiet.stderr
    refusals = iter(range(4))
    loud = run_cli(tmp_path, clean_env, *base_args(server, ds, "v", "--verbose"))
    assert loud.returncode == 0 and "retry 1/5 after the endpoint's Retry-After" in loud.stderr, loud.stderr


@pytest.mark.parametrize("how", ["flag", "config"])
def test_a_named_hosted_model_without_a_key_is_refused_not_replaced(how: str, tmp_path: Path,
                                                                     clean_env: dict[str, str]) -> None:
    """--model=anthropic/claude-sonnet-4.6, the README's own first example, is also the default:
    named, it must not silently become the 135M local model."""
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a"])
    if how == "flag":
        named = ["--model=anthropic/claude-sonnet-4.6"]
    else:
        (tmp_path / "c.yaml").write_text("model: anthropic/claude-sonnet-4.6\n")
        named = [f"--config={tmp_path / 'c.yaml'}"]
    proc = run_cli(tmp_path, clean_env, f"--dataset_file={ds}", "--sandbox=local", *named)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: no API key for https://openrouter.ai/api/v1") and "--model local" in proc.stderr
    assert "using the bundled local model" not in proc.stderr and not (tmp_path / "data").exists()


def test_the_local_model_stands_in_only_when_no_model_was_named(clean_env: dict[str, str]) -> None:
    from trajforge.cli.run import parse_run_args
    from trajforge.runner.preflight import choose_model

    config, _ = parse_run_args(["--dataset_file=x.jsonl"], "trajforge run", strict_required=False)
    assert config is not None and choose_model(config) == "local"


def test_the_exit_code_table_lists_every_code_a_run_exits_with() -> None:
    text = page("troubleshooting.md")
    table = text[text.index("## Exit codes"):text.index("`--fail_on_error N`")]
    from trajforge.runner.scheduling.budget import BUDGET_EXIT_CODE

    codes = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}
    assert codes == {0, 1, 2, 3, BUDGET_EXIT_CODE, 130}


def test_the_layer_diagram_names_every_top_level_module() -> None:
    start = ARCHITECTURE.index("```\ncommands")
    diagram = ARCHITECTURE[start:ARCHITECTURE.index("```\n\n", start + 4)]
    modules = {p.name for p in (REPO / "src" / "trajforge").glob("*.py")} - {"__init__.py", "__main__.py"}
    packages = {f"{p.name}/" for p in (REPO / "src" / "trajforge").iterdir() if (p / "__init__.py").is_file()}
    assert [m for m in sorted(modules | packages) if m not in diagram] == []


def test_the_registration_table_names_one_registration_line_per_extension() -> None:
    from trajforge.catalog.executors import EXECUTORS
    from trajforge.catalog.sandboxes import SANDBOXES
    from trajforge.cli.run import run_flags

    # The flags' choices are the registries' names (no Literal kept in step by hand).
    helps = {f.name: f.help for f in run_flags()}
    assert helps["sandbox"] == ", ".join(["auto", *SANDBOXES][:-1]) + f" or {SANDBOXES.names()[-1]}"
    assert helps["executor"] == " or ".join(EXECUTORS)
    table = ARCHITECTURE[ARCHITECTURE.index("| to add | write | register in |"):]
    for row, place in (("| a sandbox backend |", "`catalog/sandboxes.py`"), ("| an executor |", "`catalog/executors.py`")):
        line = table[table.index(row):table.index("\n", table.index(row))]
        assert place in line and "Literal" not in line, line


def test_a_refused_distribution_leaves_no_run_directory(tmp_path: Path, server: ScriptedServer,
                                                        clean_env: dict[str, str]) -> None:
    from tests.test_new_user import no_search_env

    server.handler = echo_policy(turns=1)
    env = no_search_env(clean_env)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a"])
    proc = run_cli(tmp_path, env, *base_args(server, ds, "r"), "--distribution=minimal")
    assert proc.returncode == 2 and "none of its toolsets can be offered here" in proc.stderr, proc.stderr
    assert not (tmp_path / "data").exists()
    # A run that exists keeps its own configuration when a resume of it is refused.
    assert run_cli(tmp_path, env, *base_args(server, ds, "r")).returncode == 0
    config = (tmp_path / "data" / "r" / "config.json").read_text()
    write_dataset(ds, ["say a", "say b"])  # one more sample to run, so the resume starts its executor
    proc = run_cli(tmp_path, env, *base_args(server, ds, "r"), "--distribution=minimal", "--resume")
    assert proc.returncode == 2 and (tmp_path / "data" / "r" / "config.json").read_text() == config


def test_temperature_and_top_p_are_sent_only_when_set(tmp_path: Path, server: ScriptedServer,
                                                      clean_env: dict[str, str]) -> None:
    server.handler = echo_policy(turns=0)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a"])
    assert run_cli(tmp_path, clean_env, *base_args(server, ds, "plain")).returncode == 0
    (plain,) = server.chat_requests()
    assert "temperature" not in plain and "top_p" not in plain
    (tmp_path / "c.yaml").write_text("top_p: 0.5\n")
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds, "set"), "--temperature=1.2",
                   f"--config={tmp_path / 'c.yaml'}")
    assert proc.returncode == 0, proc.stderr
    assert (server.chat_requests()[-1]["temperature"], server.chat_requests()[-1]["top_p"]) == (1.2, 0.5)
    for bad in ("--temperature=2.5", "--top_p=0", "--top_p=1.5"):
        proc = run_cli(tmp_path, clean_env, *base_args(server, ds, "bad"), bad)
        assert proc.returncode == 2 and bad.split("=")[0] in proc.stderr, proc.stderr


def test_the_agents_sampling_is_not_the_judges(server: ScriptedServer) -> None:
    import asyncio

    from trajforge.config import RunConfig
    from trajforge.verify.judge import make_judge_client

    server.handler = lambda req: chat("score")
    config = RunConfig(model="m", base_url=server.url, temperature=1.3, top_p=0.7)

    async def ask() -> None:
        judge = make_judge_client(config, {})
        try:
            await judge.complete([{"role": "user", "content": "grade"}], [])
        finally:
            await judge.aclose()

    asyncio.run(ask())
    (body,) = server.chat_requests()
    assert "temperature" not in body and "top_p" not in body


def test_progress_and_the_table_count_the_same_discards(tmp_path: Path, server: ScriptedServer,
                                                        clean_env: dict[str, str]) -> None:
    """A record calling a tool it was not offered is dropped by the merge: the progress line counts
    it as discarded too, not as done (it said done 6 discarded 1 where the table said 5 and 2)."""
    policy = echo_policy(turns=1)

    def handler(req: Recorded) -> Reply:
        if "say bad" in user_prompt(req.body) and not tool_messages(req.body):
            return chat(None, tool_calls=[tool_call("browser_click", {"ref": "e1"})], reasoning="Click it.")
        return policy(req)

    server.handler = handler
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a", "say bad", "say c"])
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds, "r"))
    assert proc.returncode == 0, proc.stderr
    last = [line for line in proc.stderr.splitlines() if line.startswith("progress ")][-1]
    assert "progress 3/3 done 2 failed 0 discarded 1 " in last, last
    stats = json.loads((tmp_path / "data" / "r" / "statistics.json").read_text())
    for part in ("run", "last_invocation"):
        samples = stats[part]["samples"]
        assert (samples["finished"], samples["discarded_by_reason"]) == (2, {"hallucinated_tool": 1}), part
    assert re.search(r"│ discarded +│ +1 │", proc.stdout), proc.stdout


def test_cost_and_spent_are_labelled_and_small_budgets_keep_their_digits(
        tmp_path: Path, server: ScriptedServer, clean_env: dict[str, str]) -> None:
    server.handler = with_usage(echo_policy(turns=0), 100, 10, cost=0.0001)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a", "say b"])
    (tmp_path / "c.yaml").write_text("pricing: {scripted-model: {prompt: 1, completion: 1}}\n")
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds, "r"), "--max_cost=0.004", f"--config={tmp_path / 'c.yaml'}")
    assert proc.returncode == 0, proc.stderr
    assert "of $0.0040 budget" in proc.stderr and "spent $0.00020 (every call)" in proc.stderr, proc.stderr
    assert "samples' cost $0.00020" in proc.stderr
    assert re.search(r"cost \(finished and discarded samples\) +│ +\$0\.00020", proc.stdout), proc.stdout
    assert re.search(r"spent \(every model call, failed attempts too\) +│ +\$0\.00020", proc.stdout), proc.stdout


def test_usd_keeps_two_significant_digits() -> None:
    from trajforge.runner.reporting.figures import usd

    assert [usd(x) for x in (0, 0.004, 0.00004, 1.5, 12.3456, 1234.5)] == \
        ["$0.00", "$0.0040", "$0.000040", "$1.5000", "$12.3456", "$1,234.50"]


def test_pass_at_k_says_how_many_rows_it_averages() -> None:
    from trajforge.runner.reporting.verify_stats import VerifyTotals, table_rows

    totals = VerifyTotals(k=2)
    for sample_id, index, verification in (("a", 0, {"method": "exact", "passed": True}),
                                           ("a#1", 0, {"method": "exact", "passed": False}),
                                           ("b", 1, {"method": "none"}), ("c", 2, {"method": "exact", "error": "judge_failed"})):
        # a row is its place in the dataset: the merge writes every record with its row's index
        totals.add({"sample_id": sample_id, "prompt_index": index, "verification": verification})
    figures = totals.figures(cost=0.0)
    assert (figures.rows, figures.rows_with_verdict, figures.pass_at_1) == (3, 1, 0.5)
    assert ("pass@1 / pass@2 (1 of 3 rows have a verdict)", "0.500 / 1.000") in table_rows(figures)


def test_a_resume_with_nothing_to_do_keeps_the_runs_throughput(tmp_path: Path, server: ScriptedServer,
                                                               clean_env: dict[str, str]) -> None:
    """It added an invocation of a few milliseconds that ran nothing: the throughput was then
    taken over it (84705.9 samples/min)."""
    server.handler = echo_policy(turns=0)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a", "say b"])
    assert run_cli(tmp_path, clean_env, *base_args(server, ds, "r")).returncode == 0
    run = tmp_path / "data" / "r"
    first = json.loads((run / "statistics.json").read_text())["run"]["throughput_samples_per_minute"]
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds, "r"), "--resume")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads((run / "statistics.json").read_text())
    ran = json.loads((run / "checkpoint.json").read_text())["invocations"]
    assert [i["ran"] for i in ran] == [2, 0]
    assert stats["run"]["throughput_samples_per_minute"] == first == round(120 / ran[0]["seconds"], 2)
    assert stats["last_invocation"]["throughput_samples_per_minute"] is None
    assert re.search(r"throughput +│ +-", proc.stdout) is None and "samples/min" in proc.stdout


def test_the_readme_says_the_local_sandbox_leaks_host_paths(tmp_path: Path) -> None:
    """Under `local` a sample sees its workspace at the host path; the README must say so, as it is
    what lands in the trajectories."""
    import asyncio

    from trajforge.sandbox.backends.local.local_sandbox import LocalSandbox

    async def pwd() -> str:
        sb = LocalSandbox(tmp_path)
        await sb.start()
        try:
            return (await sb.exec("pwd", timeout=30)).stdout.strip()
        finally:
            await sb.close()

    assert asyncio.run(pwd()).startswith(str(tmp_path))  # the host path, not a stable one
    local = re.sub(r"\s+", " ", _paragraph("- `local`: a private workspace directory"))
    assert "host paths of the workspace" in local and "and so in the trajectories" in local


@pytest.mark.parametrize("retry", [False, True])
def test_a_sample_that_hits_a_sandbox_limit_is_not_retried_by_default(retry: bool, tmp_path: Path,
                                                                       server: ScriptedServer,
                                                                       clean_env: dict[str, str]) -> None:
    from tests.support.policies import prompt_command_policy
    from tests.sandbox.test_limits import ROOT_BWRAP

    if not ROOT_BWRAP:
        pytest.skip("needs bwrap as root: the /tmp limit is a tmpfs size")
    server.handler = prompt_command_policy
    ds = write_dataset(tmp_path / "ds.jsonl", ["head -c 8M /dev/zero > /tmp/fill; echo wrote=$?"])
    (tmp_path / "c.yaml").write_text("sandbox_tmp_size: 1m\ntask_types: {default: {retry_limit: 3}}\n")
    args = [f"--dataset_file={ds}", "--run_name=r", f"--base_url={server.url}", "--model=scripted",
            "--distribution=terminal_only", "--sandbox=bwrap", f"--config={tmp_path / 'c.yaml'}"]
    proc = run_cli(tmp_path, clean_env, *args, *(["--retry_sandbox_limits"] if retry else []))
    assert proc.returncode == 3, proc.stderr
    (entry,) = json.loads((tmp_path / "data" / "r" / "checkpoint.json").read_text())["samples"].values()
    assert entry["reason"] == "sandbox" and "filled /tmp (1 MiB, sandbox_tmp_size)" in entry["message"], entry
    assert entry["attempts"] == (4 if retry else 1)
    assert len(server.chat_requests()) == (4 if retry else 1)


def test_task_types_default_applies_to_rows_without_a_section_of_their_own(
        tmp_path: Path, server: ScriptedServer, clean_env: dict[str, str]) -> None:
    from trajforge.config import RunConfig

    config = RunConfig(task_types={"default": {"retry_limit": 0, "expected": "42"}, "code": {"retry_limit": 5}})
    assert (config.retry_limit(None), config.retry_limit("other"), config.retry_limit("code")) == (0, 0, 5)
    assert RunConfig().retry_limit(None) == 1
    from trajforge.verify.verifier import resolve_for

    assert resolve_for(config, None, None).expected == "42" and resolve_for(config, None, "code").expected is None
    server.handler = lambda req: http_error(400, "bad request")  # fails every attempt, without retries
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a"])
    (tmp_path / "c.yaml").write_text("task_types: {default: {retry_limit: 0}}\n")
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds, "r"), f"--config={tmp_path / 'c.yaml'}")
    assert proc.returncode == 3, proc.stderr
    (entry,) = json.loads((tmp_path / "data" / "r" / "checkpoint.json").read_text())["samples"].values()
    assert entry["attempts"] == 1 and len(server.chat_requests()) == 1


def test_view_reads_an_openai_export_as_the_records_it_came_from(tmp_path: Path, server: ScriptedServer) -> None:
    """It showed every sample of an openai export with 0 turns and said nothing."""
    from tests.support.export_run import make_run, run_export
    from trajforge.view.index import RunIndex

    run = make_run(tmp_path, server)
    assert run_export(tmp_path, run, "--format", "openai", "--output", "o.jsonl").returncode == 0
    with (tmp_path / "o.jsonl").open("a") as f:
        f.write(json.dumps({"prompt": "a dataset row, not a trajectory"}) + "\n")
    saved, exported = RunIndex(run / "trajectories.jsonl"), RunIndex(tmp_path / "o.jsonl")
    saved.refresh()
    exported.refresh()
    assert [(e.key, e.turns, e.tool_calls) for e in exported.entries()] == \
        [(e.key, e.turns, e.tool_calls) for e in saved.entries()]
    assert all(e.turns > 0 for e in exported.entries())
    first = exported.entries()[0]
    assert exported.read_record(first)["conversations"] == saved.read_record(saved.entries()[0])["conversations"]
    (problem,) = exported.problems
    assert problem.startswith("o.jsonl:") and "not a trajectory record" in problem


def test_the_first_build_says_it_needs_a_compiler_and_cmake(tmp_path: Path) -> None:
    import shutil

    make = shutil.which("make")
    if make is None:
        pytest.skip("no make here")
    quick_start = re.sub(r"\s+", " ", README[README.index("## Quick start"):README.index("## Running a real job")])
    assert "a C/C++ compiler and cmake" in quick_start
    for tool in ("cat", "cksum", "cut"):  # what the Makefile itself runs, and nothing else
        (tmp_path / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    bare = subprocess.run([make, "-s", "check-build-tools"], cwd=REPO, env={"PATH": str(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert bare.returncode == 0, bare.stderr
    assert "no C compiler (cc, gcc or clang) found" in bare.stderr and "no C++ compiler" in bare.stderr
    assert "cmake not found" in bare.stderr


def test_where_a_repeated_tool_call_id_is_renamed_and_what_is_kept(tmp_path: Path, server: ScriptedServer,
                                                                   clean_env: dict[str, str]) -> None:
    """The README said every renamed id keeps its original in metadata.sharegpt.renamed_tool_calls:
    an id repeated within one reply is renamed by the runner as it records the reply, keeping
    nothing; one repeated in a later turn is renamed by the export, which keeps the original."""
    def repeats(req: Recorded) -> Reply:
        done = len(tool_messages(req.body))
        if done == 0:  # two calls of one reply under one id
            return chat(None, reasoning="two at once", tool_calls=[tool_call("terminal", {"command": "echo a"}, "dup"),
                                                                   tool_call("terminal", {"command": "echo b"}, "dup")])
        if done == 2:  # the same id again, a turn later
            return chat(None, reasoning="once more", tool_calls=[tool_call("terminal", {"command": "echo c"}, "dup")])
        return chat("done", reasoning="finished")

    server.handler = repeats
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a"])
    assert run_cli(tmp_path, clean_env, *base_args(server, ds, "r")).returncode == 0
    out = tmp_path / "out.jsonl"
    proc = subprocess.run(cli("export", str(tmp_path / "data" / "r"), "--format", "openai", "--output", str(out)),
                          env=clean_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    item = json.loads(out.read_text())
    ids = [m["tool_call_id"] for m in item["messages"] if m["role"] == "tool"]
    assert ids[:2] == ["dup", "call_2"] and ids[2] != "dup" and len(set(ids)) == 3  # call_2: the runner's
    assert item["metadata"]["sharegpt"]["renamed_tool_calls"] == [{"id": ids[2], "original": "dup"}]
    docs = " ".join(" ".join(page(p).split()) for p in ["README.md", *nav_pages()])
    assert "the runner renames an id a provider repeated within one reply" in docs
    assert "keeping nothing of the original" in docs
    assert "the original kept in `metadata.sharegpt.renamed_tool_calls`" in docs
