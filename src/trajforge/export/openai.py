"""`--format openai`: one `{"messages", "tools", "metadata"}` JSON line per trajectory.

The shape TRL's SFT trainer, axolotl's chat templates and OpenAI fine-tuning read. Lossless for
trajforge records (export.convert): `trajforge export OPENAI.jsonl --format sharegpt` gives the
saved records back, byte for byte, unless reasoning was dropped.
"""

from __future__ import annotations


from trajforge.export.exporter import Item, JsonlExporter
from trajforge.export.convert import to_openai
from trajforge.jsonio import dumps


class OpenAIExporter(JsonlExporter):
    def line(self, item: Item) -> bytes:
        return dumps(to_openai(item.record, self.options.reasoning)) + b"\n"
