"""`--format sharegpt`: the saved trajectory lines, filtered and split, copied unchanged.

With `--no_reasoning` the `<think>` blocks are removed (through the OpenAI form and back, so the
rest of each line stays as saved); otherwise every kept line is the input's bytes.
"""

from __future__ import annotations

from pathlib import Path

from trajforge.export.base import Exporter, Item, SplitFiles, Summary
from trajforge.export.convert import to_openai, to_record
from trajforge.jsonio import dumps


class ShareGPTExporter(Exporter):
    name = "sharegpt"
    suffix = ".jsonl"

    def open(self, output: Path) -> None:
        self.root = output
        self.files = SplitFiles(output, self.options.splits, self.suffix)

    def write(self, item: Item) -> None:
        line = item.line
        if self.options.reasoning == "drop":
            line = dumps(to_record(to_openai(item.record, "drop"))) + b"\n"
        self.files.write(item.split, line)

    def close(self) -> Summary:
        self.files.close()
        return Summary(self.files.counts, self.files.names(self.root), self.drops())

    def abort(self) -> None:
        if hasattr(self, "files"):
            self.files.abort()
