"""A test-only run output: one file; tests/test_extensions.py registers it with one line."""

from __future__ import annotations

from typing import Any, BinaryIO


class LengthsOutput:
    """lengths.tsv: sample id, then the number of conversation turns, one kept record a line."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream

    def write(self, line: bytes, record: dict[str, Any]) -> None:
        self._stream.write(f"{record['sample_id']}\t{len(record['conversations'])}\n".encode())
