"""`--format sharegpt`: the saved trajectory lines, filtered and split, copied unchanged.

With `--no_reasoning` the `<think>` blocks are removed (through the OpenAI form and back, so the
rest of each line stays as saved); otherwise every kept line is the input's bytes.
"""

from __future__ import annotations


from trajforge.export.exporter import Item, JsonlExporter
from trajforge.export.convert import to_openai, to_record
from trajforge.jsonio import dumps


class ShareGPTExporter(JsonlExporter):
    def line(self, item: Item) -> bytes:
        if self.options.reasoning == "drop":
            return dumps(to_record(to_openai(item.record, "drop"))) + b"\n"
        return item.line
