"""The house's seams (issue 16): imports point down, and each extension is one file + one registration.

The import rules are read from the source with `ast`, so a new upward import fails here before it
spreads. The test-only plugins live in tests/support and are registered the way a contributor would.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from trajforge import cli
from trajforge.registry import Spec

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
    allowed = SECTIONS + SETTINGS if package == "config" else ()  # config collects the layers' sections, nothing else
    return sorted(str(p.relative_to(SRC)) for p in modules_under(package)
                  if any((m == target or m.startswith(target + ".")) and not _within(m, allowed) for m in imports_of(p)))


def _within(module: str, homes: tuple[str, ...]) -> bool:
    return any(module == h or module.startswith(h + ".") for h in homes)


# Each layer's section of the run's configuration, declared beside its code and collected by
# trajforge.config; each is a leaf below its layer (test_a_settings_section_imports_only_leaves).
SECTIONS = ("trajforge.model.settings", "trajforge.tools.tool_settings", "trajforge.sandbox.section",
            "trajforge.tasks.task_settings", "trajforge.verify.settings")
# The plain settings a section turns itself into, where they are a module of their own.
SETTINGS = ("trajforge.model.types", "trajforge.sandbox.sandbox_settings")
LEAVES = ("trajforge.fields", "trajforge.catalog", "trajforge.registry", "trajforge.netpolicy", *SETTINGS)


# (lower package, higher package it must never import)
FORBIDDEN = [
    ("runner", "trajforge.executors"),  # the command layer chooses the executor
    ("executors", "trajforge.runner"),  # executors run samples (trajforge.sample), below the runner
    ("sample", "trajforge.runner"),
    ("sample", "trajforge.executors"),
    ("agent", "trajforge.runner"),
    ("tools", "trajforge.runner"),
    ("tools", "trajforge.agent"),
    ("tools", "trajforge.config"),  # tools get ToolSettings (tools/tool_settings.py), built by the sample layer
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
    ("config", "trajforge.config.load"),  # the model never imports its reader
    ("config/load", "trajforge.tools"),  # the reader sits on config: only the model and the error tree below
    ("config/load", "trajforge.sandbox"),
    ("config/load", "trajforge.runner"),
    ("catalog", "trajforge.tools"),
    ("catalog", "trajforge.config"),
    ("verify", "trajforge.dataset"),
    ("tasks", "trajforge.runner"),  # tasks serve the sample layer and the loader: never the runner above
    ("tasks", "trajforge.executors"),
    ("tasks", "trajforge.sample"),
    ("tasks", "trajforge.config"),  # tasks get TaskSettings (tasks/task_settings.py) from the sample layer
    ("dataset", "trajforge.tasks"),  # tasks/load builds the dataset's Samples; both read trajforge.task_spec
    ("task_spec", "trajforge.tasks"),
    ("cli/flags", "trajforge.cli"),
]


@pytest.mark.parametrize(("package", "target"), FORBIDDEN)
def test_imports_point_down(package: str, target: str) -> None:
    assert importers(package, target) == []


@pytest.mark.parametrize("package", ["tasks", "runner", "executors", "export", "view", "sample", "agent", "tools",
                                     "verify", "cli"])
def test_the_sandbox_interface_is_the_only_door_into_a_sandbox(package: str) -> None:
    """Nothing outside sandbox/ imports a backend: a backend is reached through sandbox/interface.py
    (Sandbox, ImageSandbox, ImageStore) and the run's provider, whatever it is."""
    assert importers(package, "trajforge.sandbox.backends") == []


def test_no_module_outside_the_sandbox_package_imports_a_backend() -> None:
    outside = [p for p in SRC.rglob("*.py") if SRC / "sandbox" not in p.parents]
    assert sorted(str(p.relative_to(SRC)) for p in outside
                  if any(m.startswith("trajforge.sandbox.backends") for m in imports_of(p))) == []


@pytest.mark.parametrize("section", SECTIONS)
def test_a_settings_section_imports_only_leaves(section: str) -> None:
    """config imports each layer's section, so a section importing its layer's code (or config)
    would pull that layer under config: of trajforge a section reads only the shared leaves."""
    path = SRC.parent / (section.replace(".", "/") + ".py")
    assert sorted(m for m in imports_of(path) if not _within(m, LEAVES)) == []


@pytest.mark.parametrize("package", ["view", "export"])
def test_readers_of_a_run_go_through_its_reader(package: str) -> None:
    """The viewer and the exporter read a run through runner.reader (and trajforge.run_layout, a
    leaf) only, so the runner's bookkeeping can change without them."""
    door = "trajforge.runner.reader"
    found = sorted(f"{p.relative_to(SRC)}: {m}" for p in modules_under(package) for m in imports_of(p)
                   if (m == "trajforge.runner" or m.startswith("trajforge.runner.")) and m != door
                   and not m.startswith(door + "."))
    assert found == []
    assert imports_of(SRC / "run_layout.py") == set()  # a leaf: the executors take their paths from it too


