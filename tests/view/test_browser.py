"""`trajforge view` end to end: a real run made by the CLI against the scripted model server, the
real viewer process, and the page driven in headless Chromium.

Screenshots of the three views are saved under test-artifacts/view/ (git-ignored) for review.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, cli
from tests.support.commands import run_trajforge, user_env
from tests.support.scripted_server import ScriptedServer
from tests.support.view_policy import PROMPTS, TASK_TYPES, XSS, view_policy
from tests.support.run_state import read_records

pytestmark = pytest.mark.timeout(180)
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = REPO / "test-artifacts" / "view"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run holding every kind of sample the viewer shows (see view_policy)."""
    root = tmp_path_factory.mktemp("viewrun")
    rows = [{"prompt": p} | ({"task_type": TASK_TYPES[k]} if (k := p.split(":")[0]) in TASK_TYPES else {})
            for p in PROMPTS]
    (root / "ds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with ScriptedServer(view_policy) as srv:
        proc = run_trajforge("run", "--dataset_file=ds.jsonl", "--batch_size=4", "--run_name=r",
                             f"--base_url={srv.url}", "--model=scripted-model", "--distribution=terminal_only",
                             "--sandbox=local", "--max_retries=0", "--max_turns=3", cwd=root)
    assert proc.returncode == 3, proc.stderr  # the failed samples are part of the scenario (exit code 3)
    return root / "data" / "r"


class Viewer:
    def __init__(self, source: Path, cwd: Path) -> None:
        self.proc = subprocess.Popen(cli("view", str(source), "--port", "0"), cwd=cwd, env=user_env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.line = self.proc.stdout.readline()
        m = re.search(r"(http://127\.0\.0\.1:\d+/)", self.line)
        if m is None:
            self.proc.kill()
            raise AssertionError(f"no URL line: {self.line!r} {self.proc.communicate()[1]}")
        self.url = m.group(1)

    def stop(self) -> None:
        self.proc.terminate()
        assert self.proc.wait(10) == 0  # SIGTERM (like Ctrl-C) is a clean stop


@pytest.fixture
def viewer_of() -> Iterator:
    started: list[Viewer] = []

    def start(source: Path) -> Viewer:
        v = Viewer(source, source.parent)
        started.append(v)
        return v

    yield start
    for v in started:
        v.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator:
    if not CHROMIUM.exists():
        pytest.skip("Chromium is not installed (apt-get install chromium); the CI setup installs it")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    from trajforge.tools.browser.toolset import LAUNCH_ARGS

    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                               args=["--headless", "--no-sandbox", "--disable-gpu", *LAUNCH_ARGS])
        yield b
        b.close()


@pytest.fixture
def page(browser) -> Iterator:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(60_000)  # the machine is shared: generous, never relied on
    p = context.new_page()
    p.dialogs = []  # type: ignore[attr-defined]
    p.on("dialog", lambda d: (p.dialogs.append(d.message), d.dismiss()))  # type: ignore[attr-defined]
    p.console_errors = []  # type: ignore[attr-defined]
    p.on("console", lambda m: m.type == "error" and p.console_errors.append(m.text))  # type: ignore[attr-defined]
    yield p
    context.close()
    # nothing the page did was refused (a CSP violation is a console error) and no script ran a dialog
    assert p.console_errors == [] and p.dialogs == []  # type: ignore[attr-defined]


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


def figure(page, key: str) -> str:
    return page.locator(f'[data-fig="{key}"]').get_attribute("data-value")


def test_overview_figures_equal_statistics_json(run_dir: Path, viewer_of, page) -> None:
    v = viewer_of(run_dir)
    assert v.line.startswith("trajforge view: ") and "(12 samples)" in v.line
    stats = json.loads((run_dir / "statistics.json").read_text())["run"]
    with urllib.request.urlopen(v.url + "api/overview") as r:
        assert json.loads(r.read())["figures"] == stats  # every figure, computed the run's way
    page.goto(v.url)
    page.wait_for_selector('[data-fig="samples.finished"]')
    s = stats["samples"]
    for key in ("total", "finished", "completed", "partial", "failed", "discarded"):
        assert figure(page, f"samples.{key}") == str(s[key]), key
    for key in ("prompt", "completion", "reasoning"):
        assert figure(page, f"tokens.{key}") == str(stats["tokens"][key]), key
    assert float(figure(page, "cost")) == stats["cost"]
    assert figure(page, "api_calls") == str(stats["api_calls"])
    assert float(figure(page, "reasoning.coverage")) == stats["reasoning"]["coverage"]
    assert float(figure(page, "throughput_samples_per_minute")) == stats["throughput_samples_per_minute"]
    assert page.locator('[data-fig="samples.finished"] .v').inner_text() == str(s["finished"])
    # the bars: one per failure class and discard reason with its count, one per tool used
    for cls, n in s["failed_by_class"].items():
        row = page.locator(f'[data-chart="failed"] [data-label="{cls}"] .bv')
        assert row.inner_text() == str(n), cls
    for reason, n in s["discarded_by_reason"].items():
        assert page.locator(f'[data-chart="discarded"] [data-label="{reason}"] .bv').inner_text() == str(n)
    used = {name: t for name, t in stats["tools"].items() if t["count"]}
    assert set(page.locator('[data-chart="tools"] .barrow').evaluate_all("rs => rs.map(r => r.dataset.label)")) \
        == set(used)
    assert page.locator('[data-chart="tools"] [data-label="read_file"] .bv').inner_text() == "1 calls · 0.0% ok"
    heights = page.locator('[data-chart="turns"] .hl').all_inner_texts()
    assert heights, "the turns histogram is drawn"
    assert page.dialogs == [] and page.console_errors == []
    shot(page, "overview")


def test_filter_by_failure_class_lists_exactly_those_samples(run_dir: Path, viewer_of, page) -> None:
    v = viewer_of(run_dir)
    ckpt = json.loads((run_dir / "checkpoint.json").read_text())["samples"]
    page.goto(v.url + "#/samples")
    page.wait_for_selector("#samples tbody tr")
    assert page.locator("#samples tbody tr").count() == 12
    shot(page, "list")
    for cls in ("api_error", "rate_limit", "model_error"):
        page.select_option('select[data-filter="reason"]', cls)
        page.wait_for_function(f"() => [...document.querySelectorAll('#samples tbody tr')]"
                               f".every(r => r.dataset.reason === '{cls}')")
        keys = page.locator("#samples tbody tr").evaluate_all("rs => rs.map(r => r.dataset.key)")
        expected = {k for k, e in ckpt.items() if e["status"] == "failed" and e.get("reason") == cls}
        assert expected and sorted(keys) == sorted(expected), cls
    # the two api_error samples show their prompts (from the dataset) and the failure message
    page.select_option('select[data-filter="reason"]', "api_error")
    page.wait_for_function("() => document.querySelectorAll('#samples tbody tr').length === 2")
    text = page.locator("#samples").inner_text()
    assert "apifail: the API breaks" in text and "apifail: the API breaks again" in text
    shot(page, "list-failed")
    # task types come from the dataset (records do not carry them)
    page.goto(v.url + "#/samples")
    page.wait_for_function("() => document.getElementById('page-info')?.textContent.endsWith(' 12 samples')")
    page.select_option('select[data-filter="task_type"]', "shell")
    page.wait_for_function("() => document.getElementById('page-info')?.textContent.endsWith(' 2 samples')")
    assert sorted(page.locator("#samples td.prompt a").all_inner_texts()) == [
        "long: print many lines", "parallel: run two commands at once"]
    # paging: 12 samples, 5 a page
    page.goto(v.url + "#/samples?size=5")
    page.wait_for_function("() => document.getElementById('page-info')?.textContent === 'page 1 of 3 · 12 samples'")
    first_page = page.locator("#samples tbody tr").evaluate_all("rs => rs.map(r => r.dataset.key)")
    page.locator("#pager a", has_text="next").click()
    page.wait_for_function("() => document.getElementById('page-info')?.textContent.startsWith('page 2 of 3')")
    second_page = page.locator("#samples tbody tr").evaluate_all("rs => rs.map(r => r.dataset.key)")
    assert len(first_page) == len(second_page) == 5 and not set(first_page) & set(second_page)
    page.locator("#pager a", has_text="last").click()
    page.wait_for_function("() => document.getElementById('page-info')?.textContent.startsWith('page 3 of 3')")
    assert page.locator("#samples tbody tr").count() == 2
    # typing on while a search runs loses nothing: the box keeps focus, caret and keystrokes
    page.goto(v.url + "#/samples")
    page.wait_for_selector("#samples tbody tr")
    page.locator("#search").type("api", delay=50)
    page.wait_for_function("() => location.hash.includes('q=api')")
    page.keyboard.type("fail: the API breaks again", delay=20)
    page.wait_for_function("() => document.querySelectorAll('#samples tbody tr').length === 1")
    assert page.locator("#search").input_value() == "apifail: the API breaks again"
    # sorting by a column: largest first, ties in dataset order
    page.goto(v.url + "#/samples")
    page.wait_for_selector("#samples tbody tr")
    page.locator('a[data-sort="tokens"]').click()
    page.wait_for_function("() => document.querySelector('th.sorted')")
    tokens = [int(t.replace(",", "")) for t in page.locator("#samples tbody tr td:nth-child(7)").all_inner_texts()
              if t != "–"]
    assert tokens == sorted(tokens, reverse=True) and len(tokens) == 8
    # status filter + text search compose
    page.goto(v.url + "#/samples?status=completed&q=PARALLEL")
    page.wait_for_function("() => document.getElementById('page-info')?.textContent.endsWith(' 1 samples')")
    assert page.locator("#samples tbody tr").count() == 1


def _open_sample(page, url: str, search: str) -> None:
    page.goto(url + "#/samples")
    page.wait_for_selector("#samples tbody tr")
    page.fill("#search", search)
    page.wait_for_function("() => document.querySelectorAll('#samples tbody tr').length === 1")
    page.locator("#samples tbody tr td.prompt a").click()
    page.wait_for_selector("#turns")


def test_parallel_calls_show_each_result_under_its_call(run_dir: Path, viewer_of, page) -> None:
    v = viewer_of(run_dir)
    _open_sample(page, v.url, "parallel")
    calls = page.locator(".turn.gpt").first.locator(".call")
    assert calls.count() == 2
    first, second = calls.nth(0), calls.nth(1)
    assert "echo alpha-out" in first.locator("pre.args").inner_text()
    assert "alpha-out" in first.locator(".result").inner_text()
    assert "beta-out" not in first.locator(".result").inner_text()
    assert first.locator(".result").get_attribute("data-result-id") == "call_alpha"
    assert "echo beta-out" in second.locator("pre.args").inner_text()
    assert "beta-out" in second.locator(".result").inner_text()
    assert "alpha-out" not in second.locator(".result").inner_text()
    # system turn collapsed, listing the offered tools
    system = page.locator("details.turn.system")
    assert system.get_attribute("open") is None
    assert "terminal" in system.locator("summary").first.inner_text()
    assert page.locator("#prev").count() == 0 and page.locator("#next").count() == 0  # alone in its filter
    shot(page, "conversation-parallel")
    key = page.locator("table.meta tr", has_text="sample").first.locator("td").inner_text()
    page.goto(v.url + "#/sample?key=" + key)  # unfiltered: the first sample of the run
    page.wait_for_function("() => document.querySelector('#next')")
    assert page.locator("#prev").count() == 0
    page.locator("#next").click()
    page.wait_for_function("() => document.querySelector('.turn.human')?.textContent.includes('xss')")
    page.keyboard.press("k")  # back to the previous sample from the keyboard
    page.wait_for_function("() => document.querySelector('.turn.human')?.textContent.includes('parallel')")


def test_hostile_tool_output_renders_as_text_and_runs_nothing(run_dir: Path, viewer_of, page) -> None:
    v = viewer_of(run_dir)
    _open_sample(page, v.url, "xss")
    result = page.locator(".call .result").first
    assert XSS in result.inner_text()  # shown literally
    assert "<img src=x onerror=alert(2)>" in page.locator(".turn.human").inner_text()
    page.locator(".reasoning summary").first.click()
    assert "<b>carefully</b>" in page.locator(".reasoning pre").first.inner_text()
    # no element came from the data
    assert page.locator("main script, main img, .reasoning b, .turn.human img").count() == 0
    assert page.locator("script").count() == 1  # only app.js
    page.wait_for_timeout(300)
    assert page.dialogs == []
    shot(page, "conversation-hostile")


def test_errors_highlighted_long_output_folded(run_dir: Path, viewer_of, page) -> None:
    v = viewer_of(run_dir)
    _open_sample(page, v.url, "read a file")
    assert page.locator(".call .result.error").count() == 1
    shot(page, "conversation-error")
    _open_sample(page, v.url, "many lines")
    fold = page.locator(".call .result details.fold")
    assert fold.count() == 1 and "more lines" in fold.locator("summary").inner_text()
    assert "300" not in page.locator(".call .result pre.preview").inner_text().split()
    shot(page, "conversation-long")
    fold.locator("summary").click()
    assert "300" in fold.locator("pre").inner_text().split()


def test_live_run_refreshes_overview_and_list(run_dir: Path, tmp_path: Path, viewer_of, page) -> None:
    """A run directory that grows while the page is open: the page catches up on its own."""
    live = tmp_path / "data" / "live"
    live.mkdir(parents=True)
    lines = b"".join((run_dir / "batch_0.jsonl").read_bytes().splitlines(keepends=True))
    first, rest = lines.splitlines(keepends=True)[:1], lines.splitlines(keepends=True)[1:]
    (live / "batch_0.jsonl").write_bytes(b"".join(first))
    lock = os.open(live / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)  # what a running `trajforge run` holds
    try:
        v = viewer_of(live)
        page.goto(v.url)
        page.wait_for_selector('[data-fig="samples.finished"]')
        assert figure(page, "samples.finished") == "1"
        assert page.locator("#live").inner_text() == "● live"
        with (live / "batch_0.jsonl").open("ab") as f:
            f.write(b"".join(rest))
            f.write(rest[0][:40])  # a line still being written is not read yet
        page.wait_for_function("() => document.querySelector('[data-fig=\"samples.finished\"]').dataset.value === "
                               f"'{len(lines.splitlines())}'", timeout=15000)
        page.goto(v.url + "#/samples")
        page.wait_for_selector("#samples tbody tr")
        before = page.locator("#samples tbody tr").count()
        shutil.copy(run_dir / "batch_1.jsonl", live / "batch_1.jsonl")
        page.wait_for_function(f"() => document.querySelectorAll('#samples tbody tr').length > {before}", timeout=15000)
    finally:
        os.close(lock)
    page.reload()
    page.wait_for_function("() => document.getElementById('live').textContent === 'finished'", timeout=10000)


def test_plain_jsonl_file_with_verification(run_dir: Path, tmp_path: Path, viewer_of, page) -> None:
    """A JSONL file that is not a run directory (here: verified records, as a compressor or an
    export would write them)."""
    recs = read_records(run_dir)
    for i, rec in enumerate(recs):
        rec["verification"] = {"passed": i % 2 == 0, "score": 1.0 if i % 2 == 0 else 0.0, "method": "exact",
                               "detail": "expected <b>42</b>"}
    path = tmp_path / "verified.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    v = viewer_of(path)
    page.goto(v.url)
    page.wait_for_selector('[data-fig="samples.finished"]')
    assert figure(page, "samples.finished") == str(len(recs))
    passed = sum(1 for r in recs if r["verification"]["passed"])
    assert float(figure(page, "verification.pass_rate")) == round(passed / len(recs), 4)
    assert page.locator("#live").inner_text() == "file"
    page.goto(v.url + "#/samples")
    page.wait_for_selector("#samples tbody tr")
    verdicts = page.locator("#samples tbody tr td:nth-child(9)").all_inner_texts()
    assert verdicts.count("✓ passed 1.00") == passed and verdicts.count("✗ failed 0.00") == len(recs) - passed
    _open_sample(page, v.url, "parallel")
    assert page.locator(".call").count() == 2
    assert "expected <b>42</b>" in page.locator("table.meta").inner_text()


def test_server_refuses_foreign_hosts_and_writes(run_dir: Path, viewer_of) -> None:
    v = viewer_of(run_dir)
    with urllib.request.urlopen(v.url + "api/status") as r:
        assert "script-src 'self'" in r.headers["Content-Security-Policy"]
        assert json.loads(r.read())["samples"] == 12
    req = urllib.request.Request(v.url + "api/status", headers={"Host": "attacker.example"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 403  # DNS rebinding: a foreign page cannot read the run
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(v.url + "api/status", data=b"x", method="POST"))
    assert e.value.code == 405
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(v.url + "static/..%2f..%2fserver.py")
    assert e.value.code == 404


def test_bad_source_is_one_clear_line(tmp_path: Path) -> None:
    for target, needle in ((tmp_path / "nope", "no such run directory or JSONL file"),
                           (tmp_path, "not a run directory")):
        proc = run_trajforge("view", target, "--port", "0", timeout=30)  # a viewer that served instead: this timeout
        assert proc.returncode == 2
        assert proc.stderr.count("\n") == 1 and needle in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "data" / "run1").mkdir(parents=True)
    (tmp_path / "data" / "run1" / "checkpoint.json").write_text("{}")
    proc = run_trajforge("view", tmp_path / "data", "--port", "0", timeout=30)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "runs inside it: " in proc.stderr
    assert str(tmp_path / "data" / "run1") in proc.stderr
    proc = run_trajforge("view", tmp_path, "--port", "99999", timeout=30)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "port number" in proc.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        (tmp_path / "t.jsonl").write_text("{}\n")
        proc = run_trajforge("view", tmp_path / "t.jsonl", "--port", port, timeout=30)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in proc.stderr


def test_a_record_rewritten_under_the_index_is_never_shown_as_another(run_dir: Path, tmp_path: Path,
                                                                      viewer_of) -> None:
    run = tmp_path / "data" / "copy"
    shutil.copytree(run_dir, run)
    v = viewer_of(run)
    with urllib.request.urlopen(v.url + "api/samples?status=completed") as r:
        first = json.loads(r.read())["items"][0]["key"]
    batch = run / "batch_0.jsonl"
    lines = batch.read_bytes().splitlines(keepends=True)
    batch.write_bytes(b"".join(reversed(lines)))  # same file, same size, other records at each offset
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(v.url + "api/sample?key=" + urllib.parse.quote(first))
    assert e.value.code == 409 and "reload" in json.loads(e.value.read())["error"]


def test_watching_a_real_run_while_it_runs(tmp_path: Path, viewer_of, page) -> None:
    """`trajforge run` in progress, the page open on it: the figures grow on their own, then settle
    on statistics.json's."""
    from tests.support.policies import echo_policy

    prompts = [f"say word{i}" for i in range(24)]  # ~12 s of run: the page is open well before its end
    (tmp_path / "ds.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    run = tmp_path / "data" / "r"
    with ScriptedServer(echo_policy(turns=1, delay=0.5)) as srv:
        proc = subprocess.Popen(cli("run", "--dataset_file=ds.jsonl", "--batch_size=4", "--run_name=r",
                                    f"--base_url={srv.url}", "--model=scripted-model", "--num_workers=2",
                                    "--distribution=terminal_only", "--sandbox=local"),
                                cwd=tmp_path, env=user_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        try:
            deadline = time.monotonic() + 60
            while not (run / "checkpoint.json").exists():  # the run saves it before its first sample
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the run did not start: {proc.communicate()[1]}")
                time.sleep(0.05)
            v = viewer_of(run)
            page.goto(v.url)
            page.wait_for_function("() => document.getElementById('live').textContent === '● live'")
            seen = int(figure(page, "samples.finished"))
            assert seen < len(prompts)
            page.wait_for_function("n => Number(document.querySelector('[data-fig=\"samples.finished\"]')"
                                   ".dataset.value) > n", arg=seen)
            assert proc.wait(120) == 0, proc.stderr.read()  # type: ignore[union-attr]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    page.wait_for_function("() => document.getElementById('live').textContent === 'finished'")
    page.wait_for_function("() => document.querySelector('[data-fig=\"samples.finished\"]').dataset.value === '24'")
    with urllib.request.urlopen(v.url + "api/overview") as r:
        assert json.loads(r.read())["figures"] == json.loads((run / "statistics.json").read_text())["run"]
