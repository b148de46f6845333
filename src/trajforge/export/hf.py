"""`--format hf`: a Hugging Face `datasets` directory (save_to_disk) with a dataset card README.md.

Rows (export.schema) stream into one Arrow IPC file per split in a scratch directory inside the
staging directory, in bounded row groups; `datasets` then memory-maps those files and saves them, so the
export never holds the run in memory. Without --split the directory holds one Dataset, with
--split a DatasetDict. The card (export.card) carries the run's figures and the export's own.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from trajforge.export import card
from trajforge.export.exporter import Exporter, Item, Summary
from trajforge.export.filters import passed
from trajforge.export.parquet import RowGroups, add_row
from trajforge.runner.reader import Totals


class HFExporter(Exporter):
    suffix = ""

    def open(self, output: Path) -> None:
        import pyarrow as pa

        from trajforge.export.schema import SCHEMA

        self.root = output
        # Inside the staging directory (removed with it on failure), one level down: datasets
        # refuses to save a dataset into the directory its own files are in.
        self.scratch = output / ".arrow"
        self.scratch.mkdir()
        names = self.options.splits or ("train",)
        self.paths = {s: self.scratch / f"{s}.arrow" for s in names}
        self.writers = {s: pa.ipc.new_stream(str(p), SCHEMA) for s, p in self.paths.items()}
        self.groups = {s: RowGroups(w.write_table) for s, w in self.writers.items()}
        self.totals = Totals()
        self.verified = [0, 0]

    def write(self, item: Item) -> None:
        add_row(self.groups[item.split or "train"], self, item)
        self.totals.add_record(item.record)
        verdict = passed(item.record)
        if verdict is not None:
            self.verified[0] += 1
            self.verified[1] += verdict

    def close(self) -> Summary:
        import datasets

        from trajforge.export.schema import SCHEMA, doc_table

        for groups in self.groups.values():
            groups.flush()
        for w in self.writers.values():
            w.close()
        datasets.disable_progress_bars()  # the export prints its own one-line summary
        features = datasets.Features.from_arrow_schema(SCHEMA)
        parts = {s: datasets.Dataset.from_file(str(p), info=datasets.DatasetInfo(features=features))
                 for s, p in self.paths.items()}
        # An empty split must still get one (empty) shard, or load_from_disk cannot read it back.
        shards = {s: 1 for s, d in parts.items() if d.num_rows == 0}
        if self.options.splits:
            datasets.DatasetDict(parts).save_to_disk(str(self.root), num_shards=shards or None)
        else:
            parts["train"].save_to_disk(str(self.root), num_shards=shards.get("train"))
        del parts  # release the memory maps before the scratch files go
        counts = {s: g.count for s, g in self.groups.items()} if self.options.splits else \
            {"": self.groups["train"].count}
        src = self.options.source
        text = card.render(
            name=src.run_dir.name if src and src.run_dir else (src.path.stem if src else self.root.name),
            command=self.options.command, counts=counts,
            exported=self.totals.as_dict(total=sum(counts.values())),
            verified=(self.verified[0], self.verified[1]), drops=self.drops(), schema_doc=doc_table(),
            config=src.config if src else None, statistics=src.statistics if src else None)
        (self.root / "README.md").write_text(text)
        shutil.rmtree(self.scratch, ignore_errors=True)
        files = sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file())
        return Summary(counts, files, self.drops())

    def abort(self) -> None:
        for w in getattr(self, "writers", {}).values():
            try:
                w.close()
            except Exception:  # scratch is removed below anyway
                pass  # the staging directory, scratch files included, is removed by the caller

    def drops(self) -> list[str]:
        from trajforge.export.schema import DROPS

        return [*DROPS, *super().drops()]
