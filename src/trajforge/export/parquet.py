"""`--format parquet`: one row per trajectory with export.schema's fixed schema, in row groups.

Rows are buffered per split and written as a row group every ROWS rows or BYTES of input, so
memory stays bounded however long the run is. A row pyarrow cannot convert (a field of the wrong
type in a hand-edited record) is reported with its input line.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import orjson

from trajforge.export.exporter import Exporter, Item, Summary
from trajforge.export.convert import ConversionError, to_openai

ROWS = 1000
BYTES = 32 << 20


class RowGroups:
    """Buffered rows of one output, flushed as one Arrow table (a row group) to `sink(table)`;
    `table(rows)` makes the table when the rows are not export.schema's."""

    def __init__(self, sink: Any, table: Any = None) -> None:
        self.sink = sink
        self.table = table
        self.rows: list[dict[str, Any]] = []
        self.numbers: list[int] = []
        self.size = 0
        self.count = 0

    def add(self, row: dict[str, Any], number: int, size: int) -> None:
        self.rows.append(row)
        self.numbers.append(number)
        self.size += size
        self.count += 1
        if len(self.rows) >= ROWS or self.size >= BYTES:
            self.flush()

    def flush(self) -> None:
        """Convert the buffered rows to one Arrow table and hand it to the sink. The rows go through
        pyarrow's JSON reader with the schema made explicit: far less CPU than from_pylist on these
        nested rows, with the same result (bench/RESULTS.md)."""
        import pyarrow as pa
        import pyarrow.json as pa_json

        from trajforge.export.schema import SCHEMA

        if not self.rows:
            return
        if self.table is not None:
            self.sink(self.table(self.rows))
            self.rows, self.numbers, self.size = [], [], 0
            return
        data = b"".join(orjson.dumps(row) + b"\n" for row in self.rows)
        try:
            table = pa_json.read_json(io.BytesIO(data), read_options=pa_json.ReadOptions(block_size=len(data) + 1),
                                      parse_options=pa_json.ParseOptions(explicit_schema=SCHEMA,
                                                                         unexpected_field_behavior="error"))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            for row, number in zip(self.rows, self.numbers):  # find the culprit, for the message
                try:
                    pa.RecordBatch.from_pylist([row], schema=SCHEMA)
                except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
                    raise ConversionError(f"a field has the wrong type for the Arrow schema: {e}", number) from None
            raise
        self.sink(table)
        self.rows, self.numbers, self.size = [], [], 0


def close_quietly(writers: dict[str, Any]) -> None:
    """Close an aborted export's writers; the staging directory, their files with it, is removed anyway."""
    for w in writers.values():
        try:
            w.close()
        except Exception:  # a writer that failed may fail again closing: nothing is kept of it
            pass


def add_row(groups: RowGroups, exporter: Exporter, item: Item) -> None:
    from trajforge.export.schema import row_of

    row = row_of(to_openai(item.record, exporter.options.reasoning), item.record, item.split)
    groups.add(row, item.number, len(item.line))


class ParquetExporter(Exporter):
    suffix = ".parquet"

    def open(self, output: Path) -> None:
        import pyarrow.parquet as pq

        from trajforge.export.schema import SCHEMA

        self.root = output
        names = self.options.splits or ("",)
        self.paths = {s: (output / f"{s}{self.suffix}" if s else output) for s in names}
        self.writers = {s: pq.ParquetWriter(p, SCHEMA, compression="zstd") for s, p in self.paths.items()}
        self.groups = {s: RowGroups(w.write_table) for s, w in self.writers.items()}

    def write(self, item: Item) -> None:
        add_row(self.groups[item.split or ""], self, item)

    def close(self) -> Summary:
        for groups in self.groups.values():
            groups.flush()
        for w in self.writers.values():
            w.close()
        files = [str(p.relative_to(self.root)) if p != self.root else p.name for p in self.paths.values()]
        return Summary({s: g.count for s, g in self.groups.items()}, files, self.drops())

    def abort(self) -> None:
        close_quietly(getattr(self, "writers", {}))

    def drops(self) -> list[str]:
        from trajforge.export.schema import DROPS

        return [*DROPS, *super().drops()]
