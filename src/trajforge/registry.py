"""One shape for every registry of extensions: sandbox backends, executors, toolsets, export formats,
subcommands and run outputs.

A Registry holds Specs by name. A spec says what a thing is called, where its code is (`target`,
"module:attribute", imported only when used, so an optional extra that is missing breaks only
what needs it), one line of help, what its users may ask of it (`capabilities`, typed per kind),
its section of the configuration, if any, and the Python modules it needs beyond the base install
with the pip extra that brings them (`needs`, `extra`: Spec.missing is the one check of those).
Every name a user sees in `--help`, `doctor`, a configuration error or an output quirk is read
from a registry and spelled nowhere else (tests/test_architecture.py checks), so adding a thing is
one module plus one `register` line.

A thing from outside trajforge needs no line at all: wherever a registered name is asked for,
"package.module:ATTR" names a Spec of that kind in an importable module (its name is then that
text), which the registry loads and keeps on first use (Registry.get).

A leaf: it imports nothing of trajforge.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
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
    needs: tuple[str, ...] = ()  # Python modules it imports beyond the base install
    extra: str | None = None  # the pip extra that installs them

    def missing(self) -> str | None:
        """What of `needs` is not installed here, worded with how to install it; None: all is."""
        absent = [m for m in self.needs if not _installed(m)]
        if not absent:
            return None
        how = f"pip install 'trajforge[{self.extra}]'" if self.extra else f"pip install {' '.join(absent)}"
        return f"{words(absent, 'and')} {'is' if len(absent) == 1 else 'are'} not installed; install it with: {how}"

    def load(self) -> Any:
        """The target, its module imported now; NotInstalled when a module it needs is missing."""
        if (why := self.missing()) is not None:
            raise NotInstalled(why)
        try:
            return load(self.target)
        except ModuleNotFoundError as e:  # a need the spec does not declare
            raise NotInstalled(f"{e.name} is not installed") from e


class NotInstalled(ImportError):
    """A registered thing cannot load here: a module it needs is missing (the message says which
    and how to install it)."""


class OutsideSpecError(ValueError):
    """"module:ATTR" names no loadable Spec of a registry's kind; the message says why."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken one
        return False


class Registry(Generic[C]):
    """Specs of one kind by name, in registration order (the order users see them in)."""

    def __init__(self, kind: str, capabilities: type | None = None) -> None:
        self.kind = kind  # "sandbox backend", "export format"...: how messages name one
        self.capabilities = capabilities  # the type of its specs' capabilities, when they have one
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
        spec = self.get(name)
        if spec is None:
            raise KeyError(name)
        return spec

    def get(self, name: str, default: Spec[C] | None = None) -> Spec[C] | None:
        """The spec of `name`, or `default`. A name of the form "module:ATTR" that is not
        registered is loaded from outside (see the module's docstring) and kept under that name."""
        spec = self._specs.get(name)
        if spec is None and ":" in name:
            try:
                spec = self.outside(name)
            except OutsideSpecError:
                return default
        return default if spec is None else spec

    def outside(self, target: str) -> Spec[C]:
        """The Spec that "module:ATTR" names, registered under that text; OutsideSpecError says why not."""
        if target in self._specs:
            return self._specs[target]
        module, _, attribute = target.partition(":")
        if not module or not attribute:
            raise OutsideSpecError(f"{target!r} is not a {self.kind} and not of the form module:ATTR")
        try:
            found = load(target)
        except Exception as e:  # noqa: BLE001 -- the module is not ours: any failure to import it is the reason
            raise OutsideSpecError(f"cannot load {self.kind} {target!r}: {type(e).__name__}: {e}") from None
        caps = getattr(found, "capabilities", None)
        if not isinstance(found, Spec) or (self.capabilities is not None and not isinstance(caps, self.capabilities)):
            want = f"a Spec with {self.capabilities.__name__}" if self.capabilities is not None else "a Spec"
            what = f"a Spec with {type(caps).__name__}" if isinstance(found, Spec) else type(found).__name__
            raise OutsideSpecError(f"{target!r} is not a {self.kind}: {want} is needed, found {what}")
        spec: Spec[C] = dataclasses.replace(found, name=target)
        self._specs[target] = spec
        return spec

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def names(self) -> tuple[str, ...]:
        return tuple(self._specs)

    def specs(self) -> tuple[Spec[C], ...]:
        return tuple(self._specs.values())


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
