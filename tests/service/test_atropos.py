"""`trajforge serve --push atropos=URL` against the real Atropos API server (atroposlib.api:app,
started here on loopback): a consumer registers as a trainer and pulls /batch, and the batches'
tokens and masks are trajforge's token export of the same rollouts (masks: -100 where the model
did not generate the token)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.service.test_serve import Service
from tests.support.scripted_server import ScriptedServer
from tests.support.token_server import TokenServer, terminal_policy
from trajforge.export.tokens import segment_rows

pytest.importorskip("atroposlib.api", reason="the test extras install atroposlib (make venv)")


@pytest.fixture
def atropos() -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "atroposlib.api:app", "--fd", str(sock.fileno()),
                             "--log-level", "warning"], pass_fds=(sock.fileno(),))
    sock.close()  # the server holds it: connections queue in its backlog until it accepts them
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def call(url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_groups_pushed_to_atropos_come_out_of_batch_as_the_token_export_has_them(
        atropos: str, tmp_path: Path) -> None:
    # the trainer: registered and started (its first /batch) before the service registers its env
    call(f"{atropos}/register", {"wandb_group": "g", "wandb_project": "p", "batch_size": 2, "max_token_len": 4096,
                                 "checkpoint_dir": str(tmp_path / "ckpt"), "save_checkpoint_interval": 0,
                                 "starting_step": 0, "num_steps": 10})
    assert call(f"{atropos}/batch")["batch"] is None
    with ScriptedServer(TokenServer(terminal_policy(turns=1))) as server:
        service = Service(server, tmp_path, "--capture_tokens", "--keep_no_reasoning", f"--push=atropos={atropos}")
        try:
            rows = [{"prompt": "say alpha", "check": "true"}, {"prompt": "say beta", "check": "false"}]
            _, made = service.request("POST", "/groups", {"rows": rows, "n": 2})
            groups = service.take(2)
            batches = []
            deadline = time.monotonic() + 120  # the pull protocol announces nothing: the trainer asks
            while len(batches) < 2 and time.monotonic() < deadline:
                batch = call(f"{atropos}/batch")["batch"]
                if batch is None:
                    time.sleep(0.05)
                    continue
                batches.append(batch)
        finally:
            assert service.stop() == 0
    assert len(batches) == 2, "both groups reached the trainer"
    pulled = sorted((tuple(seq), tuple(mask), score) for batch in batches for item in batch
                    for seq, mask, score in zip(item["tokens"], item["masks"], item["scores"], strict=True))
    records = [json.loads(line) for line in (tmp_path / "svc" / "trajectories.jsonl").read_text().splitlines()]
    exported = sorted((tuple(row["input_ids"]), tuple(t if m else -100 for t, m in zip(row["input_ids"], row["loss_mask"])),
                       row["reward"]) for rec in records for row in segment_rows(rec, None))
    assert len(exported) == 4 and pulled == exported
    assert {g["id"] for g in groups} == set(made["ids"])


def test_a_group_without_token_ids_is_not_pushed_and_is_counted(atropos: str, tmp_path: Path) -> None:
    from tests.support.policies import echo_policy

    with ScriptedServer(echo_policy(turns=1)) as server:
        service = Service(server, tmp_path, f"--push=atropos={atropos}")  # no --capture_tokens
        try:
            service.request("POST", "/groups", {"rows": [{"prompt": "say a", "check": "true"}], "n": 2})
            service.take(1)
            deadline = time.monotonic() + 60
            while not (shown := service.request("GET", "/status")[1])["not_pushed"] and time.monotonic() < deadline:
                time.sleep(0.05)  # the push runs beside the stream
            assert shown["not_pushed"] == {"no_tokens": 1}
        finally:
            assert service.stop() == 0
