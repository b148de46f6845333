"""A run that could only fail is refused before its first model call (exit 2, nothing created),
with one line saying what is wrong, before the start line: a mistyped or down --base_url, an
explicit --sandbox that cannot work here, a local model file that is not there, a distribution
none of whose toolsets can be offered. A one-off blip of the endpoint does not stop a run."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import cli
from tests.runner.test_e2e import base_args, run_cli, write_dataset
from tests.sandbox.test_doctor import BROKEN_STORAGE, broken_podman
from tests.support.policies import echo_policy
from tests.support.scripted_server import ScriptedServer
from trajforge.sandbox.process import SAFE_PATH

SEARCH_KEYS = ("SEARXNG_URL", "BRAVE_API_KEY", "TAVILY_API_KEY")


def refused(proc: subprocess.CompletedProcess[str], tmp_path: Path, *words: str) -> str:
    """The one error line of a run refused before it began: exit 2, no start line, nothing created."""
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and proc.stderr.rstrip().endswith(errors[0]), proc.stderr
    assert "run 'r'" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    for w in words:
        assert w in errors[0], errors[0]
    assert not (tmp_path / "data").exists()
    return errors[0]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed on leaving: nothing listens there


def test_a_base_url_nothing_answers_at_is_refused_naming_it(tmp_path: Path, clean_env: dict[str, str]) -> None:
    ds = write_dataset(tmp_path / "ds.jsonl", [f"say {i}" for i in range(12)])
    url = f"http://127.0.0.1:{closed_port()}/v1"
    proc = run_cli(tmp_path, clean_env, f"--dataset_file={ds}", "--batch_size=2", "--run_name=r", f"--base_url={url}",
                   "--model=m", "--sandbox=local")
    line = refused(proc, tmp_path, f"--base_url {url} does not answer", "check the URL")
    assert "Authorization" not in line


def test_the_probe_is_no_chat_request_and_a_blip_does_not_stop_the_run(tmp_path: Path, server: ScriptedServer,
                                                                       clean_env: dict[str, str]) -> None:
    server.handler = echo_policy(turns=1)
    server.drop_probes = 1  # the first probe's connection is closed unanswered; the next one is answered
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a", "say b"])
    proc = run_cli(tmp_path, clean_env, *base_args(server, ds))
    assert proc.returncode == 0, proc.stderr
    assert server.probe_dropped.is_set() and server.probes == 2
    assert len(server.chat_requests()) == 4 and all(r.path.endswith("/chat/completions") for r in server.requests)
    assert "does not answer" not in proc.stderr and "WARNING" not in proc.stderr, proc.stderr


def test_an_explicit_container_sandbox_with_a_broken_engine_is_refused(tmp_path: Path, server: ScriptedServer) -> None:
    server.handler = echo_policy(turns=1)
    env = broken_podman(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text("container_image: localhost/any:latest\n")
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a"])
    args = [a for a in base_args(server, ds) if a != "--sandbox=local"]
    proc = run_cli(tmp_path, env, *args, "--sandbox=container", "--container_engine=podman", f"--config={config}")
    refused(proc, tmp_path, "--sandbox container cannot work here", "podman is installed", BROKEN_STORAGE,
            "trajforge doctor")
    assert server.chat_requests() == []


def test_an_explicit_bwrap_sandbox_that_cannot_start_is_refused(tmp_path: Path, server: ScriptedServer,
                                                                clean_env: dict[str, str]) -> None:
    bwrap = shutil.which("bwrap", path=SAFE_PATH)
    if os.geteuid() != 0 or bwrap is None or shutil.which("unshare") is None:
        pytest.skip("needs root, unshare and bwrap: bwrap is made to fail in a mount namespace of the test's own")
    server.handler = echo_policy(turns=1)
    fake = tmp_path / "bwrap"  # what a kernel that refuses the namespaces makes bwrap say
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a"])
    args = [a for a in base_args(server, ds) if a != "--sandbox=local"]
    # Bound over bwrap in a private mount namespace only this command sees: the host's bwrap is untouched.
    script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(fake),
                           bwrap, *cli("run", *args, "--sandbox=bwrap", "--sandbox_network=none")],
                          cwd=tmp_path, env=clean_env, capture_output=True, text=True, timeout=120)
    refused(proc, tmp_path, "--sandbox bwrap cannot work here", f"{bwrap} is installed", "No permissions",
            "trajforge doctor")
    assert server.chat_requests() == []


@pytest.mark.parametrize("flags, words", [
    (["--model=local:/nowhere/missing.gguf"], "error: --model local:/nowhere/missing.gguf: no such model file: "
                                               "/nowhere/missing.gguf"),
    (["--distribution=minimal"], "error: --distribution minimal: none of its toolsets can be offered here"),
], ids=["missing-gguf", "distribution-without-toolsets"])
def test_refusals_come_before_the_start_line_and_are_said_once(tmp_path: Path, server: ScriptedServer,
                                                               clean_env: dict[str, str], flags: list[str],
                                                               words: str) -> None:
    env = {k: v for k, v in clean_env.items() if k not in SEARCH_KEYS}
    ds = write_dataset(tmp_path / "ds.jsonl", ["say a"])
    args = [a for a in base_args(server, ds) if a != "--distribution=terminal_only" or "--distribution" not in
            " ".join(flags)]
    args = [a for a in args if not (a.startswith("--model=") and any(f.startswith("--model=") for f in flags))]
    line = refused(run_cli(tmp_path, env, *args, *flags), tmp_path)
    assert line.startswith(words) and line.count("--model") <= 1, line
    assert server.chat_requests() == []
