"""Secrets never reach the data: a hostile model hunts for the run's keys in /proc and in errors.

The model's first move runs a command that dumps every process's command line and environment it
can read (under the local sandbox that includes the runner's own); its answer repeats what it
found; another sample's API error quotes the Authorization header back. Whatever the sandbox,
no saved file and no printed line may hold a key afterwards.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import cli
from tests.support.images import busybox_image, podman  # noqa: F401 (fixtures)
from tests.support.policies import tool_messages, user_prompt
from tests.support.scripted_server import Recorded, Reply, ScriptedServer, chat, http_error, tool_call
from tests.runner.test_e2e import base_args, write_dataset
from tests.support.run_state import read_records
from trajforge.sandbox.backends.bwrap.bwrap_backend import probe

BWRAP = asyncio.run(probe())
HUNT = ("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; tr '\\0' '\\n' < $p/environ; done 2>/dev/null "
        "| grep -a -e 'Se[C]rEt' -e '^[A-Z_]*=\\*\\*\\*' | sort -u")
MODEL_KEY = "sk-or-v1-SeCrEt-model-7f3a9c1e5b"
TOOL_KEYS = {"BRAVE_API_KEY": "BSA-SeCrEt-brave-55aa66bb", "TAVILY_API_KEY": "tvly-SeCrEt-tavily-9911",
             "MY_VISION_CRED": "vis-SeCrEt-vision-4242abcd",  # named by tools.vision.api_key_env only
             # credentials by shape or by a name that does not say KEY or TOKEN
             "DATABASE_URL": "postgres://app:db-SeCrEt-pass-77@db.internal:5432/app",
             "GITHUB_PAT": "ghp_SeCrEt_pat_0123456789abcdef",
             "DEPLOY_IDENTITY": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"
                                "SeCrEtAAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n-----END OPENSSH PRIVATE KEY-----"}


def hostile(req: Recorded) -> Reply:
    prompt = user_prompt(req.body)
    if prompt == "fail loudly":  # a provider error that quotes the key it was sent, and a tool key it saw
        return http_error(400, f"bad request with {req.headers.get('Authorization', '')} near "
                               f"{TOOL_KEYS['TAVILY_API_KEY']}")
    done = tool_messages(req.body)
    if not done:
        return chat(None, reasoning="Let me look around.", tool_calls=[tool_call("terminal", {"command": HUNT})],
                    delay=0.5)
    found = json.loads(done[-1]["content"]).get("output", "")
    return chat(f"I found: {found}", reasoning=f"The keys are {found}", delay=0.5)


def _cmdlines(what: str = "cmdline") -> bytes:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                out.append((p / what).read_bytes())
            except OSError:
                pass
    return b"\n".join(out)


@pytest.mark.parametrize("via", ["flag", "env"])
@pytest.mark.parametrize("sandbox", ["local", "bwrap", "container"])
def test_no_key_in_the_run_directory_or_the_output(tmp_path: Path, server: ScriptedServer, clean_env, via: str,
                                                   sandbox: str, request: pytest.FixtureRequest) -> None:
    if sandbox == "bwrap" and not BWRAP.usable:
        pytest.skip(f"bwrap not usable here: {BWRAP.detail}")
    config = "tools: {vision: {api_key_env: MY_VISION_CRED}}\n"
    if sandbox == "container":  # the busybox image of the container tests (skips saying what is missing)
        config += f"container_image: {request.getfixturevalue('busybox_image')}\ncontainer_engine: podman\n"
    server.handler = hostile
    ds = write_dataset(tmp_path / "ds.jsonl", ["hunt for keys", "fail loudly"])
    (tmp_path / "cfg.yaml").write_text(config)
    env = {**clean_env, **TOOL_KEYS}
    args = [a for a in base_args(server, ds) if not a.startswith("--sandbox")]
    args += [f"--sandbox={sandbox}", "--config=cfg.yaml", "--verbose", "--max_retries=0"]
    if via == "flag":
        args.append(f"--api_key={MODEL_KEY}")
    else:
        env["OPENROUTER_API_KEY"] = MODEL_KEY
    p = subprocess.Popen(cli("run", *args), cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not server.requests and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.02)
    assert b"SeCrEt" not in _cmdlines()  # no process shows a key on its command line, the runner included
    assert b"SeCrEt" not in Path(f"/proc/{p.pid}/environ").read_bytes()  # nor the runner in its environment
    out, err = p.communicate(timeout=120)
    assert p.returncode == 3, err.decode()  # the sample whose provider error quotes the key fails
    run = tmp_path / "data" / "r"
    files = [f for f in run.rglob("*") if f.is_file()]
    assert {"trajectories.jsonl", "checkpoint.json", "statistics.json", "config.json"} <= {f.name for f in files}
    for f in files:
        assert b"SeCrEt" not in f.read_bytes(), f
    assert b"SeCrEt" not in out + err
    # the hunt really happened, and the failure message was kept (scrubbed), not dropped
    record = read_records(run)[0]
    assert "I found:" in record["conversations"][-1]["value"]
    failed = [e for e in json.loads((run / "checkpoint.json").read_text())["samples"].values()
              if e["status"] == "failed"]
    assert len(failed) == 1 and "Bearer *** near ***" in failed[0]["message"]
    seen = "\n".join(json.dumps(r.body) for r in server.requests)
    assert "SeCrEt" not in seen  # tool results are scrubbed before the model (and its provider) sees them
    if sandbox == "local":
        # the runner's environment is readable from the local sandbox: the hunt found the names, with
        # the values overwritten in the runner's memory (and the scrubber's marker on top)
        for name in ("BRAVE_API_KEY", "MY_VISION_CRED", "DATABASE_URL", "GITHUB_PAT",
                     *(["OPENROUTER_API_KEY"] if via == "env" else [])):
            hidden = f"{name}=" + "*" * 8  # more than the scrubber's marker: overwritten where it lay
            assert hidden in seen and hidden in record["conversations"][-1]["value"], name


def test_scrubber_replaces_whole_keys_in_every_spelling_and_ignores_short_ones() -> None:
    from trajforge.redact import MARKER, Scrubber

    s = Scrubber(["sk-abc-123456", "sk-abc-123456-longer", 'we"ird\\key99', "short"])
    assert s.text("a sk-abc-123456-longer b sk-abc-123456 c") == f"a {MARKER} b {MARKER} c"
    assert s.bytes(json.dumps({"v": 'x we"ird\\key99 y'}).encode()) == b'{"v": "x *** y"}'
    assert s.text("short stays") == "short stays"
    assert s.value({"k sk-abc-123456": ["sk-abc-123456", 3, None]}) == {"k ***": ["***", 3, None]}


def test_run_secrets_come_from_the_flag_the_environment_and_the_tools_section() -> None:
    from trajforge.config.load import build_config
    from trajforge.redact import run_secrets

    config = build_config({"api_key": "flag-key-12345678", "tools": {"image_gen": {"api_key_env": "IMG_CRED"}}})
    environ = {"OPENAI_API_KEY": "oa-key-123456789", "HF_TOKEN": "hf_token_abcdefgh", "IMG_CRED": "img-cred-1234567",
               "HOME": "/root/home/dir", "PATH": "/usr/bin:/bin"}
    assert sorted(run_secrets(config, environ)) == sorted(["flag-key-12345678", "oa-key-123456789",
                                                           "hf_token_abcdefgh", "img-cred-1234567"])
    pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\nq83kfj3k2l\n-----END RSA PRIVATE KEY-----"
    shaped = {"DATABASE_URL": "mysql://root:hunter2-long@db/x", "SIGNING": pem, "GH_PAT": "ghp_0123456789",
              "HOMEPAGE": "https://example.com/a:b@c", "REPO": "https://github.com/o/r"}
    assert sorted(run_secrets(build_config({}), shaped)) == sorted([
        "mysql://root:hunter2-long@db/x", "hunter2-long", pem, "MIIEpAIBAAKCAQEA", "q83kfj3k2l", "ghp_0123456789"])
