"""One shape for every registry of extensions: sandbox backends, executors, toolsets, export formats,
subcommands and run outputs.

A Registry holds Specs by name. A spec says what a thing is called, where its code is (`target`,
"module:attribute", imported only when used, so an optional extra that is missing breaks only
what needs it), one line of help, what its users may ask of it (`capabilities`, typed per kind)
and its section of the configuration, if any. Every name a user sees in `--help`, `doctor`, a
configuration error or an output quirk is read from a registry and spelled nowhere else
(tests/test_architecture.py checks), so adding a thing is one module plus one `register` line.

A leaf: it imports nothing of trajforge.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

C = TypeVar("C")


@dataclass(frozen=True, slots=True)
class Spec(Generic[C]):
    name: str
    target: str  # "module:attribute"
    help: str = ""  # one line, as --help, doctor and error messages show it
    capabilities: C = None  # type: ignore[assignment]  # what users of this kind may ask of it
    settings: str | None = None  # its section of the configuration (a RunConfig field or `tools:` key)

    def load(self) -> Any:
        """The target, its module imported now."""
        return load(self.target)


class Registry(Generic[C]):
    """Specs of one kind by name, in registration order (the order users see them in)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind  # "sandbox backend", "export format"...: how messages name one
        self._specs: dict[str, Spec[C]] = {}

    def register(self, spec: Spec[C]) -> Spec[C]:
        self._specs[spec.name] = spec
        return spec

    # A mapping's item access, so tests register one for a while with monkeypatch.setitem.
    def __setitem__(self, name: str, spec: Spec[C]) -> None:
        if spec.name != name:
            raise ValueError(f"{self.kind} {spec.name!r} registered as {name!r}")
        self._specs[name] = spec

    def __delitem__(self, name: str) -> None:
        del self._specs[name]

    def __getitem__(self, name: str) -> Spec[C]:
        return self._specs[name]

    def get(self, name: str, default: Spec[C] | None = None) -> Spec[C] | None:
        return self._specs.get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def names(self) -> tuple[str, ...]:
        return tuple(self._specs)

    def specs(self) -> tuple[Spec[C], ...]:
        return tuple(self._specs.values())

    def choice(self, name: str) -> Spec[C]:
        """The spec of `name`; an unknown name is a ValueError that lists the known ones."""
        spec = self._specs.get(name)
        if spec is None:
            raise ValueError(f"unknown {self.kind} {name!r}; use {words(self._specs)}")
        return spec


def load(target: str) -> Any:
    """What "module:attribute" names, its module imported now (a capability may name one too)."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def words(names: Iterable[str], last: str = "or") -> str:
    """'a, b or c' (a single name alone, none: '')."""
    items = list(names)
    if len(items) < 2:
        return "".join(items)
    return f"{', '.join(items[:-1])} {last} {items[-1]}"


def did_you_mean(value: str, names: Iterable[str], shown: Callable[[str], str] = repr) -> str:
    """'; did you mean X?' naming the one of `names` closest to `value` (a typo of it), or '' when
    none is close: the one wording of that hint, for commands, flags, config keys and choices."""
    close = difflib.get_close_matches(value, list(names), n=1)
    return f"; did you mean {shown(close[0])}?" if close else ""
