"""The configuration reference, made from the settings themselves: docs/configuration.md's "Every setting".

Each layer's section of the run's configuration (trajforge.config: RunConfig collects them) becomes
a table of its settings: the key, its flag (or "file only" for a `--config` key without one), its
default as `trajforge run --help` shows it and its help, `{choices}` expanded the way --help
expands it (cli/run.py). A nested section (`network:`, `tools:`, `task_types:`...) lists its keys
by their dotted path. The compressor's `--config` file (compress/config.py) follows. The docs
build calls `markdown()` (docs/hooks/reference.py), so the page cannot say other than the code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from trajforge.cli.run import _choices, _default_text
from trajforge.config import RunConfig

_PLACEHOLDER = "NAME"  # a key of a mapping section (a task type's, a distribution's, a model's name)


def run_sections() -> list[type[BaseModel]]:
    """RunConfig's sections in the order --help lists their flags (its bases listed last come first)."""
    return [base for base in reversed(RunConfig.__bases__) if issubclass(base, BaseModel)]


def markdown() -> str:
    """The reference: a table per section of the run's settings, then the compressor's file."""
    from trajforge.compress.config import CompressionConfig

    parts = []
    for section in run_sections():
        parts.append(f"### {_title(section)}\n\nDeclared in `{section.__module__}` (`{section.__name__}`).\n")
        parts.append(_table([row for name, field in section.model_fields.items() for row in _rows(name, field)]))
    parts.append("### `trajforge compress` (its `--config` file)\n\nDeclared in `trajforge.compress.config` "
                 "(`CompressionConfig`): the keys of the compressor's YAML file, by section.\n")
    parts.append(_table(list(_nested_rows("", CompressionConfig))))
    return "\n".join(parts)


def _title(section: type[BaseModel]) -> str:
    name = section.__name__.removesuffix("Section")
    return f"{name} settings"


def _rows(name: str, field: FieldInfo) -> list[list[str]]:
    """The setting's row; a nested section's keys, one row each, under the section's own."""
    nested = _model_of(field.annotation)
    if nested is not None:
        own = [f"`{name}`", "file only", "", _cell(_help(field)) or "a section of the file: its keys below"]
        return [own, *([f"`{key}`", "file only", _cell(default), _cell(help_)]
                       for key, default, help_ in _nested_rows(name, nested[1], mapping=nested[0]))]
    extra = field.json_schema_extra
    flag = extra.get("flag", True) if isinstance(extra, dict) else True
    default = _default_text(name, strict_required=False).strip().removeprefix("[default: ").removesuffix("]")
    return [[f"`{name}`", f"`--{name}`" if flag else "file only", _cell(default), _cell(_help(field))]]


def _help(field: FieldInfo) -> str:
    return (field.description or "").replace("{choices}", _choices(field))


def _nested_rows(prefix: str, model: type[BaseModel], *, mapping: bool = False) -> Any:
    """(dotted key, default, help) of every key of a nested section, its own sections' included."""
    base = f"{prefix}.{_PLACEHOLDER}" if mapping else prefix
    for name, field in model.model_fields.items():
        key = f"{base}.{name}" if base else name
        inner = _model_of(field.annotation)
        if inner is not None:
            yield from _nested_rows(key, inner[1], mapping=inner[0])
            continue
        yield f"{key}", _default_of(field), _help(field)


def _model_of(annotation: Any) -> tuple[bool, type[BaseModel]] | None:
    """(is a mapping of them, the model) when `annotation` is a section or a mapping of sections."""
    for t in (annotation, *get_args(annotation)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return False, t
        if get_origin(t) is dict:
            value = get_args(t)[1]
            if isinstance(value, type) and issubclass(value, BaseModel):
                return True, value
    return None


def _default_of(field: FieldInfo) -> str:
    default = field.get_default(call_default_factory=True)
    if default is PydanticUndefined:
        return "required"
    if isinstance(default, bool):
        return "true" if default else "false"
    if default is None:
        return "unset"
    if isinstance(default, (list, dict, tuple, str)) and not default:
        return "empty"
    if isinstance(default, Path):
        return str(default)
    return f"{default}"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _table(rows: list[Any]) -> str:
    if rows and len(rows[0]) == 3:  # a nested file: key, default, help
        head = "| key | default | what it sets |\n|---|---|---|\n"
        return head + "".join(f"| `{k}` | {_cell(d)} | {_cell(h)} |\n" for k, d, h in rows)
    head = "| key | flag | default | what it sets |\n|---|---|---|---|\n"
    return head + "".join(f"| {' | '.join(r)} |\n" for r in rows)

