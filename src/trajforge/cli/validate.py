"""`trajforge validate`: check a dataset file and report its problems without running anything."""

from __future__ import annotations

from trajforge.cli.flags import Flag, Parser
from trajforge.errors import UsageError

FLAGS = [Flag("dataset_file", "path", "JSONL dataset path (required)", required=True),
         Flag("skip_invalid", "bool", "count the invalid lines and exit 0, as `run --skip_invalid` would skip them, "
                                      "instead of listing them (up to 20, file:line: problem) and exiting 1")]


def main(argv: list[str]) -> int:
    ns = Parser("trajforge validate", "Check a dataset file and report problems.", FLAGS).parse(argv)
    if str(ns.dataset_file) in ("", "."):  # `--dataset_file=` arrives as Path('.'), as for `run`
        raise UsageError("--dataset_file: is empty (or '.'): give the path of a file")
    from trajforge.dataset import load_dataset

    ds = load_dataset(ns.dataset_file, skip_invalid=ns.skip_invalid)
    dup = len(ds.samples) - len({s.identity.split(":")[0] for s in ds.samples})
    print(f"{ns.dataset_file}: {len(ds.samples)} valid samples, {dup} duplicate prompts, "
          f"{len(ds.skipped)} invalid lines skipped")
    return 0
