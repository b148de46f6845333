"""`trajforge run`: the run flags (the reference's batch_runner.py flags) -> one validated RunConfig -> the runner.

The flags are RunConfig's fields, each with its description as help (run_flags), and their parsing
is shared by the commands that start a run: `trajforge run`,
`python batch_runner.py` (trajforge.cli) and `trajforge scheduler` (cli.cluster). The
command layer chooses the executor (trajforge.executors) and hands it to the runner.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic.fields import FieldInfo

from trajforge import __version__
from trajforge.cli.flags import Flag, Parser
from trajforge.config import RunConfig
from trajforge.config.checks import run_name_problem
from trajforge.fields import OneOf
from trajforge.config.load import build_config
from trajforge.errors import UsageError
from trajforge.registry import words

# The flags that are not RunConfig fields, after the field they follow in --help.
_NOT_FIELDS: dict[str, list[Flag]] = {
    "num_workers": [Flag("parallelism", "int", "same as --num_workers")],
    "prefill_messages_file": [Flag("list_distributions", "bool", "print every distribution and exit"),
                              Flag("config", "path", "YAML config file; command-line flags override it")],
}
DEFAULT_BATCH_SIZE = 100  # `trajforge run` without --batch_size (batch_runner.py requires it)
_ALIASES = {"parallelism": "num_workers"}  # shows that field's default
_DEFAULT_WORDS = {"list_distributions": "off", "config": "none"}


def _kind(field: FieldInfo) -> str:
    """The flag kind (cli.flags.Flag) of a RunConfig field, from its type."""
    types = [t for t in get_args(field.annotation) if t is not type(None)] or [field.annotation]
    base = get_origin(types[0]) or types[0]
    if base is bool:
        return "switch" if field.default is True else "bool"  # a default-on switch takes true/false
    return {int: "int", float: "float", Path: "path", list: "csv"}.get(base, "str")  # type: ignore[call-overload]


def _choices(field: FieldInfo) -> str:
    """What `{choices}` in a field's description stands for: its registry's or its Literal's values."""
    check = next((m for m in field.metadata if isinstance(m, OneOf)), None)
    if check is not None:
        return check.shown() if check.shown is not None else words(check.names())
    literal = next((t for t in (field.annotation, *get_args(field.annotation)) if get_origin(t) is Literal), None)
    return words(get_args(literal)) if literal is not None else ""


def run_flags() -> list[Flag]:
    """Every run flag: RunConfig's fields but its FILE_ONLY keys, help from each field's description
    (read now, so a registered backend or executor is in the choices), and the few that are not fields."""
    flags: list[Flag] = []
    for name, field in RunConfig.model_fields.items():
        if (field.json_schema_extra or {}).get("flag", True):  # type: ignore[union-attr]
            flags.append(Flag(name, _kind(field), (field.description or "").replace("{choices}", _choices(field))))
        flags += _NOT_FIELDS.get(name, [])
    return flags


FLAGS: list[Flag] = run_flags()  # as of import; make_parser and parse_run_args read them anew


def _default_text(name: str, strict_required: bool = True) -> str:
    field = RunConfig.model_fields.get(_ALIASES.get(name, name))
    if name == "batch_size":
        word = "required" if strict_required else str(DEFAULT_BATCH_SIZE)
    elif name == "run_name":
        word = "required" if strict_required else "the dataset file's name without extension"
    elif field is None:
        word = _DEFAULT_WORDS[name]
    elif "shown_default" in (field.json_schema_extra or {}):  # type: ignore[operator]
        word = str(field.json_schema_extra["shown_default"])  # type: ignore[index]
    else:
        default = field.default
        word = "off" if default is False else "none" if default is None else f"{default}"
    return " (required)" if word == "required" else f" [default: {word}]"


class _HelpFormatter(argparse.HelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=40, width=100)


def make_parser(prog: str, strict_required: bool = True) -> Parser:
    parser = Parser(prog, "Run a tool-using agent over a JSONL dataset. Every flag also accepts --flag value and "
                    "--flag-name spellings.", run_flags(), help_suffix=lambda name: _default_text(name, strict_required),
                    version=f"trajforge {__version__}", formatter_class=_HelpFormatter,
                    argument_default=argparse.SUPPRESS)
    return parser


def parse_run_args(argv: list[str], prog: str, *, strict_required: bool,
                   file_keys: dict[str, Any] | None = None) -> tuple[RunConfig | None, dict[str, Any]]:
    """Parse run flags into a RunConfig. Returns (None, flags) for --list_distributions.

    `file_keys`: the --config file's mapping when the caller has read it already (the scheduler,
    which takes its `ray:` section out first); errors still name the file."""
    parser = make_parser(prog, strict_required)
    values = vars(parser.parse(argv))
    config_file = values.pop("config", None)
    list_only = values.pop("list_distributions", False)
    config = build_config(values, config_file, file_keys)
    if list_only:
        return None, {"config": config}
    missing = [f for f in ("dataset_file", "batch_size", "run_name")
               if getattr(config, f) is None and (strict_required or f == "dataset_file")]
    if "dataset_file" in missing and config.tasks is not None:
        missing.remove("dataset_file")
    elif "dataset_file" in missing:
        missing[0] = "dataset_file (or --tasks)"
    if missing:
        names = ", ".join(f"--{f}" for f in missing)
        raise UsageError(f"missing required flag{'s' if len(missing) > 1 else ''} {names} "
                         f"(give {'them' if len(missing) > 1 else 'it'} on the command line or in --config)")
    derived: dict[str, Any] = {}  # validated config is never mutated: a copy carries the derived values
    if config.run_name is None:
        source = config.dataset_file or config.tasks
        assert source is not None
        derived["run_name"] = stem = source.stem if config.dataset_file else source.absolute().name
        if (problem := run_name_problem(stem)) is not None:  # `...jsonl` would make it `..`
            flag = "--dataset_file" if config.dataset_file else "--tasks"
            raise UsageError(f"the run name taken from {flag}, {stem!r}, {problem}; give --run_name")
    if config.batch_size is None:
        derived["batch_size"] = DEFAULT_BATCH_SIZE
    return config.model_copy(update=derived), values


def run_command(argv: list[str], prog: str, strict_required: bool) -> int:
    config, extra = parse_run_args(argv, prog, strict_required=strict_required)
    if config is None:
        from trajforge.cli.distributions import print_distributions

        return print_distributions(extra["config"])
    from trajforge.executors import make_executor
    from trajforge.runner.main import run

    return run(config, make_executor)


def main(argv: list[str]) -> int:
    return run_command(argv, "trajforge run", strict_required=False)
