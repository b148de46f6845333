"""Extension points used the way a contributor would (issue 16): a test-only toolset, a test-only
run output and a test-only export format, each one file in tests/support plus one registration line,
exercised through a real run (in-process, against the scripted model server, in a real local
sandbox)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.images import podman  # noqa: F401 (fixture)
from tests.support.scripted_server import Recorded, Reply, ScriptedServer, chat, tool_call
from tests.support.tasks import task_base  # noqa: F401 (fixture)
from trajforge import catalog, cli
from trajforge.catalog import toolset
from trajforge.registry import Spec
from trajforge.runner import outputs


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


def test_a_registered_toolset_and_output_run_end_to_end(tmp_path: Path, server: ScriptedServer,
                                                        clean_env: dict[str, str], loud_toolset: None,
                                                        lengths_output: None, ids_format: None,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    server.handler = shout_policy
    ds = tmp_path / "ds.jsonl"
    ds.write_text(json.dumps({"prompt": "shout hello"}) + "\n")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("distributions:\n  loud_only:\n    toolsets: {loud: 100}\n")
    code = cli.main(["run", f"--dataset_file={ds}", f"--config={cfg}", "--distribution=loud_only",
                     f"--output_dir={tmp_path / 'data'}", "--run_name=r", f"--base_url={server.url}",
                     "--model=scripted-model", "--sandbox=local"])
    assert code == 0, capsys.readouterr().err
    [record] = [json.loads(line) for line in (tmp_path / "data" / "r" / "trajectories.jsonl").read_text().splitlines()]
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
    from tests.support.tasks import REWARD_IF, write_task

    task = write_task(tmp_path / "tasks", "relayed", nonce=str(tmp_path), solve_sh="echo done > /app/out.txt\n",
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
