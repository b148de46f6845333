"""The house's seams (issue 16): imports point down, and each extension is one file + one registration.

The import rules are read from the source with `ast`, so a new upward import fails here before it
spreads. The test-only plugins live in tests/support and are registered the way a contributor would.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from trajforge import cli

SRC = Path(__file__).resolve().parents[1] / "src" / "trajforge"


def imports_of(path: Path) -> set[str]:
    """Every trajforge module a file imports, at any depth (lazy imports inside functions count)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("trajforge")}


def modules_under(package: str) -> list[Path]:
    return sorted((SRC / package).rglob("*.py")) if (SRC / package).is_dir() else [SRC / f"{package}.py"]


def importers(package: str, target: str) -> list[str]:
    return sorted(str(p.relative_to(SRC)) for p in modules_under(package)
                  if any(m == target or m.startswith(target + ".") for m in imports_of(p)))


# (lower package, higher package it must never import)
FORBIDDEN = [
    ("runner", "trajforge.executors"),  # the command layer chooses the executor
    ("executors", "trajforge.runner"),  # executors run samples (trajforge.sample), below the runner
    ("sample", "trajforge.runner"),
    ("sample", "trajforge.executors"),
    ("agent", "trajforge.runner"),
    ("tools", "trajforge.runner"),
    ("tools", "trajforge.agent"),
    ("tools", "trajforge.config"),  # tools get ToolSettings (tools/settings.py), built by the sample layer
    ("sandbox", "trajforge.tools"),
    ("sandbox", "trajforge.runner"),
    ("sandbox", "trajforge.config"),  # the sandbox gets SandboxSettings from the sample layer
    ("sandbox", "trajforge.sample"),
    ("model", "trajforge.tools"),
    ("model", "trajforge.runner"),
    ("errors", "trajforge.model"),
    ("config", "trajforge.tools"),  # config is a leaf: it reads toolset declarations from trajforge.catalog
    ("config", "trajforge.sandbox"),
    ("config", "trajforge.runner"),
    ("config", "trajforge.config_load"),  # the model never imports its reader
    ("config_load", "trajforge.tools"),  # the reader sits on config: only the model and the error tree below
    ("config_load", "trajforge.sandbox"),
    ("config_load", "trajforge.runner"),
    ("catalog", "trajforge.tools"),
    ("catalog", "trajforge.config"),
    ("verify", "trajforge.dataset"),
    ("tasks", "trajforge.runner"),  # tasks serve the sample layer and the loader: never the runner above
    ("tasks", "trajforge.executors"),
    ("tasks", "trajforge.sample"),
    ("tasks", "trajforge.config"),  # tasks get TaskSettings (tasks/settings.py) from the sample layer
    ("cmdline", "trajforge.cli"),
]


@pytest.mark.parametrize(("package", "target"), FORBIDDEN)
def test_imports_point_down(package: str, target: str) -> None:
    assert importers(package, target) == []


def test_no_subcommand_imports_the_dispatcher() -> None:
    for name, entry in cli.SUBCOMMANDS.items():
        module = entry.partition(":")[0]
        path = SRC.parent / (module.replace(".", "/") + ".py")
        assert "trajforge.cli" not in imports_of(path), f"{name}: {path} imports trajforge.cli"


def test_a_subcommand_is_one_module_and_one_registration(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(cli.SUBCOMMANDS, "hello", "tests.support.hello_command:main")
    for argv in (["--greeting_name=ada", "--times=2"], ["--greeting_name", "ada", "--times", "2"],
                 ["--greeting-name", "ada", "--times", "2"]):
        assert cli.main(["hello", *argv]) == 0
        assert capsys.readouterr().out == "hello ada\nhello ada\n"
    # The shared helper's errors: one line, exit 2, the flag named, the closest flag suggested.
    assert cli.main(["hello", "--greeting_name=ada", "--times=two"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --times: invalid value 'two': must be a whole number\n"
    assert cli.main(["hello", "--greting_name=ada"]) == 2
    assert capsys.readouterr().err == "error: unknown flag --greting_name; did you mean --greeting_name?\n"
    assert cli.main(["hello"]) == 2
    assert capsys.readouterr().err == "error: missing required flag --greeting_name\n"


@pytest.mark.parametrize("command", ["validate", "worker", "doctor", "view", "distributions"])
def test_every_subcommand_reports_bad_flags_in_one_line(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([command, "--no_such_flag=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err


def test_one_error_tree_with_the_failure_classes_attached() -> None:
    from trajforge.errors import SampleFailure, TrajforgeError, TrajforgeException
    from trajforge.model.errors import APIFailure, ModelCallError, ModelOutputError, ModelTimeoutError, RateLimitedError
    from trajforge.sample.outcome import FAILURE_CLASSES
    from trajforge.sandbox.base import SandboxError
    from trajforge.tasks.environment import BuildError
    from trajforge.tools.base import ToolInfraError

    failures = [ModelCallError, RateLimitedError, APIFailure, ModelTimeoutError, ModelOutputError, SandboxError,
                ToolInfraError, BuildError]
    assert all(issubclass(c, SampleFailure) and issubclass(c, TrajforgeException) for c in failures)
    assert not any(issubclass(c, TrajforgeError) for c in failures)  # a failed sample never stops the run
    assert {c.failure_class for c in [*failures, SampleFailure]} == set(FAILURE_CLASSES)


def _module_of(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def test_no_import_circles() -> None:
    """Between trajforge's modules, lazy imports inside functions included: every import runs one way."""
    paths = sorted(SRC.rglob("*.py"))
    modules = {_module_of(p) for p in paths}
    graph = {_module_of(p): {m for m in imports_of(p) if m in modules} - {_module_of(p)} for p in paths}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert circles == []
