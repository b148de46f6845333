"""Extension points used the way a contributor would (issue 16): a test-only toolset, a test-only
run output and a test-only export format, each one file in tests/support plus one registration line,
exercised through a real run (in-process, against the scripted model server, in a real local
sandbox)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.images import podman  # noqa: F401 (fixture)
from tests.support.scripted_server import Recorded, Reply, ScriptedServer, chat, tool_call
from tests.support.tasks import task_base  # noqa: F401 (fixture)
from tests.support.run_state import read_records
from trajforge import catalog, cli
from trajforge.catalog import toolset
from trajforge.registry import Spec
from trajforge.runner.reporting import outputs


@pytest.fixture
def loud_toolset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(catalog.TOOLSETS, "loud", toolset("loud", ("shout",), "tests.support.shout_toolset:build"))


def shout_policy(req: Recorded) -> Reply:
    if any(m.get("role") == "tool" for m in req.body["messages"]):
        return chat("done", reasoning="the tool answered")
    assert [t["function"]["name"] for t in req.body["tools"]] == ["shout"]
    return chat(None, reasoning="I will shout", tool_calls=[tool_call("shout", {"text": "hello"})])


@pytest.fixture
def lengths_output(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(outputs.RUN_OUTPUTS, "lengths.tsv",
                        Spec("lengths.tsv", "tests.support.lengths_output:LengthsOutput"))


@pytest.fixture
def ids_format(monkeypatch: pytest.MonkeyPatch) -> None:
    from trajforge import export

    monkeypatch.setitem(export.FORMATS, "ids", Spec("ids", "tests.support.ids_exporter:IdsExporter", "sample ids",
                                                    export.FormatCaps()))


def shout_run(tmp_path: Path, server: ScriptedServer, toolset: str, sandbox: str,
              capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """A one-row run whose one distribution offers `toolset` only, in `sandbox`: its one record."""
    server.handler = shout_policy
    ds = tmp_path / "ds.jsonl"
    ds.write_text(json.dumps({"prompt": "shout hello"}) + "\n")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"distributions:\n  only:\n    toolsets: {{'{toolset}': 100}}\n")
    code = cli.main(["run", f"--dataset_file={ds}", f"--config={cfg}", "--distribution=only",
                     f"--output_dir={tmp_path / 'data'}", "--run_name=r", f"--base_url={server.url}",
                     "--model=scripted-model", f"--sandbox={sandbox}"])
    assert code == 0, capsys.readouterr().err
    [record] = read_records(tmp_path / "data" / "r")
    return record


def test_a_registered_toolset_and_output_run_end_to_end(tmp_path: Path, server: ScriptedServer,
                                                        clean_env: dict[str, str], loud_toolset: None,
                                                        lengths_output: None, ids_format: None,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    record = shout_run(tmp_path, server, "loud", "local", capsys)
    assert record["toolsets_used"] == ["loud"]
    tool_turn = next(m for m in record["conversations"] if m["from"] == "tool")
    assert "HELLO" in tool_turn["value"]
    # The registered output got the same kept record from the merge, beside trajectories.jsonl.
    lengths = (tmp_path / "data" / "r" / "lengths.tsv").read_text()
    assert lengths == f"{record['sample_id']}\t{len(record['conversations'])}\n"
    # A registered export format exports the run.
    capsys.readouterr()
    code = cli.main(["export", str(tmp_path / "data" / "r"), "--format=ids", f"--output={tmp_path / 'ids.txt'}"])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "ids.txt").read_text() == f"{record['sample_id']}\n"


def test_an_unregistered_toolset_is_refused_by_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("distributions:\n  loud_only:\n    toolsets: {loud: 100}\n")
    assert cli.main(["distributions", f"--config={cfg}"]) == 2
    assert "loud" in capsys.readouterr().err


def test_declared_toolsets_match_their_settings_and_tools() -> None:
    from trajforge.catalog.tools_config import ToolsConfig
    from trajforge.tools.toolsets import KNOWN_TOOLS, TOOLSET_TOOLS

    assert {s.settings for s in catalog.TOOLSETS.specs() if s.settings} == set(ToolsConfig.model_fields)
    assert set(TOOLSET_TOOLS) == set(catalog.TOOLSETS) and len(set(KNOWN_TOOLS)) == len(KNOWN_TOOLS)


def test_the_command_layer_chooses_the_executor_from_the_registry(tmp_path: Path, server: ScriptedServer,
                                                                  clean_env: dict[str, str], loud_toolset: None,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support import counting_executor
    from trajforge import executors

    local = executors.EXECUTORS["local"]
    monkeypatch.setitem(executors.EXECUTORS, "local", Spec("local", "tests.support.counting_executor:make",
                                                           capabilities=local.capabilities))
    counting_executor.PROCESSED.clear()
    server.handler = shout_policy
    ds = tmp_path / "ds.jsonl"
    ds.write_text("".join(json.dumps({"prompt": f"shout {i}"}) + "\n" for i in range(3)))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("distributions:\n  loud_only:\n    toolsets: {loud: 100}\n")
    code = cli.main(["run", f"--dataset_file={ds}", f"--config={cfg}", "--distribution=loud_only",
                     f"--output_dir={tmp_path / 'data'}", "--run_name=r", f"--base_url={server.url}",
                     "--model=scripted-model", "--sandbox=local"])
    assert code == 0, capsys.readouterr().err
    assert len(counting_executor.PROCESSED) == 3


@pytest.fixture
def relay_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    from trajforge.catalog.sandboxes import SANDBOXES, BackendCaps, NetworkMode

    monkeypatch.setitem(SANDBOXES, "relay", Spec("relay", "tests.support.relay_backend:make", "relays to containers",
                                                 BackendCaps(networks=frozenset(NetworkMode), images=True,
                                                             image_store="tests.support.relay_backend:store")))


def test_a_backend_that_runs_images_runs_a_harbor_task(tmp_path: Path, relay_backend: None, podman: object,
                                                        task_base: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A registered backend that runs images gets the task's build, its sandbox, the oracle and the
    tests: the task layer reaches it through the interface alone (every call is a RelaySandbox's)."""
    from tests.support import relay_backend
    from tests.support.tasks import REWARD_IF, unique_nonce, write_task

    task = write_task(tmp_path / "tasks", "relayed", nonce=unique_nonce(), solve_sh="echo done > /app/out.txt\n",
                      test_sh=REWARD_IF.format(cond="[ \"$(cat /app/out.txt)\" = done ]"))
    relay_backend.CALLS.clear()
    code = cli.main(["run", f"--tasks={task}", "--agent=oracle", "--sandbox=relay", "--sandbox_network=none",
                     f"--output_dir={tmp_path / 'data'}", "--run_name=r", "--container_engine=podman"])
    assert code == 0, capsys.readouterr().err
    [record] = [json.loads(line) for line in (tmp_path / "data" / "r" / "trajectories.jsonl").read_text().splitlines()]
    assert (record["verification"]["reward"], record["verification"]["passed"]) == (1.0, True)
    calls = relay_backend.CALLS
    assert {"store.inspect", "store.build", "make", "start", "fresh_dirs", "upload", "run", "stop_processes",
            "download", "changes", "close"} <= set(calls), calls
    assert calls.index("store.build") < calls.index("make") < calls.index("run") < calls.index("close")


