"""The vocabulary every settings section is written in: field types, sizes and bounds.

Each layer declares its own section of the run's configuration beside its code (model/settings.py,
tools/tool_settings.py, sandbox/section.py, tasks/task_settings.py, verify/settings.py)
and trajforge.config collects them into RunConfig; what those sections share is here, so none of
them imports trajforge.config. A leaf: of trajforge it imports nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import PydanticCustomError, core_schema

# A field's `json_schema_extra`: FILE_ONLY, a key of the --config file with no flag; shown(words),
# the default as --help words it when the value itself (often None) says nothing.
FILE_ONLY = {"flag": False}


def shown(words: str) -> dict[str, Any]:
    return {"shown_default": words}


@dataclass(frozen=True, slots=True)
class OneOf:
    """`Annotated[str, OneOf(names)]`: a field whose value is one of `names()`, asked at each
    validation, so a name registered after this module loaded (a plugin's, a test's) is accepted.
    A refusal reads like pydantic's own for a Literal (same type and `expected` context), so
    config/load.py words it the same way. `shown`: the flag's help for the choices, when not just
    their names; `outside`: for a registry's names, its lookup of "module:ATTR" (a thing from outside
    trajforge, trajforge.registry), which raises a ValueError saying why such a value names none."""

    names: Callable[[], Sequence[str]]
    shown: Callable[[], str] | None = None
    outside: Callable[[str], object] | None = None

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_before_validator_function(self.check, handler(source))

    def check(self, value: Any) -> Any:
        allowed = tuple(self.names())
        if self.outside is not None and isinstance(value, str) and ":" in value and value not in allowed:
            self.outside(value)
            return value
        if value not in allowed:
            quoted = [f"'{n}'" for n in allowed]
            expected = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
            raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
        return value


SIZE_PATTERN = r"^[0-9]+(\.[0-9]+)?[bkmgtBKMGT]?$"
# A size beyond what any host has (16 TiB, also ext4's largest file: the sandbox's disk image) failed
# only once a sample started, or crashed making the disk image (an integer beyond 64 bits).
SIZE_MAX, SIZE_MAX_TEXT = 16 << 40, "16t"
_UNITS = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
PID_MAX = 4_194_304  # Linux's ceiling on process ids (PID_MAX_LIMIT): the bound of process limits


def size_bytes(text: str) -> int:
    """'4g' -> 4 GiB in bytes ('4' alone is bytes), the unit letters of docker/podman --memory."""
    unit = text[-1].lower() if text[-1].isalpha() else "b"
    return int(float(text.rstrip("bkmgtBKMGT") or 0) * _UNITS[unit])


def size_text(size: int | None) -> str:
    """A size in bytes as a user writes it, in the largest unit that divides it (4 << 30: '4g'); None: '0'."""
    for unit in "tgmk":
        if size and size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]}{unit}"
    return str(size or 0)


def limit_bytes(text: str | None) -> int | None:
    """A size limit in bytes; None (no limit) for no size or "0" (a limit of 0 would stop everything)."""
    return size_bytes(text) or None if text else None
