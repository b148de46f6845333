"""The viewer tells the truth: verification states as statistics.json counts them, and text
exactly as the record holds it, in a real browser (headless Chromium) over a real run.

A record's verification is one of four states (verify.result.verdict): not verified (the row
asked for nothing: every demo trajectory), an error with its kind (the check timed out), passed,
failed. Every piece of text the page shows (run name, model, prompts, task types, reasoning,
answers, tool arguments and results, failure messages, verification details) carries quotes,
`<`, `&`, literal entities and non-ASCII, and must come out as the same characters: inserted
once as text, never parsed as HTML and never escaped a second time.
"""

from __future__ import annotations

import json
import shlex
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.commands import run_trajforge
from tests.support.policies import tool_messages, user_prompt
from tests.support.scripted_server import Recorded, Reply, ScriptedServer, chat, http_error, tool_call
from tests.view.test_browser import browser, figure, page, shot, viewer_of  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(240)
# Every kind of character that an escaping mistake changes: quotes, tags, ampersands, entities
# written literally (the demo's model wrote `Bang&#39;s.` itself), and text outside ASCII.
TEXT = "Tom's \"quoted\" <b>bold</b> & x<y>z, literal &#39; &amp; &lt;, café 日本語 🚀"
RUN_NAME = "run 'é' <&>"
MODEL = "scripted \"model\" <é&>"
TASK_TYPE = "type 'é' <&>"
COMMAND = "printf '%s\\n' " + shlex.quote(TEXT)
ROWS = [
    {"prompt": f"pass: {TEXT}", "expected": "Paris"},
    {"prompt": f"fail: {TEXT}", "expected": "London"},
    {"prompt": f"timeout: {TEXT}", "check": "sleep 600"},  # never ends: always past --check_timeout
    {"prompt": f"none: {TEXT}", "task_type": TASK_TYPE},
    {"prompt": f"broken: {TEXT}"},
]


