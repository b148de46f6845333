"""trajforge.Rollouts, the rollout service's Python API: the README's example script run against
the scripted server, and the API in this process (groups as they finish, versions as set)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.support.policies import echo_policy
from tests.support.scripted_server import ScriptedServer

import trajforge


def test_the_example_runs(tmp_path: Path) -> None:
    with ScriptedServer(echo_policy(turns=1)) as server:
        done = subprocess.run([sys.executable, str(REPO / "examples" / "rollouts_api.py"), "--base_url", server.url,
                               "--model", "scripted-model", "--output_dir", str(tmp_path)],
                              capture_output=True, text=True, timeout=180, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 0, done.stderr
    lines = [x for x in done.stdout.splitlines() if x.startswith("group ")]
    assert len(lines) == 2 and all("4/4 usable" in x for x in lines)
    assert (tmp_path / "rollouts_api" / "trajectories.jsonl").read_text().count("\n") == 8  # the same run files


def test_groups_come_as_they_finish_with_the_versions_set(tmp_path: Path) -> None:
    settings = {"run_name": "api", "output_dir": str(tmp_path), "model": "scripted-model", "api_key": "k",
                "sandbox": "local", "distribution": "terminal_only", "policy_version": 5}

    async def main(url: str) -> list[dict]:
        got = []
        async with trajforge.Rollouts({**settings, "base_url": url}) as r:
            async for group in r.generate([{"prompt": "say a", "check": "true"}], n=3):
                got.append(group)
            r.set_policy(6)
            async for group in r.generate([{"prompt": "say b", "check": "false"}], n=2):
                got.append(group)
        return got

    with ScriptedServer(echo_policy(turns=1)) as server:
        groups = asyncio.run(main(server.url))
    assert [[r["reward"] for r in g["rollouts"]] for g in groups] == [[1.0] * 3, [0.0] * 2]
    assert [{v for r in g["rollouts"] for v in r["policy_versions"]} for g in groups] == [{5}, {6}]
