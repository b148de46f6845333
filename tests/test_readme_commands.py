"""Every command in README.md's code blocks, run as a new user would, each in a fresh temp directory.

The extractor is generic: any line of a fenced code block (yaml/json/toml/python/text blocks
excepted) whose program is `trajforge`, `python`, `make`, `pip` or a program on PATH is a
command; `\\` continues a line and `# ...` is a comment. Sections other helpers add are picked up
as they are. Each command runs with no API key in the environment, in a temporary directory
seeded with what it names as input (`examples/...` copied from the repo, a small dataset for
`--dataset_file`, an empty config for a missing `--config`, a finished run for `data/<run>`), and
must exit 0. What cannot run offline here is skipped with the reason:

- a hosted API key: a remote `--model` without `--base_url` (the run would refuse: no key);
- a multi-host Ray cluster: `trajforge scheduler`/`worker`, `HEAD_IP` placeholders;
- a model server: a `--base_url` nothing listens at (only loopback is ever tried);
- the package index: `pip install`;
- `make test`: that is this suite;
- slow: a run on the bundled local model (no `--base_url`, no key: the README's offline
  fallback) takes about 2 minutes per prompt on two shared cores (the default distribution's
  system prompt alone is ~4,600 tokens), `make demo` over 5 minutes for its ten prompts. They
  run when TRAJFORGE_README_SLOW=1 is set (e.g. before a release), so the default suite stays
  within a minute.

A command whose program is a long-running server must be added to SKIP below with its reason.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.conftest import REPO, cli
from tests.support.commands import make_recipe
from tests.support.policies import echo_policy
from tests.support.scripted_server import ScriptedServer
from trajforge.model.endpoint import is_loopback

README = REPO / "README.md"
NOT_COMMANDS = {"yaml", "yml", "json", "jsonl", "toml", "python", "py", "text", "txt", "ini", "csv"}
KNOWN_PROGRAMS = {"trajforge", "python", "python3", "make", "pip", "pip3"}
SLOW = os.environ.get("TRAJFORGE_README_SLOW") == "1"
TIMEOUT = 1500 if SLOW else 180  # per command; `make demo` alone takes ~10 min on two loaded cores
# (regex on the command text, reason): commands the generic rules cannot judge.
SKIP: list[tuple[str, str]] = [
    (r"^make test\b", "runs the whole test suite, this test included"),
    (r"^trajforge view\b", "serves a web page until stopped (tests/view/test_browser.py drives it)"),
    (r"^trajforge serve\b", "serves until stopped (tests/service/test_readme_service.py runs it and its curls)"),
    (r"^curl .*127\.0\.0\.1:8780/", "talks to `trajforge serve` (tests/service/test_readme_service.py runs it)"),
]
DATASET_FLAGS = {"--dataset_file", "--dataset-file"}
HOSTED_PREFIXES = ("anthropic/", "openai/", "google/", "meta-llama/", "mistralai/", "x-ai/", "deepseek/", "qwen/")


@dataclass(frozen=True)
class Command:
    line: int  # README line where it starts
    text: str  # as written, continuations joined, comment removed
    words: tuple[str, ...]


def readme_commands(text: str) -> list[Command]:
    commands: list[Command] = []
    fence: str | None = None
    lang = ""
    pending, start = "", 0
    for no, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        m = re.match(r"^(`{3,}|~{3,})\s*([\w+-]*)", stripped)
        if fence is None and m:
            fence, lang = m.group(1), m.group(2).lower()
            continue
        if fence is not None and stripped.startswith(fence):
            fence = None
            continue
        if fence is None or lang in NOT_COMMANDS:
            continue
        line = re.sub(r"^\$\s+", "", stripped) if not pending else stripped
        if not pending:
            start = no
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full, pending = pending + line, ""
        try:
            words = tuple(shlex.split(full, comments=True))
        except ValueError:
            continue
        program = next((w for w in words if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w)), None)
        if program and (program in KNOWN_PROGRAMS or shutil.which(program)):
            commands.append(Command(start, " ".join(words), words))
    return commands


COMMANDS = readme_commands(README.read_text(encoding="utf-8"))


def _flag(words: tuple[str, ...] | list[str], *names: str) -> str | None:
    for i, w in enumerate(words):
        for n in names:
            if w == n and i + 1 < len(words):
                return words[i + 1]
            if w.startswith(n + "="):
                return w.split("=", 1)[1]
    return None


def _program_words(cmd: Command) -> list[str]:
    """The command without its leading `VAR=value` environment assignments (later words such as
    `--split train=0.95,test=0.05` are arguments, kept as they are)."""
    words = list(cmd.words)
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words.pop(0)
    return words


def _make_recipe(cmd: Command) -> list[str]:
    """What `make TARGET` runs, from make's own dry run, with this interpreter's venv."""
    return make_recipe(*_program_words(cmd)[1:])


def _listening(url: str) -> bool:
    parts = urlsplit(url)
    if not parts.hostname:
        return False
    try:
        with socket.create_connection((parts.hostname, parts.port or 443), timeout=2):
            return True
    except OSError:
        return False


def _is_run(words: list[str]) -> bool:
    return any(w.endswith("batch_runner.py") for w in words) or (
        any(w.endswith("trajforge") for w in words) and "run" in words)


def skip_reason(cmd: Command) -> str | None:
    words = _program_words(cmd)
    for pattern, reason in SKIP:
        if re.search(pattern, cmd.text):
            return reason
    if words[0] in ("pip", "pip3") or words[1:3] == ["-m", "pip"]:
        return "installs packages from the package index (network)"
    if "HEAD_IP" in cmd.text or any(w in ("scheduler", "worker") for w in words[1:2]) or _flag(words, "--ray_address"):
        return "needs a multi-host Ray cluster (a head and worker nodes)"
    if words[0] == "make":
        words = _make_recipe(cmd) or words
    model = _flag(words, "--model")
    base_url = _flag(words, "--base_url", "--base-url")
    if model and model.startswith(HOSTED_PREFIXES) and not base_url:
        return f"needs a hosted API key (--model {model} on the default endpoint)"
    if base_url and not is_loopback(base_url):
        return f"needs the hosted API at {base_url} and its key (tests stay on loopback)"
    if base_url and not _listening(base_url):
        return f"needs an OpenAI-compatible server at {base_url} (vLLM, llama.cpp...); none is running"
    if _is_run(words) and not _flag(words, "--base_url", "--base-url") and not SLOW:
        return ("slow: runs the bundled local model offline (1-2 min per prompt on two shared cores); "
                "TRAJFORGE_README_SLOW=1 runs it")
    return None


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real finished run directory (scripted model, local sandbox), copied where a command names one."""
    root = tmp_path_factory.mktemp("finished")
    ds = root / "ds.jsonl"
    ds.write_text("".join(json.dumps({"prompt": f"say w{i}", "id": f"r{i}"}) + "\n" for i in range(3)))
    env = {k: v for k, v in os.environ.items() if k not in ("OPENROUTER_API_KEY", "OPENAI_API_KEY")}
    env["PYTHONPATH"] = str(REPO / "src")
    with ScriptedServer(echo_policy(turns=1)) as server:
        proc = subprocess.run(cli("run", f"--dataset_file={ds}", "--batch_size=2", "--run_name=r",
                                  f"--base_url={server.url}", "--model=scripted", "--distribution=terminal_only",
                                  "--sandbox=local"), cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return root / "data" / "r"


def seed(workdir: Path, words: list[str], finished: Path) -> None:
    """Create what the command reads: repo files it names, a dataset, a config, a finished run."""
    dataset = _flag(words, *DATASET_FLAGS)
    config = _flag(words, "--config")
    values = [w.split("=", 1)[1] if w.startswith("--") and "=" in w else w for w in words[1:]]
    for value in values:
        if not value or value.startswith("-") or "://" in value or os.path.isabs(value):
            continue
        target = workdir / value
        if target.exists():
            continue
        in_repo = REPO / value
        if value != "." and in_repo.exists() and not value.startswith("data"):
            target.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if in_repo.is_dir() else shutil.copy)(in_repo, target)
        elif value == dataset:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps({"prompt": "Print the word hello with echo."}) + "\n")
        elif value == config:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("{}\n")  # every default, as a new user's first config file
        elif re.match(r"^data/[^/]+(/|$)", value) and not _is_run(words):
            run = workdir / "/".join(value.split("/")[:2])
            if not run.exists():
                shutil.copytree(finished, run)


