"""The docs' `trajforge serve` block (docs/training.md), run: the service with the README's flags (its model
server replaced by the scripted one on loopback, its port by a free one), then each curl of the
block in order against it; each must exit 0 and answer what the README says."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.service.test_serve import Service
from tests.support.docs import page
from tests.support.policies import echo_policy
from tests.support.scripted_server import ScriptedServer


def serve_block() -> list[str]:
    text = page("training.md")
    section = text[text.index("## Rollout service for RL trainers"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None
    return block.group(1).replace("\\\n", " ").strip().splitlines()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_readme_serve_block_runs(tmp_path: Path) -> None:
    serve, *curls = serve_block()
    words = shlex.split(serve)
    assert words[:2] == ["trajforge", "serve"] and curls and all(c.startswith("curl ") for c in curls)
    kept = [w for w in words[2:] if not w.startswith("http")]  # the flags but the model server's address
    kept = [w for i, w in enumerate(kept) if not (w == "--base_url")]
    with ScriptedServer(echo_policy(turns=1)) as server:
        service = Service(server, tmp_path, *kept)
        try:
            base = service.url.removesuffix("/v1")
            answers = []
            for line in curls:
                if "/groups/stream" in line:  # the README's stream shows finished groups: wait for the first
                    service.take(1)
                done = subprocess.run(shlex.split(line.replace("http://127.0.0.1:8780", base)),
                                      capture_output=True, text=True, timeout=60)
                assert done.returncode == 0, (line, done.stderr)
                answers.append(done.stdout)
            ids = json.loads(answers[0])["ids"]
            streamed = [json.loads(x) for x in answers[1].splitlines()]
            assert [g["id"] for g in streamed] == ids and streamed[0]["usable"] == 4
            assert json.loads(answers[2]) == {"policy_version": 2}
            assert json.loads(answers[3])["finished_unacked"] == 1
        finally:
            assert service.stop() == 0
