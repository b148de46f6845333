"""Task directories for the task-environment tests, and the base image they build FROM.

The base image is the example tasks' (examples/tasks/base_image.py): this host's bash, coreutils,
grep, sed and findutils imported as `localhost/trajforge-example-base:latest`, made once per test
session, without a registry. `write_task` lays out a Harbor-format task; a `nonce` in its build
context makes its image new to this session (so a test sees it built), or shared between tasks.

An image only this session can have built (its nonce or Dockerfile holds `unique_nonce()`'s token)
carries the label `trajforge.test-session=<token>`, and `remove_session_images` removes those when
the session ends (tests/conftest.py): a suite leaves the host's engine no image of its own, and
never touches one a suite running beside it may use.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support.policies import tool_messages, user_prompt
from tests.support.scripted_server import Recorded, Reply, chat, tool_call
from trajforge.sandbox.backends.container.engine import Engine

EXAMPLES = REPO / "examples" / "tasks"
SESSION = uuid.uuid4().hex[:16]  # in every nonce of unique_nonce(): images only this session builds
SESSION_LABEL = "trajforge.test-session"
_labelled = False  # whether a task of this session's own was written


def unique_nonce() -> str:
    """A nonce no other test and no other session uses: its task's image is this session's alone."""
    return f"{SESSION}-{uuid.uuid4().hex[:12]}"


def remove_session_images(binary: str) -> list[str]:
    """Remove the images this session labelled as its own (none if it wrote no such task); an
    image a container still uses stays (`rmi` without --force). The ids `rmi` named."""
    if not _labelled:
        return []
    found = subprocess.run([binary, "images", "-q", "--filter", f"label={SESSION_LABEL}={SESSION}"],
                           capture_output=True, text=True, timeout=600)
    ids = sorted(set(found.stdout.split()))
    if found.returncode != 0 or not ids:
        return []
    subprocess.run([binary, "rmi", *ids], capture_output=True, text=True, timeout=600)
    return ids


def _base_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("trajforge_example_base_image", EXAMPLES / "base_image.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    before = sys.dont_write_bytecode
    sys.dont_write_bytecode = True  # no __pycache__ among the example tasks
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = before
    return module


@pytest.fixture(scope="session")
def task_base(podman: Engine) -> Iterator[str]:
    """The example tasks' base image, imported when this host has none made by this script: an
    import makes a new image id, and a task image's cache key holds its base's id, so a base
    imported anew under a test suite running beside this one would make its task images built anew."""
    module = _base_module()
    digest = hashlib.sha256((EXAMPLES / "base_image.py").read_bytes()).hexdigest()[:16]
    found = subprocess.run([podman.binary, "image", "inspect", "--format", '{{index .Config.Labels "trajforge.test-base"}}',
                            module.TAG], env=podman.env, capture_output=True, text=True, timeout=60)
    if found.returncode == 0 and found.stdout.strip() == digest:
        yield module.TAG
    else:
        yield module.build(podman.binary, podman.env, label=f"trajforge.test-base={digest}")


@pytest.fixture
def pinned_base(podman: Engine, task_base: str) -> Iterator[str]:
    """The example base under a tag of this test's own: a task image's cache key holds its base's
    id, and a test suite beside this one may import the example base anew meanwhile."""
    tag = f"localhost/trajforge-test-pinned-base:{uuid.uuid4().hex[:12]}"
    subprocess.run([podman.binary, "tag", task_base, tag], env=podman.env, check=True, capture_output=True,
                   timeout=60)
    yield tag
    subprocess.run([podman.binary, "untag", tag, tag], env=podman.env, capture_output=True, timeout=60)


def write_task(root: Path, name: str, *, test_sh: str, instruction: str | None = None, toml: str = "",
               dockerfile: str = "FROM localhost/trajforge-example-base:latest\nWORKDIR /app\n",
               nonce: str | None = None, solve_sh: str | None = None,
               files: dict[str, str] | None = None, test_files: dict[str, str] | None = None) -> Path:
    """A task directory `root/name`; `files` go into environment/, `test_files` beside tests/test.sh."""
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text(f'[task]\nname = "{name}"\n{toml}')
    (task / "instruction.md").write_text(instruction or f"task {name}: do what the tests want.\n")
    if SESSION in (nonce or "") + dockerfile:
        global _labelled
        _labelled = True
        dockerfile = f"{dockerfile.rstrip(chr(10))}\nLABEL {SESSION_LABEL}={SESSION}\n"
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    if nonce is not None:
        (task / "environment" / "nonce.txt").write_text(nonce)
    for rel, text in (files or {}).items():
        (task / "environment" / rel).parent.mkdir(parents=True, exist_ok=True)
        (task / "environment" / rel).write_text(text)
    (task / "tests" / "test.sh").write_text(test_sh)
    for rel, text in (test_files or {}).items():
        (task / "tests" / rel).write_text(text)
    if solve_sh is not None:
        (task / "solution").mkdir()
        (task / "solution" / "solve.sh").write_text(solve_sh)
    return task


REWARD_IF = 'if {cond}; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n'


def task_name(body: dict) -> str:
    """The name of the task (written by `write_task`) a model request is about."""
    m = re.match(r"task (\S+):", user_prompt(body))
    assert m, user_prompt(body)
    return m.group(1)


def scripted_agent(commands: dict[str, list[str]]) -> Callable[[Recorded], Reply]:
    """A scripted-server policy playing an agent on tasks written by `write_task`: each task's
    terminal commands in order (by the name in its instruction), then an answer."""
    def policy(req: Recorded) -> Reply:
        done = len(tool_messages(req.body))
        todo = commands[task_name(req.body)]
        if done < len(todo):
            return chat(None, tool_calls=[tool_call("terminal", {"command": todo[done]})], reasoning="Next step.")
        return chat("Finished.", reasoning="That is all.")

    return policy
