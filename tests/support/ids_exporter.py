"""A test-only export format: one module; tests/test_architecture.py and tests/test_extensions.py
register it with one line.

One line per exported trajectory: its sample id.
"""

from __future__ import annotations

from trajforge.export.exporter import Item, JsonlExporter


class IdsExporter(JsonlExporter):
    suffix = ".txt"

    def line(self, item: Item) -> bytes:
        return f"{item.record.get('sample_id', '')}\n".encode()
