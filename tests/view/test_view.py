"""The viewer's pure parts: conversation parsing and call/result pairing, the incremental index
over growing batch files, the overview's figures and histograms, and list filtering."""

from __future__ import annotations

import json
from pathlib import Path

from trajforge.runner.reporting.stats import Totals
from trajforge.tools.toolsets import KNOWN_TOOLS
from trajforge.view.conversation import display_turns, pair, parse_call, result_view
from trajforge.view.index import RunIndex
from trajforge.view.overview import Query, apply, distributions, facets, histogram, run_totals


def call(name: str, args: dict, cid: str | None = None) -> str:
    body = {"name": name, "arguments": args} | ({"id": cid} if cid else {})
    return f"<tool_call>\n{json.dumps(body)}\n</tool_call>"


def response(cid: str, name: str, content) -> str:
    return f"<tool_response>\n{json.dumps({'tool_call_id': cid, 'name': name, 'content': content})}\n</tool_response>"


def test_parallel_results_pair_with_their_calls_even_when_one_has_no_result() -> None:
    conv = [
        {"from": "system", "value": 'Tools within <tools> </tools> tags: <tools>\n[{"name": "terminal", '
                                    '"description": "run", "parameters": {"type": "object"}}]\n</tools> end'},
        {"from": "human", "value": "do three things"},
        {"from": "gpt", "value": "<think>\nplan it\n</think>\nOK.\n" + "\n".join(
            [call("terminal", {"command": "echo a"}), call("read_file", {"path": "x"}),
             call("terminal", {"command": "echo c"})])},
        # the read_file call got no result (e.g. cancelled): results of calls 1 and 3 only
        {"from": "tool", "value": response("c1", "terminal", {"output": "a\n"}) + "\n"
                                  + response("c3", "terminal", {"output": "c\n"})},
        {"from": "gpt", "value": "done"},
    ]
    turns = display_turns(conv)
    assert [t["kind"] for t in turns] == ["system", "human", "gpt", "gpt"]
    assert turns[0]["tools"][0]["name"] == "terminal"
    calls = turns[2]["calls"]
    assert turns[2]["reasoning"] == ["plan it"] and turns[2]["text"] == "OK."
    assert calls[0]["result"]["id"] == "c1" and calls[0]["result"]["fields"][0] == ["output", "a\n"]
    assert calls[1]["result"] is None
    assert calls[2]["result"]["id"] == "c3" and "echo c" in calls[2]["arguments"]


def test_pairing_by_id_wins_over_order_and_unknown_results_are_kept() -> None:
    calls = [parse_call(json.dumps({"name": "t", "arguments": {}, "id": "x"})),
             parse_call(json.dumps({"name": "t", "arguments": {}, "id": "y"}))]
    results = [result_view({"tool_call_id": "y", "name": "t", "content": "second"}),
               result_view({"tool_call_id": "x", "name": "t", "content": "first"}),
               result_view({"tool_call_id": "z", "name": "other", "content": "stray"})]
    orphans = pair(calls, results)
    assert calls[0].result["text"] == "first" and calls[1].result["text"] == "second"
    assert [o["text"] for o in orphans] == ["stray"]


def test_error_results_and_malformed_calls_are_flagged() -> None:
    assert result_view({"content": {"error": "no such file"}})["error"] is True
    assert result_view({"content": {"success": False}})["error"] is True
    assert result_view({"content": {"output": "", "error": None}})["error"] is False
    assert result_view({"content": "Error: boom"})["error"] is True
    bad = parse_call("{not json")
    assert bad.bad and bad.arguments == "{not json"
    turns = display_turns([{"from": "gpt", "value": "hi", "tokens": 12}, {"from": "tool", "value": "plain text"}])
    assert turns[0]["tokens"] == 12 and turns[0]["calls"] == []
    assert turns[1]["kind"] == "tool" and turns[1]["results"][0]["text"] == "plain text"  # answers no call


