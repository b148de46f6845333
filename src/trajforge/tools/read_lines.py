"""read_file's line window, read in pieces so the runner never holds the file.

A sample's file can be hundreds of megabytes and many samples read at once, while the runner's
memory is outside every sample's limit. So read_file asks the sandbox for PIECE bytes at a time
(Sandbox.read_file with an offset) and keeps only what it returns: the lines offset..offset+limit-1,
each cut at max_line characters, at most max_chars in all. Every line is still counted, for
total_lines. Lines end as in universal-newline text mode ("\\n", "\\r\\n" or "\\r", shown as "\\n").

`Window` is the pure part (fed decoded text, no I/O); `read_window` drives it.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trajforge.sandbox.interface import Sandbox

PIECE = 1 << 20  # a multiple of 64 KiB: the container's exec path seeks with dd then
TRUNCATED = " [... line truncated ...]\n"
_EOL = re.compile(r"\r\n|\r|\n")


class Binary(Exception):
    """The file has a NUL in its first 8 KB."""


class TooLarge(Exception):
    """The file goes on past the most read_file reads."""


@dataclass
class Window:
    offset: int  # first line wanted, 1-based
    limit: int
    max_chars: int
    max_line: int
    lines: list[str] = field(default_factory=list)
    total: int = 0  # lines ended so far
    chars: int = 0
    cut: bool = False  # a wanted line did not fit in max_chars
    size: int = 0  # bytes read (read_window): the file's size once it has read it all
    _line: str = ""  # the line being read, at most max_line + 1 characters of it
    _open: bool = False  # text has been seen since the last line end

    def _done(self) -> bool:
        return self.cut or self.total >= self.offset + self.limit - 1

    def feed(self, text: str) -> None:
        """Decoded text; a final "\\r" must be held back until the next piece shows whether a
        "\\n" follows it (read_window does)."""
        ends = text.count("\n") + text.count("\r") - text.count("\r\n")
        if self._done() or self.total + ends < self.offset:  # no wanted line ends in it: count
            if ends:
                self.total += ends
                self._line, self._open = "", False
                text = text[max(text.rfind("\n"), text.rfind("\r")) + 1:]
            self._add(text)
            return
        start = 0
        for m in _EOL.finditer(text):
            self._add(text[start:m.start()])
            self._end("\n")
            start = m.end()
            if self._done():
                return self.feed(text[start:])
        self._add(text[start:])

    def finish(self) -> None:
        if self._open:  # a last line without an end
            self._end("")

    def _add(self, piece: str) -> None:
        if piece:
            self._open = True
            if len(self._line) <= self.max_line:
                self._line += piece[:self.max_line + 1 - len(self._line)]

    def _end(self, newline: str) -> None:
        self.total += 1
        line, self._line, self._open = self._line + newline, "", False
        if self.total < self.offset or self.total >= self.offset + self.limit or self.cut:
            return
        if len(line) > self.max_line:
            line = line[:self.max_line] + TRUNCATED
        if self.chars + len(line) > self.max_chars and self.lines:
            self.cut = True
            return
        self.lines.append(line)
        self.chars += len(line)


async def read_window(sandbox: Sandbox, path: str, window: Window, *, max_bytes: int) -> Window:
    """Feed `window` the whole file at `path`, PIECE bytes at a time. Binary for a NUL in the
    first 8 KB; TooLarge past `max_bytes` (checked as it reads, the file may be growing)."""
    decode = codecs.getincrementaldecoder("utf-8")("replace").decode
    held, offset = "", 0
    while True:
        data = await sandbox.read_file(path, max_bytes=PIECE, offset=offset)
        if offset == 0 and b"\0" in data[:8192]:
            raise Binary(len(data))
        offset += len(data)
        window.size = offset
        if offset > max_bytes:
            raise TooLarge(offset)
        last = len(data) < PIECE  # a short piece is the end
        text = held + decode(data, final=last)
        held = ""
        if text.endswith("\r") and not last:
            text, held = text[:-1], "\r"
        window.feed(text)
        if last:
            window.finish()
            return window
