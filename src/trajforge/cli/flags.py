"""Every command's flags, declared one way (a list of Flag) and parsed one way (Parser.parse).

So all commands behave alike:
- a flag accepts `--a_b=v`, `--a_b v` and `--a-b v`;
- a bad flag or value is one line, `error: --flag: invalid value V: what is allowed`, exit code 2
  (Parser.error raises UsageError, which the dispatcher's guard in trajforge.cli prints), never a
  usage dump;
- an unknown flag names the closest known one; a missing required flag is named;
- config files are YAML mappings read by trajforge.config.load (load_yaml_mapping, build_config).

No subcommand imports the dispatcher's names (trajforge.cli itself): they import this module,
which of trajforge imports only the error tree and the registry's wording helpers.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from trajforge.errors import UsageError
from trajforge.registry import did_you_mean

_SWITCH = {"true": True, "on": True, "yes": True, "1": True, "false": False, "off": False, "no": False, "0": False}


@dataclass(frozen=True, slots=True)
class Flag:
    """One flag of a command (a `(name, kind, help)` tuple is a Flag with nothing more to say).

    kind: "str" | "int" | "float" | "path" | "csv" (text, split by its user) | "port" (0-65535) |
    "bool" (a plain switch) | "switch" (`--x` alone is true; `--x false` turns a default-on
    setting off). `default`: its value when not given, which --help shows (unless the help says
    it in words); `choices`: the values allowed, refused with the others named; `positional`: an
    argument without `--` (shown as `metavar`), given once."""

    name: str
    kind: str
    help: str = ""
    default: Any = None
    choices: tuple[str, ...] = ()
    required: bool = False
    positional: bool = False
    metavar: str | None = None


def _switch(text: str) -> bool:
    try:
        return _SWITCH[text.strip().lower()]
    except KeyError:
        raise ValueError(text) from None


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise ValueError(text)
    return int(text)


_PARSERS: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "path": Path, "str": str, "csv": str,
                                             "switch": _switch, "port": _port}
_ALLOWED = {"int": "a whole number", "float": "a number", "switch": "true or false", "port": "a port number 0-65535"}


def _typed(kind: str, flag: str) -> Callable[[str], Any]:
    """An argparse `type` whose error names what is allowed."""
    convert, allowed = _PARSERS[kind], _ALLOWED.get(kind, "a value")

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


class Parser(argparse.ArgumentParser):
    """argparse with the project's flags and error shape: one line naming the flag, exit code 2.

    `help_suffix(name)` is added to each flag's help (the run flags' defaults); `version`, when
    given, is what `--version` prints; other keywords go to argparse (usage, epilog,
    formatter_class, argument_default)."""

    def __init__(self, prog: str, description: str, flags: Sequence[Flag | tuple[str, str, str]], *,
                 help_suffix: Callable[[str], str] = lambda name: "", version: str | None = None,
                 **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(prog=prog, description=description, **kwargs)
        self.flags = [f if isinstance(f, Flag) else Flag(*f) for f in flags]
        for flag in self.flags:
            self._add(flag, flag.help + _shown_default(flag) + help_suffix(flag.name))
        if version is not None:
            self.add_argument("--version", action="version", version=version)

    def _add(self, flag: Flag, help_text: str) -> None:
        extra: dict[str, Any] = {} if flag.default is None else {"default": flag.default}
        if flag.positional:
            self.add_argument(flag.name, type=_typed(flag.kind, flag.name), metavar=flag.metavar, help=help_text)
        elif flag.kind == "bool":
            self.add_argument(*spellings(flag.name), dest=flag.name, action="store_true", help=help_text, **extra)
        elif flag.kind == "switch":
            self.add_argument(*spellings(flag.name), dest=flag.name, type=_typed(flag.kind, flag.name), nargs="?",
                              const=True, metavar="BOOL", help=help_text, **extra)
        else:
            self.add_argument(*spellings(flag.name), dest=flag.name, type=_typed(flag.kind, flag.name),
                              metavar=flag.metavar or flag.kind.upper(), help=help_text, **extra)

    def error(self, message: str) -> NoReturn:
        # "argument --batch_size/--batch-size: invalid value ..." -> "--batch_size: invalid value ..."
        message = re.sub(r"^argument (--[\w-]+)(?:/--[\w-]+)*: ", r"\1: ", message)
        raise UsageError(message)

    def parse(self, argv: Sequence[str]) -> argparse.Namespace:
        """Parse `argv`; an unknown flag is an error that suggests the closest known one."""
        ns, unknown = self.parse_known_args(list(argv))
        _reject_unknown(unknown, [f.name for f in self.flags if not f.positional])
        return self._checked(ns)

    def parse_known(self, argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
        """Parse `argv` and return what is not this parser's (the scheduler passes it on as run flags)."""
        ns, unknown = self.parse_known_args(list(argv))
        return self._checked(ns), unknown

    def _checked(self, ns: argparse.Namespace) -> argparse.Namespace:
        for flag in self.flags:
            value = getattr(ns, flag.name, None)
            if flag.required and value is None:
                raise UsageError(f"missing required flag --{flag.name}")
            if flag.choices and value is not None and value not in flag.choices:
                raise UsageError(f"--{flag.name}: invalid value {value!r}: must be one of {', '.join(flag.choices)}")
        return ns


def _shown_default(flag: Flag) -> str:
    if flag.default is None or flag.kind == "bool" or "[default" in flag.help:
        return ""
    return f" [default: {flag.default:g}]" if isinstance(flag.default, float) else f" [default: {flag.default}]"


def _reject_unknown(unknown: list[str], names: list[str]) -> None:
    """One clear error for the first argument argparse did not know, suggesting the closest flag."""
    for arg in unknown:
        if arg.startswith("--"):
            name = arg[2:].split("=", 1)[0]
            hint = did_you_mean(name.replace("-", "_"), names, lambda n: f"--{n}") or "; see --help"
            raise UsageError(f"unknown flag --{name}{hint}")
        raise UsageError(f"unexpected argument {arg!r}; flags look like --name=value (see --help)")
