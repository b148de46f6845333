"""Exports of trajectories in the formats trainers and data tools load directly.

`trajforge export INPUT --format F --output PATH` (trajforge.cli.export) reads a run directory or a
trajectories file (export.source), keeps what the shared filters select (export.filters) and hands
each record to the exporter of the format. Every format implements export.exporter.Exporter and is
registered here, in FORMATS, and nowhere else: its spec's target is the exporter class, and its
capabilities say what `--format`'s summary asks of it (whether its output is a directory), its
`needs` and `extra` the modules beyond the base install. Modules are imported only when their
format is used, so pyarrow and datasets load only for `parquet` and `hf`.
"""

from __future__ import annotations

from dataclasses import dataclass

from trajforge.errors import UsageError
from trajforge.registry import NotInstalled, Registry, Spec


@dataclass(frozen=True, slots=True)
class FormatCaps:
    directory: bool = False  # its output is a directory even without --split (its files are listed)
    jsonl: bool = False  # --jsonl writes JSON lines instead of its own binary files
    reasoning: bool = True  # --reasoning / --no_reasoning apply (its output holds the conversation's text)


FORMATS: Registry[FormatCaps] = Registry("export format", FormatCaps)
for _spec in (
    Spec("openai", "trajforge.export.openai:OpenAIExporter", "OpenAI messages JSONL", FormatCaps()),
    Spec("sharegpt", "trajforge.export.sharegpt:ShareGPTExporter", "ShareGPT JSONL", FormatCaps()),
    Spec("parquet", "trajforge.export.parquet:ParquetExporter", "Parquet", FormatCaps(), needs=("pyarrow",),
         extra="export"),
    Spec("hf", "trajforge.export.hf:HFExporter", "a Hugging Face dataset with its card", FormatCaps(directory=True),
         needs=("pyarrow", "datasets"), extra="export"),
    Spec("atif", "trajforge.export.atif:ATIFExporter", "ATIF trajectories JSONL", FormatCaps()),
    Spec("tokens", "trajforge.export.tokens:TokensExporter", "token ids and loss masks for training (Parquet, "
         "or JSONL)", FormatCaps(jsonl=True, reasoning=False), needs=("pyarrow",), extra="export"),
):
    FORMATS.register(_spec)


def exporter_class(name: str) -> type:
    try:
        return FORMATS[name].load()  # type: ignore[no-any-return]
    except NotInstalled as e:
        raise UsageError(f"--format {name}: {e}") from None