# ---- things from outside trajforge, and the one check of what a thing needs installed ----

OUTSIDE = '''
"""A plugin package of someone else's: a sandbox backend, a toolset and an export format, each a
Spec that trajforge is pointed at as "outside_things:NAME" -- no line of trajforge names them."""
from pathlib import Path

from tests.support.ids_exporter import IdsExporter
from tests.support.plain_backend import PlainSandbox
from tests.support.shout_toolset import build as build_shout
from trajforge.catalog import toolset
from trajforge.catalog.sandboxes import BackendCaps, NetworkMode
from trajforge.export import FormatCaps
from trajforge.registry import Spec

MADE = []


async def make(provider, *, cwd, image, root: Path):
    MADE.append(root)
    return PlainSandbox(root, keep=provider.settings.keep_workspaces, cwd=cwd, limits=provider.limits)


BACKEND = Spec("plain", "outside_things:make", "a plain sandbox from outside",
               BackendCaps(networks=frozenset({NetworkMode.HOST})))
TOOLSET = toolset("loud", ("shout",), "outside_things:build_shout")
FORMAT = Spec("ids", "outside_things:IdsExporter", "sample ids", FormatCaps())
NOT_A_SPEC = 42
'''


@pytest.fixture
def outside_things(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """outside_things.py importable from a directory of its own; what the registries load from it
    is taken out again afterwards, so no other test sees it."""
    import importlib
    import sys

    from trajforge import export
    from trajforge.catalog.executors import EXECUTORS
    from trajforge.catalog.sandboxes import SANDBOXES

    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "outside_things.py").write_text(OUTSIDE)
    monkeypatch.syspath_prepend(str(plugins))
    registries = [SANDBOXES, EXECUTORS, catalog.TOOLSETS, export.FORMATS]
    before = [set(r) for r in registries]
    yield importlib.import_module("outside_things")
    sys.modules.pop("outside_things", None)
    for registry, names in zip(registries, before):
        for name in set(registry.names()) - names:
            del registry[name]