def test_no_subcommand_imports_the_dispatcher() -> None:
    for spec in cli.SUBCOMMANDS.specs():
        name, module = spec.name, spec.target.partition(":")[0]
        path = SRC.parent / (module.replace(".", "/") + ".py")
        assert "trajforge.cli" not in imports_of(path), f"{name}: {path} imports trajforge.cli"


def test_a_subcommand_is_one_module_and_one_registration(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(cli.SUBCOMMANDS, "hello", Spec("hello", "tests.support.hello_command:main", "say hello"))
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
    from trajforge.sandbox.interface import SandboxError
    from trajforge.tasks.environment import BuildError
    from trajforge.tools.tool import ToolInfraError

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


# ---- one source for each name (issue 40) ----

def _registries() -> dict[str, Any]:
    """Each registry of names users type, by the module that registers them (run outputs are file
    names every reader of a run directory knows, trajectories.jsonl first)."""
    from trajforge import catalog, export
    from trajforge.catalog.executors import EXECUTORS
    from trajforge.catalog.sandboxes import SANDBOXES

    return {"catalog/sandboxes.py": SANDBOXES, "catalog/executors.py": EXECUTORS,
            "catalog/__init__.py": catalog.TOOLSETS, "export/__init__.py": export.FORMATS, "cli/__init__.py": cli.SUBCOMMANDS}


# Files where a registered name is a word of another vocabulary, and which one.
OTHER_MEANINGS: dict[str, dict[str, str]] = {
    "none": {p: "not a network mode: reasoning effort, verification method, an empty listing, a default's words"
             for p in ("agent/loop.py", "config/__init__.py", "model/settings.py", "cli/run.py", "export/filters.py",
                       "runner/preflight.py",
                       "runner/reporting/verify_stats.py", "sample/trace.py", "tools/terminal.py", "verify/result.py",
                       "sandbox/backends/container/status.py")}
             | {"sandbox/backends/container/argv.py": "the engine's own `--network none`"},
    "host": {"cli/view.py": "the viewer's --host flag", "cli/serve.py": "the rollout service's --host flag"},
    "local": {p: "the bundled local model, or a worker's id in statistics"
              for p in ("compress/pipeline.py", "model/factory.py", "model/local_model.py", "model/pricing.py",
                        "runner/preflight.py", "sample/outcome.py", "sample/worker.py")}
             | {"netpolicy.py": "`ip -j addr`'s key"},
    "ray": {"cli/cluster.py": "the Ray cluster commands are the ray executor's own (and their `ray:` section)",
            "cli/__init__.py": "the module and pip extra the cluster commands need",
            "executors/ray_auth.py": "the ray executor's own module"},
    "run": {p: "not the subcommand: a run of trajforge, a path component"
            for p in ("export/card.py", "runner/reporting/progress.py", "view/server.py",
                      "sandbox/backends/bwrap/bwrap_layout.py", "sandbox/backends/container/argv.py")},
    "export": {"export/__init__.py": "the pip extra"},
    "file": {"sandbox/backends/container/seed_tar.py": "a tar member's kind"},
    "terminal": {"tasks/oracle.py": "the terminal tool, which the oracle's record calls"},
    "sharegpt": {p: "the sharegpt format's conversion and schema" for p in ("export/convert.py", "export/schema.py")},
    "image_gen": {"catalog/distributions.py": "a distribution of that name"},
    "tasks": {p: "not the subcommand: statistics' task figures (`run.tasks`)"
              for p in ("runner/reporting/figures.py", "view/dataset.py")}
             | {p: "not the subcommand: the rollout service's task groups (the request's field, their lane, "
                   "the run's --tasks)" for p in ("service/core.py", "service/http.py")},
    "tokens": {p: "not the export format: token counts (a figure, a metric's key), or the record's field of "
                  "captured token ids (agent/segments.py spells it for everyone else)"
               for p in ("agent/segments.py", "compress/metrics.py", "export/card.py", "view/columns.py",
                         "view/conversation.py", "view/overview.py", "view/summary.py")}
              | {"sandbox/dns/fair.py": "a client's token bucket",
                 "service/atropos.py": "Atropos' ScoredData field of token ids"},
}


def _own_places(registry: Any, spec: Any) -> set[str]:
    """Where a registered thing may spell its own name: its module, and the package named after it
    (a sandbox backend's, a toolset's)."""
    parts = spec.target.partition(":")[0].split(".")[1:]
    places = {"/".join(parts) + ".py"}
    if spec.name in parts[:-1]:
        places.add("/".join(parts[:parts.index(spec.name) + 1]) + "/")
    return places


def test_each_registry_is_the_only_place_its_names_are_spelled() -> None:
    from trajforge.catalog.sandboxes import NetworkMode

    allowed: dict[str, set[str]] = {}
    for home, registry in _registries().items():
        for spec in registry.specs():
            allowed.setdefault(spec.name, set()).update({home, *_own_places(registry, spec)})
    for mode in NetworkMode:
        allowed.setdefault(str(mode), set()).add("catalog/sandboxes.py")
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = str(path.relative_to(SRC))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in allowed):
                continue
            places = allowed[node.value] | set(OTHER_MEANINGS.get(node.value, {}))
            if not any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in places):
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert found == []