def record(i: int, *, tools: dict | None = None, verification: dict | None = None, completed: bool = True) -> dict:
    stats = {n: {"count": 0, "success": 0, "failure": 0} for n in KNOWN_TOOLS}
    for name, (ok, bad) in (tools or {}).items():
        stats[name] = {"count": ok + bad, "success": ok, "failure": bad}
    rec = {"prompt_index": i, "sample_id": f"id{i}:0",
           "conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": f"Prompt number {i}"},
                             *[{"from": "gpt", "value": "x"}] * (1 + i % 3)],
           "metadata": {"batch_num": i // 2}, "completed": completed, "partial": not completed, "api_calls": 2,
           "tool_stats": stats, "reasoning": {"total_assistant_turns": 2, "turns_with_reasoning": 1},
           "usage": {"prompt_tokens": 100 * i, "completion_tokens": 10, "cost": 0.5}}
    if verification:
        rec["verification"] = verification
    return rec


def lines(*recs: dict) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in recs)


def test_index_reads_only_what_was_appended_and_waits_for_whole_lines(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    batch = run / "batch_0.jsonl"
    batch.write_bytes(lines(record(0, tools={"terminal": (1, 0)}), record(1)))
    ix = RunIndex(run)
    assert ix.refresh() and len(ix.entries()) == 2
    gen = ix.generation
    assert not ix.refresh() and ix.generation == gen  # nothing new: nothing done
    whole = lines(record(2, tools={"terminal": (0, 2)}))
    with batch.open("ab") as f:
        f.write(whole[:30])  # being written
    assert not ix.refresh() and len(ix.entries()) == 2 and not ix.problems
    with batch.open("ab") as f:
        f.write(whole[30:])
    ix.refresh()
    e = ix.find("id2:0")
    assert e is not None and e.tools == ("terminal",) and e.tool_failures == 2 and e.tokens == 210
    assert ix.read_record(e)["prompt_index"] == 2  # read back by offset
    assert ix.totals.tools["terminal"] == [3, 1, 2] and ix.totals.finished == 3
    # a run started over (--overwrite) replaces the file: the index starts over too
    batch.unlink()
    (run / "batch_0.jsonl").write_bytes(lines(record(7)))
    ix.refresh()
    assert [e.key for e in ix.entries()] == ["id7:0"] and ix.totals.finished == 1


def test_index_follows_the_merge_rules_and_the_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    made_up = record(3)
    made_up["tool_stats"]["unoffered:summon"] = {"count": 1, "success": 1, "failure": 0}
    (run / "batch_0.jsonl").write_bytes(lines(record(0), record(1), made_up) + b"{torn\n" + lines(record(0)))
    (run / "checkpoint.json").write_text(json.dumps({"version": 1, "samples": {
        "id0:0": {"status": "done", "batch": 0}, "id1:0": {"status": "failed", "batch": 0, "reason": "timeout"},
        "lost:0": {"status": "failed", "batch": 4, "reason": "sandbox", "message": "no image"},
        "gone:0": {"status": "discarded", "batch": 2, "reason": "no_reasoning",
                   "usage": {"prompt_tokens": 7, "completion_tokens": 1}, "api_calls": 1}},
        "invocations": [{"started": 0.0, "seconds": 30.0}, {"started": 60.0, "seconds": 30.0}]}))
    ix = RunIndex(run)
    ix.refresh()
    assert ix.duplicates == 1 and len(ix.problems) == 1 and "batch_0.jsonl:4" in ix.problems[0]
    assert ix.find("id3:0").status == "discarded" and ix.find("id3:0").reason == "hallucinated_tool"
    # id1 failed once but finished later: listed once, as finished
    keys = [e.key for e in ix.entries()]
    assert keys == ["id0:0", "id1:0", "id3:0", "gone:0", "lost:0"]
    totals = run_totals(ix.totals, ix.outcomes, ix.checkpoint).as_dict(total=5, seconds=ix.seconds())
    assert totals["samples"]["finished"] == 2 and totals["samples"]["failed_by_class"]["sandbox"] == 1
    assert totals["samples"]["discarded_by_reason"] == {"hallucinated_tool": 1, "no_reasoning": 1}
    assert totals["tokens"]["prompt"] == 0 + 100 + 7 and totals["throughput_samples_per_minute"] == 2.0
    assert ix.find("id1:0").status == "completed" and ix.find("lost:0").message == "no image"
    assert isinstance(ix.totals, Totals) and ix.totals.failed == {}  # the records' own totals stay as they were



def test_the_index_reads_the_checkpoint_as_the_runner_does(tmp_path: Path) -> None:
    """One replay of checkpoint.json and its journal (runner.reader): a journal's later lines count
    (a failure a later attempt finished, an invocation's last commit), and a file the runner would
    refuse is one problem naming it, not half-read."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "batch_0.jsonl").write_bytes(lines(record(0)))
    (run / "checkpoint.json").write_text(json.dumps({"version": 2, "run_name": "run", "journal": 1, "finished": None,
                                                     "extents": {}, "samples": {
        "id0:0": {"status": "failed", "batch": 0, "reason": "timeout"},
        "id5:0": {"status": "failed", "batch": 0, "reason": "sandbox"}},
        "invocations": [{"started": 0.0, "seconds": 5.0}]}))
    (run / "journal.jsonl").write_bytes(b"".join(json.dumps(x).encode() + b"\n" for x in (
        {"journal": 1}, {"done": "id0:0", "batch": 0, "at": 0, "len": 10},
        {"sample": "id6:0", "status": "discarded", "batch": 0, "reason": "no_reasoning"},
        {"invocation": 0, "started": 0.0, "seconds": 42.0})))
    ix = RunIndex(run)
    ix.refresh()
    assert sorted(e.key for e in ix.outcomes) == ["id5:0", "id6:0"] and ix.seconds() == 42.0 and not ix.problems
    (run / "checkpoint.json").write_text(json.dumps({"version": 2, "samples": {"x:0": {"status": "lost", "batch": 0}}}))
    ix = RunIndex(run)
    ix.refresh()
    assert ix.outcomes == [] and len(ix.problems) == 1
    assert "checkpoint.json: not a trajforge checkpoint (at samples.x:0.status" in ix.problems[0]


def test_plain_jsonl_keeps_every_line_and_its_verification(tmp_path: Path) -> None:
    path = tmp_path / "compressed.jsonl"
    recs = [record(0, verification={"passed": True, "score": 1.0, "method": "exact"}),
            record(1, verification={"passed": False, "score": 0.25, "method": "exact"}), record(2)]
    plain = {"conversations": [{"from": "human", "value": "no ids here"},
                               {"from": "gpt", "value": call("web_search", {"q": "x"})}]}
    path.write_bytes(lines(*recs, recs[0], plain).rstrip(b"\n"))  # no final newline: the last line counts
    ix = RunIndex(path)
    ix.refresh()
    entries = ix.entries()
    assert len(entries) == 5 and entries[3].key.startswith("id0:0@")  # a repeated id stays distinct
    assert entries[4].key == "line-5" and entries[4].tools == ("web_search",) and entries[4].tool_calls == 1
    ver = distributions(entries)["verification"]
    assert ver == {"verified": 3, "passed": 2, "failed": 1, "pass_rate": 0.6667, "errors": 0, "errors_by_kind": {},
                   "unverified": 2, "mean_score": 0.75}
    assert [e.passed for e in apply(Query(q="NUMBER 1"), entries)] == [False]


def test_histogram_bins() -> None:
    assert histogram([]) == []
    assert histogram([1, 1, 3]) == [{"lo": 1, "hi": 2, "count": 2}, {"lo": 2, "hi": 3, "count": 0},
                                    {"lo": 3, "hi": 4, "count": 1}]
    bins = histogram(list(range(0, 1000, 7)), bins=10)
    assert sum(b["count"] for b in bins) == len(range(0, 1000, 7))
    assert all(b["hi"] - b["lo"] == 100 for b in bins) and bins[0]["lo"] == 0


def test_filters_compose_and_facets_count(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(lines(record(0, tools={"terminal": (1, 0)}), record(1, tools={"web_search": (1, 0)}),
                           record(2, tools={"terminal": (1, 0)}, completed=False)))
    ix = RunIndex(path)
    ix.refresh()
    entries = ix.entries()
    assert [e.key for e in apply(Query(tool="terminal"), entries)] == ["id0:0", "id2:0"]
    assert [e.key for e in apply(Query(tool="terminal", status="partial"), entries)] == ["id2:0"]
    assert apply(Query(q="prompt number"), entries) == entries
    assert [e.key for e in apply(Query(sort="tokens"), entries)] == ["id2:0", "id1:0", "id0:0"]
    assert [e.key for e in apply(Query(sort="turns", tool="terminal"), entries)] == ["id2:0", "id0:0"]
    f = facets(entries)
    assert f["status"] == {"completed": 2, "partial": 1, "failed": 0, "discarded": 0}
    assert f["tool"] == {"terminal": 2, "web_search": 1}


def test_an_index_read_in_slices_serves_what_it_has_and_ends_as_one_read_at_once(tmp_path: Path) -> None:
    """A big run is read a slice at a time (the server answers between slices): each slice makes
    progress, the first batch file's samples come first, and the index ends as a whole read."""
    run = tmp_path / "run"
    run.mkdir()
    for b in range(3):  # records of each batch in the order they finished, not in dataset order
        (run / f"batch_{b}.jsonl").write_bytes(lines(*(record(i) for i in reversed(range(b * 600, b * 600 + 600)))))
        for r in (json.loads(x) for x in (run / f"batch_{b}.jsonl").read_text().splitlines()):
            assert r["metadata"]["batch_num"] == r["prompt_index"] // 2
    sliced, whole = RunIndex(run), RunIndex(run)
    whole.refresh()
    sliced.refresh(0.0)  # out of time at once: one slice all the same
    assert 0 < len(sliced.records) < 600 and sliced.behind > 0 and sliced.busy()
    slices = 1
    while len(sliced.records) < 600:
        sliced.refresh(0.0)
        slices += 1
    assert sliced.behind > 0
    first = sliced.entries()  # the first batch file is in: the first page is what it will be
    assert [e.prompt_index for e in first[:3]] == [0, 1, 2]
    while sliced.busy():
        sliced.refresh(0.0)
        slices += 1
    assert slices > 3 and not sliced.behind
    assert [e.key for e in sliced.entries()] == [e.key for e in whole.entries()] == [f"id{i}:0" for i in range(1800)]
    assert sliced.totals == whole.totals and sliced.totals.finished == 1800


def test_the_index_keeps_no_object_per_record(tmp_path: Path) -> None:
    import gc

    from trajforge.view.summary import Entry

    path = tmp_path / "t.jsonl"
    path.write_bytes(lines(*(record(i, tools={"terminal": (1, 0)}) for i in range(500))))
    ix = RunIndex(path)
    ix.refresh()
    gc.collect()
    assert len(ix.records) == 500 and not any(isinstance(o, Entry) for o in gc.get_objects())
    page = ix.entries()[:50]  # made for the page that shows them, and gone with it
    assert [e.prompt for e in page][:2] == ["Prompt number 0", "Prompt number 1"] and page[0].tools == ("terminal",)
    assert [e.key for e in apply(Query(q="NUMBER 123"), ix.entries())] == ["id123:0"]


def test_verifier_logs_are_read_from_the_run_directory_and_nowhere_else(tmp_path: Path) -> None:
    from trajforge.view.verifier_logs import FILE_CAP, verifier_logs

    run = tmp_path / "run"
    logs = run / "verifier_logs" / "s1"
    logs.mkdir(parents=True)
    (logs / "test-stdout.txt").write_text("1 passed\n")
    (logs / "big.txt").write_bytes(b"x" * (FILE_CAP + 10))
    (tmp_path / "secret.txt").write_text("outside")
    (logs / "link.txt").symlink_to(tmp_path / "secret.txt")

    def rec(d: object, files: list[str]) -> dict:
        return {"verification": {"detail": {"tests": {"logs": {"dir": d, "files": files}}}}}

    got = verifier_logs(run, rec("verifier_logs/s1", ["test-stdout.txt", "big.txt", "link.txt", "../../secret.txt"]))
    assert [(f["name"], f["truncated"]) for f in got] == [("test-stdout.txt", False), ("big.txt", True)]
    assert got[0]["text"] == "1 passed\n" and len(got[1]["text"]) == FILE_CAP
    assert verifier_logs(run, rec("..", ["secret.txt"])) == [] and verifier_logs(run, rec("/etc", ["passwd"])) == []
    assert verifier_logs(None, rec("verifier_logs/s1", ["test-stdout.txt"])) == []
    assert verifier_logs(run, {"verification": {"detail": "a string"}}) == []
