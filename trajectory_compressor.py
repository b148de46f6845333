#!/usr/bin/env python3
"""Reference-compatible entry point: `python trajectory_compressor.py --input=... [--target_max_tokens=N] ...`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

from trajforge.compress.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
