#!/usr/bin/env python3
"""Reference-compatible entry point: `python trajectory_compressor.py --input=... [--target_max_tokens=N] ...`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

from trajforge.allocator import tune_allocator  # noqa: E402
from trajforge.cli.compress import main  # noqa: E402

if __name__ == "__main__":
    tune_allocator()
    raise SystemExit(main(sys.argv[1:]))
