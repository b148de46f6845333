#!/usr/bin/env python3
"""Reference-compatible entry point: `python batch_runner.py --dataset_file=... --batch_size=... --run_name=...`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

from trajforge.cli import batch_runner_entry  # noqa: E402

if __name__ == "__main__":
    batch_runner_entry()
