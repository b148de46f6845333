"""The command layer's shared pieces: flags, their errors, and the subcommand registry's format.

Every subcommand builds its parser here, so all of them behave the same way:
- a flag accepts `--a_b=v`, `--a_b v` and `--a-b v` (`add_flags`);
- a bad flag or value is one line, `error: --flag: invalid value V: what is allowed`, exit code 2
  (Parser.error raises UsageError, which trajforge.cli's guard prints), never a usage dump;
- an unknown flag names the closest known one (`parse_flags`);
- config files are YAML mappings read by trajforge.config.load (load_yaml_mapping, build_config).

No subcommand imports trajforge.cli (the dispatcher): they import this module, which imports only
the error tree (trajforge.errors).
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from trajforge.errors import UsageError

# (flag name, kind, help). kind: "str" | "int" | "float" | "bool" | "switch" | "path" | "csv".
Flag = tuple[str, str, str]
_SWITCH = {"true": True, "on": True, "yes": True, "1": True, "false": False, "off": False, "no": False, "0": False}


def _switch(text: str) -> bool:
    try:
        return _SWITCH[text.strip().lower()]
    except KeyError:
        raise ValueError(text) from None


_PARSERS: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "path": Path, "str": str, "csv": str,
                                             "switch": _switch}


class Parser(argparse.ArgumentParser):
    """argparse with the project's error shape: one line naming the flag, exit code 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        # "argument --batch_size/--batch-size: invalid value ..." -> "--batch_size: invalid value ..."
        message = re.sub(r"^argument (--[\w-]+)(?:/--[\w-]+)*: ", r"\1: ", message)
        raise UsageError(message)


def typed(kind: str, flag: str) -> Callable[[str], Any]:
    """An argparse `type` for int/float/path/str values whose error names what is allowed."""
    convert = _PARSERS[kind]
    allowed = {"int": "a whole number", "float": "a number", "switch": "true or false"}.get(kind, "a value")

    def parse(text: str) -> Any:
        try:
            return convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be {allowed}") from None

    parse.__name__ = flag
    return parse


def spellings(name: str) -> list[str]:
    """`--a_b` and `--a-b` (argparse itself accepts `--a_b=v`)."""
    return [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])


def add_flags(parser: argparse.ArgumentParser, flags: Sequence[Flag],
              help_suffix: Callable[[str], str] = lambda name: "") -> None:
    """Add each flag in its three spellings; `bool` is a plain switch, `switch` takes an optional true/false."""
    for name, kind, help_text in flags:
        opts, help_text = spellings(name), help_text + help_suffix(name)
        if kind == "bool":
            parser.add_argument(*opts, dest=name, action="store_true", help=help_text)
        elif kind == "switch":  # `--flag` alone means true; `--flag false` turns a default-on setting off
            parser.add_argument(*opts, dest=name, type=typed(kind, name), nargs="?", const=True, metavar="BOOL",
                                help=help_text)
        else:
            parser.add_argument(*opts, dest=name, type=typed(kind, name), metavar=kind.upper(), help=help_text)


def reject_unknown(unknown: list[str], names: list[str]) -> None:
    """One clear error for the first argument argparse did not know, suggesting the closest flag."""
    for arg in unknown:
        if arg.startswith("--"):
            name = arg[2:].split("=", 1)[0]
            close = difflib.get_close_matches(name.replace("-", "_"), names, n=1)
            raise UsageError(f"unknown flag --{name}" + (f"; did you mean --{close[0]}?" if close else "; see --help"))
        raise UsageError(f"unexpected argument {arg!r}; flags look like --name=value (see --help)")


def parse_flags(parser: argparse.ArgumentParser, argv: Sequence[str], flags: Sequence[Flag]) -> argparse.Namespace:
    """Parse `argv`; an unknown flag is an error that suggests the closest of `flags`."""
    ns, unknown = parser.parse_known_args(list(argv))
    reject_unknown(unknown, [name for name, _, _ in flags])
    return ns
