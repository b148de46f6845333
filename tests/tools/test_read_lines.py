"""read_file reads a window of lines in pieces: the same result as reading the whole file, and
the runner never holds a sample's large file (its memory is outside every sample's limit)."""

from __future__ import annotations

import asyncio
import io
import json
import random
import tracemalloc
from pathlib import Path

import pytest

from trajforge.config import RunConfig
from trajforge.sandbox.backends.bwrap.bwrap_sandbox import BwrapSandbox
from trajforge.sandbox.backends.bwrap.bwrap_backend import probe
from trajforge.sandbox.backends.local.local_sandbox import LocalSandbox
from trajforge.tools import files
from trajforge.tools.tool import ToolContext
from trajforge.tools.read_lines import PIECE, TRUNCATED, Window

READ = files.ReadFileTool()


def whole(text: str, offset: int, limit: int, max_chars: int, max_line: int) -> tuple[list[str], int, bool]:
    """What read_file returned when it held the whole file: the specification."""
    lines: list[str] = []
    chars, total, cut = 0, 0, False
    for total, line in enumerate(io.StringIO(text, newline=None), 1):
        if total < offset or total >= offset + limit or cut:
            continue
        if len(line) > max_line:
            line = line[:max_line] + TRUNCATED
        if chars + len(line) > max_chars and lines:
            cut = True
            continue
        lines.append(line)
        chars += len(line)
    return lines, total, cut


def in_pieces(text: str, cuts: list[int], offset: int, limit: int, max_chars: int, max_line: int) -> Window:
    """Feed `text` split at `cuts`, holding a final "\\r" back as read_window does."""
    w = Window(offset, limit, max_chars, max_line)
    held, bounds = "", [0, *sorted(cuts), len(text)]
    for a, b in zip(bounds, bounds[1:]):
        piece = held + text[a:b]
        held = ""
        if piece.endswith("\r") and b < len(text):
            piece, held = piece[:-1], "\r"
        w.feed(piece)
    w.feed(held)
    w.finish()
    return w


def test_a_window_read_in_pieces_equals_the_whole_file_read_at_once() -> None:
    rng = random.Random(7)
    alphabet = ["a", "b", "é", "\n", "\r", "\r\n", "\n\n", "x" * 30]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        cuts = [rng.randint(0, len(text)) for _ in range(rng.randint(0, 6))]
        offset, limit = rng.randint(1, 12), rng.randint(1, 8)
        max_chars, max_line = rng.randint(1, 80), rng.randint(1, 40)
        w = in_pieces(text, cuts, offset, limit, max_chars, max_line)
        assert (w.lines, w.total, w.cut) == whole(text, offset, limit, max_chars, max_line), (text, cuts)


def test_lines_before_and_after_the_window_are_only_counted() -> None:
    text = "".join(f"l{i}\n" for i in range(1, 100_001)) + "tail"
    w = in_pieces(text, [5, 400_000, 400_001], 99_999, 5, 1000, 100)
    assert w.lines == ["l99999\n", "l100000\n", "tail"] and w.total == 100_001 and not w.cut
    long_line = "y" * 1_000_000  # one line, no end: kept to max_line + 1 characters only
    w = in_pieces(long_line + "\nz\n", [10, 500_000], 1, 3, 1000, 50)
    assert w.lines == ["y" * 50 + TRUNCATED, "z\n"] and w.total == 2 and len(w._line) == 0


def read_calls(sandbox_cls: type[LocalSandbox] | type[BwrapSandbox], tmp_path: Path, made: dict[str, bytes],
               calls: list[dict[str, object]]) -> tuple[list[dict[str, object]], int]:
    """The replies to concurrent read_file calls on the files `made`, and the peak memory Python
    allocated meanwhile."""
    async def main() -> tuple[list[dict[str, object]], int]:
        async with sandbox_cls(tmp_path, **({} if sandbox_cls is LocalSandbox else {"network": False})) as sandbox:
            for name, data in made.items():
                (sandbox.workspace / name).write_bytes(data)
            del data
            ctx = ToolContext(sandbox=sandbox, settings=RunConfig().tool_settings())
            tracemalloc.start()
            try:
                replies = await asyncio.gather(*(READ.run(dict(c), ctx) for c in calls))
                return [json.loads(r) for r in replies], tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
    return asyncio.run(main())


BWRAP = asyncio.run(probe())
BACKENDS = [pytest.param(LocalSandbox, id="local"),
            pytest.param(BwrapSandbox, id="bwrap", marks=pytest.mark.skipif(
                not BWRAP.usable, reason=f"bwrap not usable here: {BWRAP.detail}"))]


@pytest.mark.parametrize("sandbox_cls", BACKENDS)
def test_a_hostile_models_large_files_never_enter_the_runner_whole(tmp_path: Path, sandbox_cls: type) -> None:
    # The hostile model: files of 64 MB (many short lines; one line without an end) read by
    # eight calls at once. Before, each call held its whole file in the runner (512 MB here).
    line = b"0123456789abcdef" * 4 + b"\n"
    lines = (64 << 20) // len(line)
    made = {"lines.txt": line * lines, "one.txt": b"z" * (64 << 20)}
    calls = [{"path": "lines.txt", "offset": o, "limit": 3} for o in (1, lines // 2, lines - 1)]
    calls += [{"path": "one.txt"}] * 5
    replies, peak = read_calls(sandbox_cls, tmp_path, made, calls)
    del made
    first, middle, last = replies[:3]
    assert first["content"] == middle["content"] == line.decode() * 3 and first["total_lines"] == lines
    assert middle["start_line"] == lines // 2 and middle["next_offset"] == lines // 2 + 3
    assert last["content"] == line.decode() * 2 and "next_offset" not in last
    for r in replies[3:]:
        assert r["total_lines"] == 1 and r["content"] == "z" * files.MAX_LINE_CHARS + TRUNCATED
    # each call holds about one piece, its text and a slice of it at a time
    assert peak < 8 * 4 * PIECE, f"the runner held {peak >> 20} MB for 8 reads of 64 MB files"


def test_a_sample_streams_at_most_its_read_budget_through_the_runner(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Counting total_lines streams the whole file through the runner (~0.8 s of its CPU for 256 MB):
    # one line of a large file, read over and over, is bounded per sample.
    monkeypatch.setattr(files, "READ_BUDGET", 5 << 20)
    made = {"big.txt": b"line\n" * ((2 << 20) // 5)}  # 2 MiB
    replies, _ = read_calls(LocalSandbox, tmp_path, made, [{"path": "big.txt", "limit": 1}])
    assert replies[0]["content"] == "line\n"

    async def main() -> list[dict[str, object]]:
        async with LocalSandbox(tmp_path) as sandbox:
            (sandbox.workspace / "big.txt").write_bytes(made["big.txt"])
            ctx = ToolContext(sandbox=sandbox, settings=RunConfig().tool_settings())
            return [json.loads(await READ.run({"path": "big.txt", "limit": 1}, ctx)) for _ in range(4)]

    out = asyncio.run(main())
    assert [("error" in r) for r in out] == [False, False, False, True]  # 2 + 2 + 2 MiB, then refused
    assert "read further with the terminal" in out[3]["error"]
