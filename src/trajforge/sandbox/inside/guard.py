"""Hermetic helpers: an interpreter in a sample's view loads no code after its start.

The helper (helper.py) runs in the sample's own view of the filesystem, and Python imports
lazily: `re` loads `unicodedata` at the first `\\N{...}` in a pattern, a codec name loads an
`encodings` module. A path the sample can write on the interpreter's `sys.path` (a workspace
mounted over the runtime, say) would then run the sample's code in the helper. So the helper
imports everything it can ever need while its view is still clean (`preload`), and `seal`
closes the import system before it reads the sample's first request: a finder ahead of all
others refuses every module not loaded yet, `sys.path` and the path hooks are emptied and the
path importer cache forgotten. A refused import is an ImportError in that one request (the
model sees an error), never code run. The helper is unprivileged by then anyway (sandbox
package docstring); this keeps a sample from running code even with its own rights in the one
process that serves it. Stdlib only: part of the helper's assembled source (helper.source).
"""

from __future__ import annotations

import sys

# What the helper's code paths import lazily (fsops, the commands, the limits), and what the
# standard library imports lazily under them.
PRELOAD = ("re", "fnmatch", "unicodedata", "resource", "posixpath", "errno", "stat", "select", "struct",
           "marshal", "time", "encodings.utf_8", "encodings.latin_1", "encodings.ascii")


class Sealed:
    """The first finder on sys.meta_path once sealed: nothing more is ever loaded."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> None:
        raise ImportError(f"the sandbox helper loads no module after its start ({name!r} refused)", name=name)


def preload() -> None:
    """Import and exercise what loads lazily, while nothing of a sample is in the view."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    import fnmatch
    import re

    re.compile("\\N{EM DASH}[\\w\\s]+(?i:x)")  # sre_parse's unicodedata, case folding
    fnmatch.translate("*.[!a]?")
    "\u2014".encode("utf-8").decode("latin-1")


def seal() -> None:
    """From now on every import of a module not already loaded raises ImportError."""
    if not any(f is Sealed for f in sys.meta_path):
        sys.meta_path.insert(0, Sealed)
    sys.path[:] = []
    sys.path_hooks[:] = []
    sys.path_importer_cache.clear()


def sealed() -> bool:
    return bool(sys.meta_path) and sys.meta_path[0] is Sealed
