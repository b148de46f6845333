"""checkpoint.json and statistics.json keep their shape: the keys, their order and the JSON types.

Other tools (the viewer, the exporter, users' scripts) read these files, and a run written by an
earlier version must resume. A real run through the CLI ends with done, discarded (no reasoning)
and failed samples, verified passes and fails; each file's shape is compared with the one the
format has had, and a checkpoint of the earlier format (fields of a newer version, invocations
from before spend was recorded) resumes and keeps what it held.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.support.policies import tool_messages, user_prompt
from tests.support.scripted_server import Recorded, Reply, ScriptedServer, chat, http_error, tool_call
from tests.support.run_state import statuses
from tests.runner.test_e2e import base_args, run_cli


def shape(doc: Any, maps: set[str]) -> list[str]:
    """`path:types` for every value in document order. The items of a list, and the values of a
    mapping named in `maps` (keyed by data: identities, tool names), share one path (`name[]`,
    `name{}`); a path's types are those of all its values."""
    types: dict[str, set[str]] = {}

    def walk(value: Any, at: str) -> None:
        if isinstance(value, dict):
            for key, v in value.items():
                walk(v, f"{at}{{}}" if at.rsplit(".", 1)[-1] in maps else f"{at}.{key}" if at else key)
        elif isinstance(value, list):
            for v in value:
                walk(v, f"{at}[]")
            types.setdefault(f"{at}[]", set())
        else:
            types.setdefault(at, set()).add("null" if value is None else type(value).__name__)

    walk(doc, "")
    return [f"{path}:{'|'.join(sorted(t))}" for path, t in types.items() if t or not any(
        p.startswith(path) and p != path for p in types)]


def policy(req: Recorded) -> Reply:
    """`say W`: one echo, then an answer with reasoning; `quiet W`: the same without reasoning
    (discarded); `boom W`: a server error (the sample fails)."""
    kind, word = user_prompt(req.body).split()
    if kind == "boom":
        return http_error(500, "boom")
    think = None if kind == "quiet" else "Echo it."
    if not tool_messages(req.body):
        return chat(None, tool_calls=[tool_call("terminal", {"command": f"echo {word}"})], reasoning=think)
    return chat(f"Done: {word}", reasoning=think)


