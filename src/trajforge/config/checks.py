"""Checks of single configuration values that a pydantic Field constraint cannot state.

trajforge.config's validators call these, so a value that could only fail later (or do damage,
like a run name of `..` whose --overwrite empties the current directory) is refused before any
work, with the rest of the configuration's errors. Of trajforge it imports only the sections'
vocabulary (trajforge.fields).
"""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel
from pydantic_core import PydanticCustomError

from trajforge.fields import SIZE_MAX, SIZE_MAX_TEXT, SIZE_PATTERN, size_bytes

NAME_MAX = 255  # bytes of one path component on Linux file systems
SIZE_FIELDS = ("sandbox_memory", "sandbox_tmp_size", "sandbox_shm_size", "sandbox_disk", "container_memory",
               "task_max_memory", "task_max_storage")
CHECKED_FIELDS = ("run_name", "base_url", "judge_base_url", "dataset_file", "prefill_messages_file", *SIZE_FIELDS)

# Upper bounds of the whole numbers of the `tools:` section (trajforge.catalog.tools_config declares the
# lower ones). Each is far above any real use; what they stop is a value so large it crashes the run
# after its directory exists (config.json is JSON, whose writer refuses integers beyond 64 bits).
TOOLS_MAX = {
    "web.max_bytes": 1 << 30, "web.max_chars": 100_000_000,
    "browser.snapshot_max_chars": 100_000_000, "browser.max_contexts": 100_000,
    "browser.viewport_width": 16_384, "browser.viewport_height": 16_384,
    "vision.max_tokens": 10_000_000, "vision.max_image_bytes": 1 << 30,
    "image_gen.max_image_bytes": 1 << 30,
    "moa.reference_max_tokens": 10_000_000, "moa.aggregator_max_tokens": 10_000_000, "moa.min_successes": 1_000,
}
# A whole number of the section that TOOLS_MAX does not know yet still gets one (2**53: the largest
# that every JSON reader keeps exact).
TOOLS_MAX_OTHER = 1 << 53


class OutOfRange(ValueError):
    """A whole number inside a nested section above its bound; config/load.py names the key `path`."""

    def __init__(self, path: list[str], value: int, bound: int) -> None:
        super().__init__(f"{'.'.join(path)}: must be at most {bound}")
        self.path, self.value, self.bound = path, value, bound


def whole_size(value: Any) -> Any:
    """A size given as a whole number (YAML reads `sandbox_memory: 0` as one) as the string of bytes it
    means; anything else as it is (a bool or float is left to the pattern, which refuses it)."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else value


def run_name_problem(name: str) -> str | None:
    """Why `name` cannot be the run's directory under output_dir, or None. The run directory is
    deleted by --overwrite, so it must be exactly one new component: never `.`, `..`, an absolute
    path or a path with `/`, which would make an existing directory (the current one...) the run's."""
    if name in (".", "..") or "/" in name or "\0" in name:
        return "must be a single directory name (no '/' or NUL character, not '.' or '..')"
    if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
        return f"must be at most {NAME_MAX} bytes long (one directory name)"
    return None


def url_problem(url: str) -> str | None:
    """Why `url` cannot be a model endpoint, or None; the transport only speaks HTTP(S)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError on a port that is not a number in range
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname \
            or any(c.isspace() or ord(c) < 32 for c in url):
        return "not a valid URL: needs a scheme (http or https) and a host, e.g. http://127.0.0.1:8000/v1"
    return None


def check_value(field: str, value: Any) -> None:
    """Raise for a value of one of CHECKED_FIELDS that RunConfig must refuse; a value of the wrong
    type is left to pydantic, which names the type expected."""
    if field in ("dataset_file", "prefill_messages_file"):
        # `--dataset_file=` arrives as Path('') == Path('.'), which then failed as ".: is a directory";
        # '.' is indistinguishable from it, and names no file either.
        if value == "" or (isinstance(value, PurePath) and str(value) == "."):
            raise PydanticCustomError("empty_path", "is empty (or '.'): give the path of a file")
    elif field in SIZE_FIELDS:  # the pattern itself is the field's own constraint, checked after this
        value = whole_size(value)
        if isinstance(value, str) and re.fullmatch(SIZE_PATTERN, value) and size_bytes(value) > SIZE_MAX:
            raise ValueError(f"must be at most {SIZE_MAX_TEXT} ({SIZE_MAX_TEXT[:-1]} TiB)")
    elif isinstance(value, str):
        problem = run_name_problem(value) if field == "run_name" else url_problem(value)
        if problem:
            raise ValueError(problem)


def check_whole_numbers(section: BaseModel, path: list[str]) -> None:
    """Raise OutOfRange for the first whole number of `section` (nested sections included) above
    its TOOLS_MAX bound, keyed by its path below the `tools:` section."""
    for name in type(section).model_fields:
        value = getattr(section, name)
        if isinstance(value, BaseModel):
            check_whole_numbers(value, [*path, name])
        elif isinstance(value, int) and not isinstance(value, bool):
            bound = TOOLS_MAX.get(".".join([*path, name]), TOOLS_MAX_OTHER)
            if value > bound:
                raise OutOfRange([*path, name], value, bound)