def policy(req: Recorded) -> Reply:
    prompt = user_prompt(req.body)
    if prompt.startswith("broken:"):
        return http_error(400, f"refused: {TEXT}")
    if not tool_messages(req.body):
        return chat(None, reasoning=f"First I echo: {TEXT}",
                    tool_calls=[tool_call("terminal", {"command": COMMAND})])
    return chat(f"Paris. {TEXT}", reasoning=f"Done: {TEXT}")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("truthful")
    (root / "ds.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ROWS), encoding="utf-8")
    with ScriptedServer(policy) as srv:
        proc = run_trajforge("run", "--dataset_file=ds.jsonl", "--batch_size=2", f"--run_name={RUN_NAME}",
                             f"--base_url={srv.url}", f"--model={MODEL}", "--distribution=terminal_only",
                             "--sandbox=local", "--max_retries=0", "--check_timeout=1", cwd=root, timeout=180)
    assert proc.returncode == 3, proc.stderr  # the broken row failed: part of the scenario
    return root / "data" / RUN_NAME


def indexed(url: str) -> None:
    """Wait until the viewer has read the whole run and its dataset (it serves while it reads them,
    and the page says so: its figures may still change)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url + "api/status") as r:
            status = json.loads(r.read())
            if status["indexing_bytes_left"] == 0 and not status["reading_dataset"]:
                return
        time.sleep(0.1)
    raise AssertionError("the viewer did not finish reading the run")


def _row(page, state: str):
    return page.locator(f'#samples tbody tr:has([data-verdict="{state}"])')


def test_verification_states_are_shown_as_statistics_json_counts_them(run_dir: Path, viewer_of, page) -> None:
    stats = json.loads((run_dir / "statistics.json").read_text())["run"]["verification"]
    assert (stats["passed"], stats["failed"], stats["errors_by_kind"]["check_timeout"], stats["unverified"]) \
        == (1, 1, 1, 1)
    v = viewer_of(run_dir)
    indexed(v.url)
    page.goto(v.url)
    page.wait_for_selector('[data-fig="verification.passed"]')
    for key in ("passed", "failed", "errors", "unverified"):
        assert figure(page, f"verification.{key}") == str(stats[key]), key
    assert float(figure(page, "verification.pass_rate")) == stats["pass_rate"] == 0.5
    assert "check_timeout 1" in page.locator('[data-fig="verification.errors"]').inner_text()
    page.goto(v.url + "#/samples")
    page.wait_for_selector("#samples tbody tr")
    shot(page, "truthful-list")
    cells = {state: _row(page, state).locator("td:nth-child(9)").inner_text()
             for state in ("passed", "failed", "error", "unverified")}
    assert cells == {"passed": "✓ passed 1.00", "failed": "✗ failed 0.00", "error": "⚠ error (check_timeout)",
                     "unverified": "not verified"}
    assert _row(page, "unverified").locator("td.prompt a").inner_text() == f"none: {TEXT}"
    assert page.locator("#samples tbody tr").count() == 5  # the failed sample has no verification: "–"
    # the conversation's banner: its own colour and words per state, never "failed" for what was not verified
    for state, words, cls in (("passed", "passed · score 1 · expected", "pass"),
                              ("failed", "failed · score 0 · expected", "fail"),
                              ("error", "error (check_timeout) · check", "err"),
                              ("unverified", "not verified", "none")):
        page.goto(v.url + "#/samples")
        page.wait_for_selector("#samples tbody tr")
        _row(page, state).locator("td.prompt a").click()
        banner = page.wait_for_selector("#verification")
        assert banner.get_attribute("data-verdict") == state
        assert banner.inner_text() == f"Verification: {words}", state
        assert cls in (banner.get_attribute("class") or "").split(), state
        meta = page.locator("table.meta tr:has(th:text-is('verification')) td").inner_text()
        assert meta.startswith(words.split(" ·")[0]), (state, meta)
        if state == "unverified":
            shot(page, "truthful-unverified")
            assert "failed" not in page.locator("#main").inner_text()


def test_every_text_is_shown_exactly_as_the_record_holds_it(run_dir: Path, viewer_of, page) -> None:
    v = viewer_of(run_dir)
    page.goto(v.url)
    page.wait_for_selector('[data-fig="samples.finished"]')
    assert page.locator("#main h2").inner_text() == f"Run {RUN_NAME}"
    assert page.locator("#main p.muted").first.inner_text() == f"model {MODEL}"
    assert page.locator('[data-chart="task_types"] .bl').inner_text() == TASK_TYPE
    assert page.locator("#source").inner_text() == str(run_dir)
    page.goto(v.url + "#/samples")
    page.wait_for_selector("#samples tbody tr")
    prompts = page.locator("#samples td.prompt a").all_inner_texts()
    assert sorted(prompts) == sorted(r["prompt"] for r in ROWS)
    assert TASK_TYPE in page.locator('select[data-filter="task_type"]').inner_text()
    broken = page.locator('#samples tbody tr[data-status="failed"] .msg').inner_text()
    assert TEXT in broken, broken  # the endpoint's error message, as the checkpoint holds it
    record = next(json.loads(line) for line in (run_dir / "trajectories.jsonl").read_text().splitlines()
                  if json.loads(line)["conversations"][1]["value"].startswith("pass:"))
    page.locator("#samples td.prompt a", has_text="pass:").click()
    page.wait_for_selector("#turns .turn.gpt")
    shot(page, "truthful-conversation")
    human = page.locator(".turn.human pre").inner_text()
    assert human == f"pass: {TEXT}"
    page.locator("details.reasoning summary").first.click()
    assert page.locator("details.reasoning pre").first.inner_text() == f"First I echo: {TEXT}"
    assert page.locator("details.reasoning summary").first.inner_text() == f"reasoning · First I echo: {TEXT}"
    args = json.loads(page.locator(".call pre.args").inner_text())
    assert args["command"] == COMMAND
    output = page.locator(".result .field:has(.fk:text-is('output')) pre").inner_text()
    assert output == TEXT + "\n"
    assert page.locator(".turn.gpt pre.text").last.inner_text() == f"Paris. {TEXT}"
    detail = page.locator("table.meta tr:has(th:text-is('verification detail')) td").inner_text()
    assert json.loads(detail) == record["verification"]["detail"]
    system = page.locator(".turn.system")
    system.locator("summary").first.click()
    assert "terminal" in system.inner_text()
    # Nothing on the page was escaped twice, unescaped or parsed: the only entities are the record's
    # own (`&#39;` written literally), and its `<b>` is text, never an element.
    text = page.locator("#main").inner_text()
    assert "&amp;amp;" not in text and "&amp;#39;" not in text and "&lt;b&gt;" not in text
    assert "Tom's" in text and "Tom&#39;s" not in text and "literal &#39; &amp; &lt;," in text
    assert page.locator("#main b:text-is('bold')").count() == 0 and "<b>bold</b>" in text


def test_after_a_dataset_edit_and_resume_the_page_agrees_with_statistics_json(tmp_path: Path, viewer_of,
                                                                              page) -> None:
    # 10 rows, 2 of which fail; the user deletes those 2 from the dataset and resumes: the run has
    # 8 samples, all finished. Their failures stay in checkpoint.json, and the page counted and
    # listed them ("2 failed", "10 samples", "prompt unknown: the dataset was not found").
    rows = [f"say w{i}" for i in range(8)]
    rows[3:3], rows[6:6] = ["say bad one"], ["say bad two"]
    (tmp_path / "ds.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in rows))

    def bad_ones_fail(req: Recorded) -> Reply:
        if "bad" in user_prompt(req.body):
            return http_error(400, "refused")
        return chat("done", reasoning="ok") if tool_messages(req.body) else \
            chat(None, reasoning="run it", tool_calls=[tool_call("terminal", {"command": "echo hi"})])

    with ScriptedServer(bad_ones_fail) as srv:
        args = ["run", "--dataset_file=ds.jsonl", "--run_name=r", f"--base_url={srv.url}", "--model=m",
                "--distribution=terminal_only", "--sandbox=local", "--max_retries=0"]
        first = run_trajforge(*args, cwd=tmp_path)
        assert first.returncode == 3, first.stderr
        (tmp_path / "ds.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in rows if "bad" not in p))
        resumed = run_trajforge(*args, "--resume", cwd=tmp_path)
        assert resumed.returncode == 0, resumed.stderr
    run = tmp_path / "data" / "r"
    stats = json.loads((run / "statistics.json").read_text())["run"]
    assert (stats["samples"]["total"], stats["samples"]["finished"], stats["samples"]["failed"]) == (8, 8, 0)
    v = viewer_of(run)
    indexed(v.url)
    with urllib.request.urlopen(v.url + "api/overview") as r:
        overview = json.loads(r.read())
    assert overview["figures"] == stats and overview["outcomes_not_in_dataset"] == 2
    with urllib.request.urlopen(v.url + "api/samples") as r:
        assert json.loads(r.read())["total"] == 8
    page.goto(v.url)
    page.wait_for_selector("#outcomes_not_in_dataset")
    assert figure(page, "samples.failed") == "0" and figure(page, "samples.total") == "8"
    page.goto(v.url + "#/samples")
    page.wait_for_function("() => document.getElementById('page-info')?.textContent.endsWith(' 8 samples')")
    assert "prompt unknown" not in page.locator("#samples").inner_text()
    assert sorted(page.locator("#samples td.prompt a").all_inner_texts()) == sorted(p for p in rows if "bad" not in p)
