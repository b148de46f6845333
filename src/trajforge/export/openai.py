"""`--format openai`: one `{"messages", "tools", "metadata"}` JSON line per trajectory.

The shape TRL's SFT trainer, axolotl's chat templates and OpenAI fine-tuning read. Lossless for
trajforge records (export.convert): `trajforge export OPENAI.jsonl --format sharegpt` gives the
saved records back, byte for byte, unless reasoning was dropped.
"""

from __future__ import annotations

from pathlib import Path

from trajforge.export.base import Exporter, Item, SplitFiles, Summary
from trajforge.export.convert import to_openai
from trajforge.jsonio import dumps


class OpenAIExporter(Exporter):
    name = "openai"
    suffix = ".jsonl"

    def open(self, output: Path) -> None:
        self.root = output
        self.files = SplitFiles(output, self.options.splits, self.suffix)

    def write(self, item: Item) -> None:
        self.files.write(item.split, dumps(to_openai(item.record, self.options.reasoning)) + b"\n")

    def close(self) -> Summary:
        self.files.close()
        return Summary(self.files.counts, self.files.names(self.root), self.drops())

    def abort(self) -> None:
        if hasattr(self, "files"):
            self.files.abort()