def dataset(path: Path) -> Path:
    rows = [{"prompt": "say one", "expected": "one", "match": "contains"},
            {"prompt": "say two", "expected": "three", "match": "contains"}, {"prompt": "say four"},
            {"prompt": "quiet five"}, {"prompt": "boom six"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


CHECKPOINT_MAPS = {"samples", "extents", "tools", "irregular", "by_type", "missing"}
CHECKPOINT = [  # version 2: done samples are in finished.idx; the merge's state keeps the records' figures
    "version:int", "run_name:str", "updated:float", "journal:int", "finished.token:str", "finished.entries:int",
    "extents{}:int", "samples{}.status:str", "samples{}.batch:int", "samples{}.attempts:int", "samples{}.reason:str",
    "samples{}.usage.prompt_tokens:int", "samples{}.usage.completion_tokens:int",
    "samples{}.usage.reasoning_tokens:int", "samples{}.usage.cost:float", "samples{}.api_calls:int",
    "samples{}.message:str", "invocations[].started:float", "invocations[].seconds:float", "invocations[].ran:int",
    "invocations[].interrupted:bool", "invocations[].spent:float", "invocations[].spent_samples:int",
    "invocations[].model:str", "invocations[].settings.model:str", "invocations[].settings.base_url:str",
    "invocations[].settings.distribution:str", "invocations[].settings.max_turns:int",
    "invocations[].settings.max_tokens:null", "invocations[].settings.reasoning_effort:null",
    "invocations[].settings.reasoning_disabled:bool", "invocations[].settings.ephemeral_system_prompt:null",
    "invocations[].settings.prefill_messages_file:null", "invocations[].settings.sandbox:str",
    "invocations[].settings.sandbox_network:str", "invocations[].settings.keep_no_reasoning:bool",
    "invocations[].settings.temperature:null", "invocations[].settings.top_p:null",
    "invocations[].settings.samples_per_prompt:int", "invocations[].settings.judge_model:null",
    "invocations[].skipped_invalid:int", "merge.dataset.settings:str", "merge.dataset.k:int",
    "merge.dataset.bytes:int", "merge.dataset.digest:str", "merge.keep_passed:bool", "merge.entries:int",
    "merge.inode:int", "merge.size:int", "merge.last[]:int", "merge.written:int", "merge.hallucinated:int",
    "merge.duplicates:int", "merge.stale:int", "merge.not_kept:int", "merge.out_of_order:int",
    "merge.totals.finished:int", "merge.totals.completed:int", "merge.totals.partial:int",
    "merge.totals.tools{}[]:int", "merge.totals.assistant_turns:int", "merge.totals.turns_with_reasoning:int",
    "merge.totals.api_calls:int", "merge.totals.prompt_tokens:int", "merge.totals.completion_tokens:int",
    "merge.totals.reasoning_tokens:int", "merge.totals.cost:float", "merge.totals.verify.passed:int",
    "merge.totals.verify.failed:int", "merge.totals.verify.unverified:int", "merge.totals.verify.by_type{}[]:int",
    "merge.totals.verify.rollouts:str", "merge.totals.verify.passes:str", "merge.totals.verify.verdicts:str",
    "merge.totals.verify.not_kept:int", "merge.totals.capture.captured:int", "merge.totals.capture.calls:int",
    "merge.totals.capture.continuing:int", "merge.totals.capture.segments:int",
    "merge.totals.capture.missing_calls:int", "merge.totals.capture.missing{}:int",
]
STATS_MAPS = {"tools", "failed_by_class", "discarded_by_reason", "errors_by_kind", "by_task_type", "per_worker"}


def figures(at: str, total: str, per_row: bool, per_worker: bool, ran: bool = True) -> list[str]:
    """The shape of a section of samples' figures (Totals): the run's, the last invocation's.
    `ran`: False for an invocation that finished nothing (no names to list, no rates)."""
    lines = [
        f"samples.total:{total}", "samples.finished:int", "samples.completed:int", "samples.partial:int",
        "samples.failed:int", "samples.failed_by_class{}:int", "samples.discarded:int",
        "samples.discarded_by_reason{}:int", "tools{}.count:int", "tools{}.success:int", "tools{}.failure:int",
        "tools{}.success_rate:float|null", "tools{}.failure_rate:float|null", "reasoning.assistant_turns:int",
        "reasoning.with_reasoning:int", "reasoning.without_reasoning:int", "reasoning.coverage:float",
        "api_calls:int", "tokens.prompt:int", "tokens.completion:int", "tokens.reasoning:int", "tokens.total:int",
        "cost:float", "verification.verified:int", "verification.passed:int", "verification.failed:int",
        "verification.pass_rate:float", "verification.errors:int", "verification.errors_by_kind{}:int",
        "verification.unverified:int", "verification.by_task_type{}.passed:int",
        "verification.by_task_type{}.failed:int", "verification.by_task_type{}.errors:int",
        "verification.by_task_type{}.pass_rate:float", "verification.rows:int", "verification.rows_solved:int",
        "verification.rows_with_verdict:int", "verification.pass_at_1:float", "verification.pass_at_k.k:int", "verification.pass_at_k.value:float",
        "verification.skipped_solved:int", "verification.not_kept:int", "verification.cost_per_pass:float",
    ]
    if per_row:
        lines += ["verification.per_row[].prompt_index:int", "verification.per_row[].rollouts:int",
                  "verification.per_row[].passes:int", "verification.per_row[].verdicts:int"]
    lines += ["duration_seconds:float", "throughput_samples_per_minute:float"]
    if per_worker:
        lines.append("per_worker{}:int")
    if not ran:
        named = ("samples.discarded_by_reason{}", "tools{}", "verification.by_task_type{}")
        rates = {"reasoning.coverage", "verification.pass_rate", "verification.pass_at_1",
                 "verification.pass_at_k.value", "verification.cost_per_pass"}
        lines = [f"{line.split(':')[0]}:null" if line.split(":")[0] in rates else line
                 for line in lines if not line.startswith(named)]
    return [f"{at}.{line}" for line in lines]


AFTER_FIGURES = [
    "merge.written:int", "merge.hallucinated_filtered:int", "merge.duplicates_ignored:int",
    "merge.not_in_dataset:int", "merge.not_kept:int", "merge.problems[]:",
    "spend.spent:float", "spend.this_invocation:float", "spend.max_cost:null", "spend.budget_reached:bool",
    "spend.average_per_sample:int",  # round(average or 0): 0, not 0.0, when nothing cost anything
    "concurrency.adaptive:bool", "concurrency.ceiling:int", "concurrency.final_limit:int",
    "concurrency.min_limit:int", "concurrency.requests:int", "concurrency.ok:int", "concurrency.rate_limited:int",
    "concurrency.series[].t:float", "concurrency.series[].spent:float", "concurrency.series[].limit:int",
    "concurrency.series[].in_flight:int", "concurrency.series[].waiting:int",
    "concurrency.series[].requests_per_min:float", "concurrency.series[].tokens_per_min:int",
    "concurrency.series[].rate_limited_per_min:float",
]


def statistics(last_ran: bool) -> list[str]:
    return [
        "run_name:str", "model:str", "distribution:str", "sandbox:str", "dataset_file:str", "invocations:int",
        "models[]:str", "settings_changes[]:", "skipped_invalid:int",
        *figures("run", "int", per_row=True, per_worker=False),
        *figures("last_invocation", "null", per_row=False, per_worker=True, ran=last_ran),
        *AFTER_FIGURES,
    ]


def read(run: Path, name: str) -> dict[str, Any]:
    return json.loads((run / name).read_text())


def test_a_run_and_its_resume_write_both_files_in_their_shape(tmp_path: Path, server: ScriptedServer,
                                                               clean_env: dict[str, str]) -> None:
    server.handler = policy
    args = [*base_args(server, dataset(tmp_path / "ds.jsonl")), "--max_retries=0"]
    run = tmp_path / "data" / "r"
    for argv, invocations in ((args, 1), ([*args, "--resume"], 2)):
        proc = run_cli(tmp_path, clean_env, *argv)
        assert proc.returncode == 3, proc.stderr  # `boom` fails every time
        ckpt, stats = read(run, "checkpoint.json"), read(run, "statistics.json")
        assert shape(ckpt, CHECKPOINT_MAPS) == CHECKPOINT
        assert shape(stats, STATS_MAPS) == statistics(last_ran=invocations == 1)
        assert len(ckpt["invocations"]) == stats["invocations"] == invocations
        assert sorted(statuses(run).values()) == ["discarded", "done", "done", "done", "failed"]
        samples, verification = stats["run"]["samples"], stats["run"]["verification"]
        assert (samples["total"], samples["finished"], samples["failed_by_class"]["api_error"],
                samples["discarded_by_reason"]) == (5, 3, 1, {"no_reasoning": 1})
        assert (verification["passed"], verification["failed"], verification["unverified"]) == (1, 1, 1)
        assert stats["last_invocation"]["samples"]["finished"] == (3 if invocations == 1 else 0)


def test_a_run_made_by_the_version_1_code_resumes_and_keeps_what_it_held(
        tmp_path: Path, server: ScriptedServer, clean_env: dict[str, str]) -> None:
    """tests/fixtures/run_v1 is a run directory written by the code before checkpoint version 2
    (every sample listed in checkpoint.json, no index, no journal), from `dataset` and `policy`:
    3 done, 1 discarded, 1 failed. A resume runs only the failed sample, keeps every outcome and
    invocation (fields of another version too), and converts the checkpoint."""
    server.handler = policy
    run = tmp_path / "data" / "r"
    shutil.copytree(Path(__file__).parent.parent / "fixtures" / "run_v1", run)
    old = read(run, "checkpoint.json")
    discarded = next(k for k, e in old["samples"].items() if e["status"] == "discarded")
    old["samples"][discarded]["worker_note"] = {"from": "a newer version"}
    old["invocations"] = [{"started": 1.5, "seconds": 2.25, "ran": 9, "interrupted": True}, *old["invocations"]]
    (run / "checkpoint.json").write_text(json.dumps(old))
    merged = (run / "trajectories.jsonl").read_bytes()
    args = [*base_args(server, dataset(tmp_path / "ds.jsonl")), "--max_retries=0", "--resume"]
    for n in (3, 4):
        before = len(server.requests)
        assert run_cli(tmp_path, clean_env, *args).returncode == 3
        assert len(server.requests) - before == 2  # the failed sample and its in-run retry, nothing else
        new = read(run, "checkpoint.json")
        assert new["version"] == 2 and statuses(run) == {k: e["status"] for k, e in old["samples"].items()}
        assert new["samples"][discarded] == old["samples"][discarded]
        assert [i for i in new["invocations"][:2]] == old["invocations"] and len(new["invocations"]) == n
        assert read(run, "statistics.json")["invocations"] == n
        assert (run / "trajectories.jsonl").read_bytes() == merged


def test_keys_written_only_in_some_runs() -> None:
    """What the run above does not show: figures without a duration (the exporter's), a duration of
    no time, and the monitor without a gate of its own (Ray): a note, and points of spend only."""
    from trajforge.runner.scheduling.budget import Budget
    from trajforge.runner.reporting.monitor import RunMonitor
    from trajforge.runner.reporting.stats import Totals

    untimed = Totals().as_dict(total=3)
    assert not {"duration_seconds", "throughput_samples_per_minute", "per_worker"} & untimed.keys()
    assert "per_row" not in untimed["verification"]
    timed = Totals().as_dict(seconds=0.0)
    assert (timed["duration_seconds"], timed["throughput_samples_per_minute"]) == (0.0, None)
    clock = [0.0]
    monitor = RunMonitor(None, Budget(), clock=lambda: clock[0])
    clock[0] = 5.0
    monitor.tick()
    assert monitor.concurrency().to_json() == {"note": "not collected: with --executor ray each actor adapts on its own"}
    assert [p.to_json() for p in monitor.series] == [{"t": 5.0, "spent": 0.0}]
    assert monitor.spend().to_json() == {"spent": 0.0, "this_invocation": 0.0, "max_cost": None,
                                         "budget_reached": False, "average_per_sample": None}