def test_a_backend_toolset_and_format_from_outside_need_no_edit_of_trajforge(
        outside_things: Any, tmp_path: Path, server: ScriptedServer, clean_env: dict[str, str],
        capsys: pytest.CaptureFixture[str]) -> None:
    record = shout_run(tmp_path, server, "outside_things:TOOLSET", "outside_things:BACKEND", capsys)
    run = tmp_path / "data" / "r"
    assert record["toolsets_used"] == ["outside_things:TOOLSET"]
    assert "HELLO" in next(m for m in record["conversations"] if m["from"] == "tool")["value"]
    assert len(outside_things.MADE) == 1  # the sample's sandbox was the outside backend's
    assert json.loads((run / "config.json").read_text())["sandbox"] == "outside_things:BACKEND"
    capsys.readouterr()
    code = cli.main(["export", str(run), "--format=outside_things:FORMAT", f"--output={tmp_path / 'ids.txt'}"])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "ids.txt").read_text() == f"{record['sample_id']}\n"


@pytest.mark.parametrize(("value", "why"), [
    ("no_such_plugin:BACKEND", "cannot load sandbox backend 'no_such_plugin:BACKEND': ModuleNotFoundError"),
    ("outside_things:MISSING", "cannot load sandbox backend 'outside_things:MISSING': AttributeError"),
    ("outside_things:NOT_A_SPEC", "is not a sandbox backend: a Spec with BackendCaps is needed, found int"),
    ("outside_things:FORMAT", "a Spec with BackendCaps is needed, found a Spec with FormatCaps"),
])
def test_an_outside_name_that_names_no_such_thing_says_why(outside_things: Any, value: str, why: str) -> None:
    from trajforge.config.load import build_config
    from trajforge.errors import UsageError

    with pytest.raises(UsageError, match=f"^--sandbox: invalid value '{value}': .*{re.escape(why)}"):
        build_config({"sandbox": value})


NEEDY = ("trajforge_test_absent_module",)
NOT_INSTALLED = "trajforge_test_absent_module is not installed; install it with: pip install 'trajforge[needy]'"


def test_every_kind_says_what_is_not_installed_and_how_to_install_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """One check of a spec's `needs` (Spec.missing / Spec.load) serves executors, export formats,
    toolsets and subcommands; a module a spec forgot to declare is named all the same."""
    import asyncio

    from trajforge import export
    from trajforge.catalog.executors import EXECUTORS, ExecutorCaps
    from trajforge.config import RunConfig
    from trajforge.errors import UsageError
    from trajforge.runner.preflight import check_executor
    from trajforge.tools.toolsets import build_toolsets

    monkeypatch.setitem(EXECUTORS, "needy", Spec("needy", "tests.support.counting_executor:make", "",
                                                 ExecutorCaps(in_process=True), needs=NEEDY, extra="needy"))
    with pytest.raises(UsageError, match=f"^--executor needy: {re.escape(NOT_INSTALLED)}$"):
        check_executor(RunConfig(executor="needy"))
    monkeypatch.setitem(export.FORMATS, "needy", Spec("needy", "tests.support.ids_exporter:IdsExporter", "",
                                                      export.FormatCaps(), needs=NEEDY, extra="needy"))
    with pytest.raises(UsageError, match=f"^--format needy: {re.escape(NOT_INSTALLED)}$"):
        export.exporter_class("needy")
    monkeypatch.setitem(catalog.TOOLSETS, "needy", toolset("needy", ("shout",), "tests.support.shout_toolset:build",
                                                           needs=NEEDY, extra="needy"))
    monkeypatch.setitem(catalog.TOOLSETS, "undeclared", toolset("undeclared", ("shout",),
                                                                "trajforge_test_absent_module.tools:build"))
    ready, missing = asyncio.run(build_toolsets(["needy", "undeclared"], RunConfig().tool_settings()))
    assert ready == {}
    assert [(u.toolset, u.reason) for u in missing] == [
        ("needy", NOT_INSTALLED), ("undeclared", "trajforge_test_absent_module is not installed")]
    monkeypatch.setitem(cli.SUBCOMMANDS, "needy", Spec("needy", "tests.support.hello_command:main", "",
                                                       needs=NEEDY, extra="needy"))
    assert cli.main(["needy"]) == 2
    assert capsys.readouterr().err == f"error: 'trajforge needy' is not available: {NOT_INSTALLED}\n"
    monkeypatch.setitem(cli.SUBCOMMANDS, "needy", Spec("needy", "tests.support.hello_command:main", ""))
    assert cli.main(["needy", "--greeting_name=ada"]) == 0 and capsys.readouterr().out == "hello ada\n"
