"""Exports of trajectories in the formats trainers and data tools load directly.

`trajforge export INPUT --format F --output PATH` (export.cli) reads a run directory or a
trajectories file (export.source), keeps what the shared filters select (export.filters) and hands
each record to the exporter of the format. Every format implements export.base.Exporter and is
registered here, in FORMATS, and nowhere else; modules are imported only when their format is
used, so pyarrow and datasets load only for `parquet` and `hf`.
"""

from __future__ import annotations

import importlib

from trajforge.errors import UsageError

# format name -> (module, class, pip extra needed beyond the base install)
FORMATS: dict[str, tuple[str, str, str | None]] = {
    "openai": ("trajforge.export.openai", "OpenAIExporter", None),
    "sharegpt": ("trajforge.export.sharegpt", "ShareGPTExporter", None),
    "parquet": ("trajforge.export.parquet", "ParquetExporter", "export"),
    "hf": ("trajforge.export.hf", "HFExporter", "export"),
    "atif": ("trajforge.export.atif", "ATIFExporter", None),
}


def exporter_class(name: str) -> type:
    module, cls, extra = FORMATS[name]
    if extra is not None:
        for dep in ("pyarrow", "datasets") if name == "hf" else ("pyarrow",):
            try:
                importlib.import_module(dep)
            except ImportError as e:
                raise UsageError(f"--format {name} needs {dep} ({e}); install it with "
                                 f"pip install 'trajforge[{extra}]'") from None
    return getattr(importlib.import_module(module), cls)