@pytest.fixture
def one_of_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new thing of each kind: one module in tests/support plus one registration line each."""
    from trajforge import catalog, export
    from trajforge.catalog.executors import EXECUTORS, ExecutorCaps
    from trajforge.catalog.sandboxes import SANDBOXES, BackendCaps, NetworkMode

    monkeypatch.setitem(SANDBOXES, "plain", Spec("plain", "tests.support.plain_backend:make", "a plain test sandbox",
                                                 BackendCaps(networks=frozenset({NetworkMode.HOST}))))
    monkeypatch.setitem(EXECUTORS, "counting", Spec("counting", "tests.support.counting_executor:make", "counted",
                                                    ExecutorCaps(in_process=True)))
    monkeypatch.setitem(catalog.TOOLSETS, "loud",
                        catalog.toolset("loud", ("shout",), "tests.support.shout_toolset:build"))
    monkeypatch.setitem(export.FORMATS, "ids", Spec("ids", "tests.support.ids_exporter:IdsExporter", "sample ids",
                                                    export.FormatCaps()))
    monkeypatch.setitem(cli.SUBCOMMANDS, "hello", Spec("hello", "tests.support.hello_command:main", "say hello"))


def test_a_new_thing_of_each_kind_shows_in_help_doctor_and_config_validation(
        one_of_each: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from tests.support.plain_backend import PlainSandbox
    from tests.support.sandboxes import create_sandbox
    from trajforge.config import RunConfig
    from trajforge.config.load import build_config
    from trajforge.errors import UsageError

    # --help: the command list, the run flags' choices, the export formats
    assert cli.main(["--help"]) == 0
    assert "hello" in capsys.readouterr().out
    assert cli.main(["run", "--help"]) == 0
    run_help = " ".join(capsys.readouterr().out.split())
    assert "auto, local, bwrap, container or plain" in run_help and "local, ray or counting" in run_help
    assert cli.main(["export", "--help"]) == 0
    assert "openai, sharegpt, parquet, hf, atif, tokens, ids" in " ".join(capsys.readouterr().out.split())
    # config validation: accepted, and listed when a name is wrong
    config = build_config({"sandbox": "plain", "executor": "counting"})
    assert (config.sandbox, config.executor) == ("plain", "counting")
    with pytest.raises(UsageError, match="'container' or 'plain'; did you mean 'plain'"):
        build_config({"sandbox": "plian"})
    assert RunConfig(distributions={"loud_only": {"toolsets": {"loud": 100}}}, distribution="loud_only")
    # the backend's capabilities: it offers the host network only, and the preflight says so
    from trajforge.runner.preflight import contradictions

    assert any("--sandbox plain cannot apply --sandbox_network none" in c
               for c in contradictions(RunConfig(sandbox="plain", sandbox_network="none")))
    # doctor: a row of its own, usable, with its help
    assert cli.main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plain"] == {"usable": True, "detail": "a plain test sandbox"}
    assert cli.main(["doctor"]) == 0
    assert "  plain      usable      a plain test sandbox" in capsys.readouterr().out
    # and each works: a sample's sandbox, the command
    import asyncio

    async def exec_in_plain() -> str:
        sb = await create_sandbox(RunConfig(sandbox="plain", sandbox_network="host"), cwd=None, image=None,
                                  root=tmp_path)
        try:
            assert isinstance(sb, PlainSandbox)
            return (await sb.exec("echo plain", timeout=10)).stdout
        finally:
            await sb.close()

    assert asyncio.run(exec_in_plain()) == "plain\n"
    assert cli.main(["hello", "--greeting_name=ada"]) == 0 and capsys.readouterr().out == "hello ada\n"


def test_the_bwrap_backend_imports_under_a_python_without_site_packages() -> None:
    """An unprivileged runner may start the bwrap backend under the system's Python (tests/sandbox/
    test_bwrap_user.py): the sandbox's settings stay plain dataclasses, its section (pydantic) apart."""
    import subprocess
    import sys

    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "import trajforge.sandbox.backends.bwrap.bwrap_backend, trajforge.sandbox.backends.bwrap.bwrap_sandbox")
    done = subprocess.run([sys.executable, "-S", "-c", code, str(SRC.parent)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
