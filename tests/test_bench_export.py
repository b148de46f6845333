"""bench/export.py on a small synthetic run: every format exports every trajectory, and the
figures it reports are measured from the reaped export process."""

from __future__ import annotations

import importlib.util
import sys

import orjson

from tests.conftest import REPO
from trajforge.export.convert import to_openai

spec = importlib.util.spec_from_file_location("bench_export", REPO / "bench" / "export.py")
assert spec is not None and spec.loader is not None
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench
spec.loader.exec_module(bench)


def test_synthetic_trajectories_are_realistic(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "t.jsonl"
    bench.synthesise(path, 20)
    recs = [orjson.loads(x) for x in path.read_bytes().splitlines()]
    assert len({r["sample_id"] for r in recs}) == 20
    item = to_openai(recs[0])
    calls = [len(m.get("tool_calls", [])) for m in item["messages"] if m["role"] == "assistant"]
    assert calls == [2, 1, 0] and recs[0]["tool_stats"]["terminal"] == {"count": 3, "success": 2, "failure": 1}
    assert sum(r["completed"] for r in recs) == 18


def test_every_format_exports_every_trajectory_and_is_measured(capsys) -> None:  # type: ignore[no-untyped-def]
    rows = bench.main(["--samples", "300", "--split", "train=0.9,test=0.1"])
    assert [r["format"] for r in rows] == list(bench.FORMATS)
    for r in rows:
        assert r["exported"] == 300 and r["peak_rss_mb"] > 10 and r["cpu_s"] > 0 and r["output_mb"] > 0
    assert "| hf | 300 |" in capsys.readouterr().out
