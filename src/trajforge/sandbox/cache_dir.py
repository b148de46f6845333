"""The trajforge cache directory of this user: $XDG_CACHE_HOME/trajforge (~/.cache/trajforge).

What a runner keeps between runs on one host: a generated containers.conf, the seccomp profile,
task images' build locks and (Ray nodes) build logs.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "trajforge"
