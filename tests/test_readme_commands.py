"""The README's commands, run the way a new user runs them: in order, as written, in a fresh clone.

The repository is cloned (`git clone` of this checkout, with its uncommitted changes applied, so a
developer tests what they are about to commit) into a temporary directory, and every command of
the documents' code blocks runs there, one after the other, from a clean shell: no virtual
environment active, no API key, no search provider, nothing on PYTHONPATH. So each command meets
the files and outputs of the ones before it, as it does for a user who types them in order
(`make demo`, then viewing and exporting its run...), and none depends on the state of this
checkout (outputs a developer left in its root, its data/).

`make demo` is the first command; the next commands it prints run right after it, as printed.

The clone gets its environment the way `make venv` makes one, but offline: a virtual environment
whose third-party packages are this checkout's (its site-packages on the path) and whose
trajforge is the clone's own (`pip install --no-deps --no-build-isolation -e .`, console script
included), then marked installed for the Makefile. That takes seconds instead of the minutes of a
real install, which a fresh machine's `make demo` does anyway; the commands and files are the
clone's.

What cannot run here is skipped with the reason: a hosted API (a key), a multi-host Ray cluster,
the package index, `make test` (this suite), a container engine when there is none. What stands
in for something, said in the test's output:
- "your own server" at http://127.0.0.1:8000/v1 is the scripted OpenAI-compatible test server (its
  URL replaces that one; a fixed port is not free on a shared machine);
- the bundled local model, which takes minutes a run on two shared cores, is the same server
  unless TRAJFORGE_README_SLOW=1 (then `make demo` and every local-model run are as written);
- `trajforge view` serves until stopped: it is started, asked for its status page, and stopped
  with SIGTERM; without a `--port` it gets `--port 0` (8765 may be taken).

Commands are read from DOCUMENTS, in reading order: README.md, then the pages of the docs site in
the order of mkdocs.yml's nav (tests/support/docs.py), so a page added to the site is covered.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.conftest import REPO
from tests.support.commands import make_dry_run
from tests.support.docs import documents
from tests.support.policies import echo_policy
from tests.support.scripted_server import ScriptedServer
from trajforge.model.endpoint import is_loopback

DOCUMENTS = documents()  # README.md, then the docs site's pages in its nav's order
NOT_COMMANDS = {"yaml", "yml", "json", "jsonl", "toml", "python", "py", "text", "txt", "ini", "csv"}
SHELL = {".", "source"}  # commands that change the shell the later ones run in (the venv's activate)
KNOWN_PROGRAMS = {"trajforge", "python", "python3", "make", "pip", "pip3", "curl", *SHELL}
SLOW = os.environ.get("TRAJFORGE_README_SLOW") == "1"
TIMEOUT = 1500 if SLOW else 300  # per command; `make demo` on the local model takes ~6-10 min on two loaded cores
OWN_SERVER = "http://127.0.0.1:8000/v1"  # what the README calls a server of your own
HOSTED_PREFIXES = ("anthropic/", "openai/", "google/", "meta-llama/", "mistralai/", "x-ai/", "deepseek/", "qwen/")
SECRETS = ("OPENROUTER_API_KEY", "OPENAI_API_KEY", "SEARXNG_URL", "BRAVE_API_KEY", "TAVILY_API_KEY",
           "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
PRINTED = re.compile(r"^\s+[^:]+:\s+(\.venv/bin/\S.*)$")  # `make demo`'s next commands


@dataclass(frozen=True)
class Command:
    doc: str
    line: int  # where it starts
    text: str  # as written, continuations joined, comment removed
    words: tuple[str, ...]

    @property
    def program(self) -> list[str]:
        """The words without leading `VAR=value` assignments."""
        words = list(self.words)
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            words.pop(0)
        return words


def commands_of(doc: str, text: str) -> list[Command]:
    """Every line of a fenced code block (data blocks excepted) whose program is known or on PATH;
    `\\` continues a line, `# ...` is a comment, a leading `$ ` is a prompt."""
    found: list[Command] = []
    fence: str | None = None
    lang, pending, start = "", "", 0
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
            found.append(Command(doc, start, shlex.join(words), words))
    return found


COMMANDS = [c for doc in DOCUMENTS for c in commands_of(doc, (REPO / doc).read_text(encoding="utf-8"))]


def _flag(words: list[str], *names: str) -> str | None:
    for i, w in enumerate(words):
        for n in names:
            if w == n and i + 1 < len(words):
                return words[i + 1]
            if w.startswith(n + "="):
                return w.split("=", 1)[1]
    return None


def _is_run(words: list[str]) -> bool:
    return any(w.endswith("batch_runner.py") for w in words) or (
        any(w.endswith("trajforge") for w in words) and "run" in words)


def _engine_reason() -> str | None:
    from trajforge.sandbox.backends.container.engine import detect
    import asyncio

    status = asyncio.run(detect())
    if status.engine:
        return None
    return "needs a container engine (Podman or Docker): " + "; ".join(status.reasons.values())


@dataclass
class Plan:
    """How one command runs here: its bash script, or why it is skipped; what stands in for what."""

    script: str | None
    skip: str = ""
    notes: list[str] = field(default_factory=list)
    serves: bool = False


def plan(cmd: Command, server_url: str, clone: Path = REPO) -> Plan:
    words, text = cmd.program, cmd.text
    if words[0] in SHELL:
        return Plan(text)
    if words[:2] == ["make", "test"]:
        return Plan(None, "runs the whole test suite, this test included")
    if len(words) > 1 and words[0].endswith("trajforge") and words[1] == "serve":
        return Plan(None, "serves until stopped (tests/service/test_readme_service.py runs it and its curls)")
    if words[0] == "curl" and "127.0.0.1:8780/" in text:
        return Plan(None, "talks to `trajforge serve` (tests/service/test_readme_service.py runs it)")
    if words[0] in ("pip", "pip3") or words[1:3] == ["-m", "pip"]:
        return Plan(None, "installs packages from the package index (network)")
    if "HEAD_IP" in text or words[1:2] in (["scheduler"], ["worker"]) or _flag(words, "--ray_address"):
        return Plan(None, "needs a multi-host Ray cluster (a head and worker nodes)")
    model, base_url = _flag(words, "--model"), _flag(words, "--base_url", "--base-url")
    if model and model.startswith(HOSTED_PREFIXES) and not base_url:
        return Plan(None, f"needs a hosted API key (--model {model} on the default endpoint)")
    if base_url and base_url != OWN_SERVER and not is_loopback(base_url):
        return Plan(None, f"needs the hosted API at {base_url} and its key (tests stay on loopback)")
    if ("--tasks" in " ".join(words) or "examples/tasks/base_image.py" in words) and (why := _engine_reason()):
        return Plan(None, why)
    p = Plan(text)
    if OWN_SERVER in text:
        p.script = text.replace(OWN_SERVER, server_url)
        p.notes.append(f"your own server at {OWN_SERVER}: the scripted test server")
    if words[:2] == ["make", "demo"] and not SLOW:
        p.script = demo_recipe(server_url, clone)
        p.notes.append("make demo's recipe with the scripted test server in place of the bundled local model "
                       "(TRAJFORGE_README_SLOW=1 runs `make demo` itself)")
    elif _is_run(words) and not SLOW and (model in ("local", None) or (model or "").startswith("local:")) \
            and not base_url:
        script = shlex.split(p.script or text)
        script = [w for w in script if not (w == "--model" or w.startswith("--model=") or w == model)]
        p.script = shlex.join([*script, f"--base_url={server_url}", "--model=scripted"])
        p.notes.append("the scripted test server in place of the bundled local model (TRAJFORGE_README_SLOW=1 runs it)")
    if len(words) > 1 and words[0].endswith("trajforge") and words[1] == "view":
        p.serves = True
        if not _flag(words, "--port"):
            p.script = f"{p.script} --port 0"
            p.notes.append("--port 0: the default port may be taken on a shared machine")
    return p


def demo_recipe(server_url: str, clone: Path) -> str:
    """What `make demo` runs (make's own dry run, in the clone), on the scripted server."""
    proc = make_dry_run(clone, "demo", "STAMP=")
    assert proc.returncode == 0, proc.stderr
    recipe = proc.stdout.replace("\\\n", " ")
    assert "--model=local" in recipe, recipe
    return recipe.replace("--model=local", f"--base_url={server_url} --model=scripted")


def clean_shell() -> dict[str, str]:
    """A new login's environment: no venv on PATH or active, no key, nothing on PYTHONPATH."""
    venvs = {Path(sys.prefix), *(Path(v) for v in [os.environ.get("VIRTUAL_ENV")] if v)}
    path = [d for d in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
            if d and not any(Path(d).is_relative_to(v) for v in venvs)]
    env = {k: v for k, v in os.environ.items() if k not in SECRETS}
    env["PATH"] = os.pathsep.join(path)
    return env


def fresh_clone(root: Path) -> Path:
    """`git clone` of this checkout plus its uncommitted changes, with an offline .venv."""
    clone = root / "trajforge"
    git = ["git", "-c", "advice.detachedHead=false"]
    subprocess.run([*git, "clone", "-q", str(REPO), str(clone)], check=True, timeout=300)
    diff = subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=REPO, capture_output=True, check=True).stdout
    if diff:
        subprocess.run(["git", "apply", "--whitespace=nowarn"], cwd=clone, input=diff, check=True)
    untracked = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "-z"], cwd=REPO,
                               capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (u.decode() for u in untracked)):
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, clone / name)
    venv = clone / ".venv"
    base_python = sys._base_executable  # type: ignore[attr-defined]  # the interpreter this venv came from
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    (site / "checkout-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                              "--no-build-isolation", "--no-index", "-e", str(clone)],
                             cwd=clone, capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    stamp = subprocess.run(["make", "-s", "--eval", "print-stamp: ; @echo $(STAMP)", "print-stamp"], cwd=clone,
                           capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    (clone / stamp).touch()  # what `make venv` leaves: the Makefile's targets take the venv as it is
    return clone


class Session:
    """The clone and the shell state of the commands run so far, in order."""

    def __init__(self, clone: Path, server: ScriptedServer) -> None:
        self.clone, self.server = clone, server
        self.env = clean_shell()
        self.shell: list[str] = []  # lines that changed the shell (activate), run before each later command
        self.done = 0  # COMMANDS run so far

    def script(self, body: str, exec_last: bool = False) -> str:
        return "\n".join(["set -e", *self.shell, ("exec " if exec_last else "") + body])

    def run(self, cmd: Command, p: Plan) -> subprocess.CompletedProcess[str] | None:
        assert p.script is not None
        if p.serves:
            self.serve(cmd, p.script)
            return None
        proc = subprocess.run(["bash", "-c", self.script(p.script)], cwd=self.clone, env=self.env,
                              capture_output=True, text=True, timeout=TIMEOUT)
        notes = "".join(f"\n  ({n})" for n in p.notes)
        assert proc.returncode == 0, (f"{cmd.doc} line {cmd.line}: {cmd.text}{notes}\n{proc.stdout[-2000:]}\n"
                                      f"{proc.stderr[-3000:]}")
        assert "Traceback" not in proc.stderr, proc.stderr
        if cmd.program[0] in SHELL:
            self.shell.append(cmd.text)
        return proc

    def serve(self, cmd: Command, script: str) -> None:
        """Start the server, ask its status page, stop it as Ctrl-C would."""
        proc = subprocess.Popen(["bash", "-c", self.script(script, exec_last=True)], cwd=self.clone, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()
            m = re.search(r"(http://[\w.:\[\]-]+/)", first)
            assert m, f"{cmd.doc} line {cmd.line}: {cmd.text}: no URL in {first!r}"
            with urllib.request.urlopen(m.group(1) + "api/status", timeout=60) as r:
                status = json.loads(r.read())
            assert status["samples"] > 0, status
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def catch_up(self, upto: int) -> None:
        """Run the commands before COMMANDS[upto] not run yet (a test selected alone needs them)."""
        while self.done < upto:
            cmd = COMMANDS[self.done]
            self.done += 1
            p = plan(cmd, self.server.url, self.clone)
            if p.script is not None:
                self.after(cmd, self.run(cmd, p))

    def after(self, cmd: Command, proc: subprocess.CompletedProcess[str] | None) -> None:
        """`make demo` prints the next commands: they run now, as printed."""
        if cmd.program[:2] != ["make", "demo"] or proc is None:
            return
        printed = [m.group(1) for line in proc.stdout.splitlines() if (m := PRINTED.match(line))]
        assert len(printed) == 3, proc.stdout[-2000:]
        for text in printed:
            printed_cmd = Command("make demo", 0, text, tuple(shlex.split(text)))
            self.run(printed_cmd, plan(printed_cmd, self.server.url, self.clone))


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    with ScriptedServer(echo_policy(turns=1)) as server:
        yield Session(fresh_clone(tmp_path_factory.mktemp("readme")), server)


def test_the_readme_has_commands_and_every_one_is_judged() -> None:
    texts = [c.text for c in COMMANDS]
    assert texts and texts[0].startswith("make demo"), texts  # the quick start comes first
    assert any(t.startswith(". .venv/bin/activate") for t in texts), texts
    assert any(t.startswith("trajforge run") for t in texts), texts
    assert any("trajectory_compressor.py" in t for t in texts), texts
    assert any(c.doc.startswith("docs/") for c in COMMANDS), "the docs pages' commands are not read"
    assert [c for c in COMMANDS if plan(c, "http://127.0.0.1:1/v1").script is not None], "nothing runs offline"


@pytest.mark.timeout(TIMEOUT * 4 + 600)
@pytest.mark.parametrize("index", range(len(COMMANDS)),
                         ids=[f"{c.doc}:{c.line}:{c.text[:50]}" for c in COMMANDS])
def test_readme_command_runs_in_order_in_a_fresh_clone(index: int, session: Session) -> None:
    session.catch_up(index)
    cmd = COMMANDS[index]
    p = plan(cmd, session.server.url, session.clone)
    session.done = index + 1
    if p.script is None:
        pytest.skip(p.skip)
    for note in p.notes:
        print(f"{cmd.doc} line {cmd.line}: {note}")
    session.after(cmd, session.run(cmd, p))