def argv_for(cmd: Command) -> list[str]:
    words = _program_words(cmd)
    if words[0] == "trajforge":
        return [*cli(), *words[1:]]
    if words[0] in ("python", "python3"):
        rest = words[1:]
        if rest and rest[0].endswith(".py") and (REPO / rest[0]).exists():
            rest = [str(REPO / rest[0]), *rest[1:]]
        return [sys.executable, *rest]
    if words[0] == "make":
        return ["make", "-f", str(REPO / "Makefile"), *words[1:], f"VENV={sys.prefix}", "STAMP="]
    return list(words)


def test_the_readme_has_commands_and_every_one_is_judged() -> None:
    texts = [c.text for c in COMMANDS]
    assert any(t.startswith("make demo") for t in texts), texts
    assert any(t.startswith("trajforge run") for t in texts), texts
    assert any("trajectory_compressor.py" in t for t in texts), texts
    runnable = [c for c in COMMANDS if skip_reason(c) is None]
    assert runnable, "no README command runs offline"


@pytest.mark.timeout(TIMEOUT + 120)
@pytest.mark.parametrize("cmd", COMMANDS, ids=[f"L{c.line}:{c.text[:50]}" for c in COMMANDS])
def test_readme_command_runs_offline(cmd: Command, tmp_path: Path, finished_run: Path) -> None:
    reason = skip_reason(cmd)
    if reason:
        pytest.skip(reason)
    words = _program_words(cmd)
    seed(tmp_path, _make_recipe(cmd) if words[0] == "make" else words, finished_run)
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENROUTER_API_KEY", "OPENAI_API_KEY", "SEARXNG_URL", "BRAVE_API_KEY", "TAVILY_API_KEY")}
    env["PYTHONPATH"] = str(REPO / "src")
    env.update(w.split("=", 1) for w in cmd.words if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w))
    proc = subprocess.run(argv_for(cmd), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, f"README line {cmd.line}: {cmd.text}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr
