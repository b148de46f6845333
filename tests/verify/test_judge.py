"""The rubric judge against the scripted server: scores, thresholds, an invalid reply, an API
that keeps failing, the judge's own model and key, and its spend counted with the sample."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.support.commands import run_trajforge
from tests.support.policies import echo_policy
from tests.support.scripted_server import Recorded, Reply, ScriptedServer, chat, http_error
from tests.support.run_state import read_records

REPLIES = {
    "high": '{"score": 0.9, "reasoning": "mentions the token"}',
    "low": 'Verdict:\n```json\n{"score": 0.2, "reasoning": "off topic"}\n```',
    "edge": '{"score": 0.5, "reasoning": "borderline"}',
    "strict": '{"score": 0.9, "reasoning": "good but the row asks for more"}',
    "invalid": "I would give this a solid B+.",
    "outofrange": '{"score": 7, "reasoning": "out of ten"}',
}
AGENT = echo_policy(turns=1)


def is_judge(req: Recorded) -> bool:
    return "strict grader" in json.dumps(req.body.get("messages", [])[:1])


def handler(req: Recorded) -> Reply:
    if not is_judge(req):
        return AGENT(req)
    task = req.body["messages"][1]["content"]
    mode = task.split("JUDGE=")[1].split()[0]
    if mode == "down":
        return http_error(503, "judge overloaded")
    return chat(REPLIES[mode], usage={"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107})


def rows() -> list[dict]:
    out = []
    for mode in ("high", "low", "edge", "strict", "invalid", "outofrange", "down"):
        row = {"prompt": f"say JUDGE={mode} word{mode}", "rubric": f"The answer must contain word{mode}."}
        if mode == "strict":
            row["judge_threshold"] = 0.95
        out.append(row)
    return out


def run(tmp_path: Path, server: ScriptedServer, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    ds = tmp_path / "judged.jsonl"
    ds.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    argv = ["run", f"--dataset_file={ds}", "--batch_size=4", "--run_name=j", f"--base_url={server.url}",
            "--model=scripted-model", "--distribution=terminal_only", "--sandbox=local", "--max_retries=1", *extra]
    return run_trajforge(*argv, cwd=tmp_path, env=env, timeout=300)


def records(tmp_path: Path) -> dict[str, dict]:
    return {r["conversations"][1]["value"].split("JUDGE=")[1].split()[0]: r
            for r in read_records(tmp_path / "data" / "j")}


def test_judge_scores_thresholds_and_errors(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    server.handler = handler
    env = {**clean_env, "JUDGE_KEY": "judge-secret-9"}
    proc = run(tmp_path, server, env, "--judge_model=grader-1", "--judge_api_key_env=JUDGE_KEY")
    assert proc.returncode == 0, proc.stderr
    recs = records(tmp_path)
    v = {mode: r["verification"] for mode, r in recs.items()}
    assert (v["high"]["passed"], v["high"]["score"]) == (True, 0.9)
    assert v["high"]["method"] == "rubric" and v["high"]["detail"]["rubric"]["reasoning"] == "mentions the token"
    assert (v["low"]["passed"], v["low"]["score"]) == (False, 0.2)
    assert v["edge"]["passed"] is True  # score >= threshold
    assert v["strict"]["passed"] is False and v["strict"]["detail"]["rubric"]["threshold"] == 0.95
    for mode in ("invalid", "outofrange"):
        assert v[mode]["passed"] is None and v[mode]["score"] is None and v[mode]["error"] == "judge_invalid", v[mode]
    assert "B+" in v["invalid"]["detail"]["rubric"]["reply_tail"]
    assert v["down"]["error"] == "judge_failed" and "503" in v["down"]["detail"]["rubric"]["message"]
    # The judge's tokens are part of the sample's spend; the agent's two calls are 10 prompt tokens each.
    assert recs["high"]["usage"]["prompt_tokens"] == 20 + 100 and recs["down"]["usage"]["prompt_tokens"] == 20

    judge_reqs = [r for r in server.requests if r.path.endswith("/chat/completions") and is_judge(r)]
    agent_reqs = [r for r in server.requests if r.path.endswith("/chat/completions") and not is_judge(r)]
    assert {r.body["model"] for r in judge_reqs} == {"grader-1"} and "tools" not in judge_reqs[0].body
    assert all(r.headers["Authorization"] == "Bearer judge-secret-9" for r in judge_reqs)
    assert all("judge-secret-9" not in r.headers.get("Authorization", "") for r in agent_reqs)
    assert len([r for r in judge_reqs if "JUDGE=down" in json.dumps(r.body)]) == 2  # the first try and 1 retry
    # The judge saw the task and the agent's final answer; the agent never saw the rubric.
    high = next(r for r in judge_reqs if "JUDGE=high" in json.dumps(r.body)).body
    assert "Done: wordhigh" in high["messages"][1]["content"] and "must contain wordhigh" in high["messages"][1]["content"]
    assert not any("must contain" in json.dumps(r.body) for r in agent_reqs)

    stats = json.loads((tmp_path / "data" / "j" / "statistics.json").read_text())["run"]["verification"]
    assert (stats["passed"], stats["failed"], stats["errors"]) == (2, 2, 3)
    assert stats["errors_by_kind"]["judge_invalid"] == 2 and stats["errors_by_kind"]["judge_failed"] == 1
    assert "verification error: judge_invalid" in proc.stdout


def test_judge_defaults_to_the_run_model(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    server.handler = handler
    proc = run(tmp_path, server, clean_env, "--keep=passed")
    assert proc.returncode == 0, proc.stderr
    judge_reqs = [r for r in server.requests if r.path.endswith("/chat/completions") and is_judge(r)]
    assert judge_reqs and {r.body["model"] for r in judge_reqs} == {"scripted-model"}
    assert sorted(records(tmp_path)) == ["edge", "high"]  # --keep passed


def test_a_missing_judge_key_stops_before_the_run(tmp_path: Path, server: ScriptedServer, clean_env) -> None:
    server.handler = handler
    proc = run(tmp_path, server, clean_env, "--judge_api_key_env=NO_SUCH_JUDGE_KEY")
    assert proc.returncode == 2 and "NO_SUCH_JUDGE_KEY" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "data" / "j").exists() and not server.requests
