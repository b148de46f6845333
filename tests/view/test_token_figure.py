"""The viewer's prefix-integrity figure: a real run that captured token ids (a template that drops
earlier reasoning, so integrity is below 1), the real viewer, the page in headless Chromium."""

from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import cli
from tests.support.scripted_server import ScriptedServer
from tests.support.token_server import DROP_REASONING, TokenServer, terminal_policy
from tests.view.test_browser import _env, browser, figure, page, shot, viewer_of  # noqa: F401  (fixtures)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def captured_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tokenrun")
    (root / "ds.jsonl").write_text("".join(json.dumps({"prompt": f"say w{i}"}) + "\n" for i in range(3)))
    with ScriptedServer(TokenServer(terminal_policy(turns=2, reasoning_at=(1,)), template=DROP_REASONING)) as srv:
        proc = subprocess.run(cli("run", "--dataset_file=ds.jsonl", "--run_name=t", f"--base_url={srv.url}",
                                  "--model=policy", "--distribution=terminal_only", "--sandbox=local",
                                  "--capture_tokens"), cwd=root, env=_env(), capture_output=True, text=True,
                              timeout=120)
    assert proc.returncode == 0, proc.stderr
    return root / "data" / "t"


def test_the_overview_shows_the_run_s_prefix_integrity(captured_run: Path, viewer_of, page) -> None:  # noqa: F811
    stats = json.loads((captured_run / "statistics.json").read_text())["run"]
    assert stats["token_capture"]["prefix_integrity"] == 0.5
    v = viewer_of(captured_run)
    with urllib.request.urlopen(v.url + "api/overview") as r:
        assert json.loads(r.read())["figures"] == stats
    page.goto(v.url)
    page.wait_for_selector('[data-fig="token_capture.prefix_integrity"]')
    assert float(figure(page, "token_capture.prefix_integrity")) == 0.5
    assert page.locator('[data-fig="token_capture.prefix_integrity"] .v').inner_text() == "50.0%"
    shot(page, "overview-tokens")
    # A sample: its segments and breaks, not its thousands of ids.
    rec = json.loads((captured_run / "trajectories.jsonl").read_text().splitlines()[0])
    key = urllib.parse.quote(rec["sample_id"])
    with urllib.request.urlopen(v.url + f"api/sample?key={key}") as r:
        assert json.loads(r.read())["record"]["tokens"] == {"segments": 2, "prefix_breaks": 1}
    page.goto(v.url + f"#/sample?key={key}")
    row = page.locator("table.meta tr", has_text="token ids")
    assert row.locator("td").inner_text() == "2 segment(s), 1 prefix break(s)"
