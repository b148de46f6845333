"""The tamper report: what an agent changed, outside its outputs, of what a task's tests depend on (pure).

After the agent stops, the sandbox's own list of changes against its image (ImageSandbox.changes:
the container's overlay read from the host, or the engine's filesystem diff) is read through RULES, in order: the first rule whose
pattern matches a path decides whether that change counts, and why. Only the leaves of the list
count (a directory listed because something beneath it changed says nothing of its own). The
agent's outputs (its working directory, a mount the diff never lists, and [verifier].outputs)
are left out. What counts goes into the record as `verification.tampered`: the tests may have
run with something of the agent's in place of the image's. It is a report, cheap and always on,
not a guard: an agent that installs a package with pip or apt also shows here, and a change
the rules do not name (a data file the tests read, a library outside these paths) does not.
The sealed verifier (the README's "Task environments") is the guard.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from trajforge.sandbox.interface import Change

MAX_LISTED = 50  # changes kept in a record; `tampered_count` has them all

BIN = ("/bin/*", "/sbin/*", "/usr/bin/*", "/usr/sbin/*", "/usr/local/bin/*", "/usr/local/sbin/*")
LIB = ("/lib/*", "/lib32/*", "/lib64/*", "/usr/lib/*", "/usr/lib32/*", "/usr/lib64/*", "/usr/local/lib/*")
HOMES = ("/root", "/home/*")


@dataclass(frozen=True, slots=True)
class Rule:
    patterns: tuple[str, ...]  # fnmatch patterns of absolute paths (`*` spans `/`)
    kinds: str  # the changes that count: A(dded), C(hanged), D(eleted)
    what: str


RULES: tuple[Rule, ...] = (
    Rule(("*/site-packages/*.pth", "*/dist-packages/*.pth", "*/sitecustomize.py", "*/usercustomize.py"), "ACD",
         "Python start-up code (.pth, sitecustomize)"),
    Rule(("*/site-packages/*", "*/dist-packages/*"), "CD", "an installed Python package"),  # added ones: pip install
    Rule(("/usr/lib/python*", "/usr/local/lib/python*", "/usr/lib64/python*", "/opt/*/lib/python*"), "ACD",
         "the Python standard library"),
    Rule(BIN, "ACD", "a program on PATH"),
    Rule(("/etc/ld.so.preload", "/etc/ld.so.conf", "/etc/ld.so.conf.d/*"), "ACD", "the dynamic loader's settings"),
    Rule(tuple(f"{d}*.so*" for d in LIB), "CD", "a shared library"),
    Rule(("/etc/profile", "/etc/profile.d/*", "/etc/bash.bashrc", "/etc/bashrc", "/etc/environment",
          *(f"{h}/.{f}" for h in HOMES for f in ("bashrc", "profile", "bash_profile", "bash_login"))), "ACD",
         "a shell start-up file"),
    Rule(("/etc/passwd", "/etc/group", "/etc/shadow", "/etc/sudoers", "/etc/sudoers.d/*"), "ACD",
         "the users and their shells"),
    Rule(("/pytest.ini", "/conftest.py", "/tox.ini", "/setup.cfg", "/pyproject.toml", "/.pytest_cache*"), "ACD",
         "pytest's configuration above the tests"),
)


def _within(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def rule_for(path: str, extra: tuple[str, ...] = ()) -> Rule | None:
    """The first rule matching `path`; `extra` paths (the tests' BASH_ENV) count whatever changed them."""
    if path in extra:
        return Rule(extra, "ACD", "BASH_ENV of the tests")
    return next((r for r in RULES if any(fnmatchcase(path, p) for p in r.patterns)), None)


def wanted(outputs: tuple[str, ...], extra: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    """The filter handed to ImageSandbox.changes: paths some rule names, outside the outputs."""
    def accept(path: str) -> bool:
        return not _within(path, outputs) and rule_for(path, extra) is not None

    return accept


def report(changes: list[Change], outputs: tuple[str, ...], extra: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The changes that count, as the record lists them: {"change", "path", "what"}, in path order."""
    paths = sorted({c.path for c in changes})
    parents = {p.rsplit("/", 1)[0] for p in paths}
    found = []
    for c in sorted(changes, key=lambda c: c.path):
        if c.path in parents or _within(c.path, outputs):
            continue  # a directory listed for what changed beneath it
        rule = rule_for(c.path, extra)
        if rule is not None and c.kind in rule.kinds:
            found.append({"change": c.kind, "path": c.path, "what": rule.what})
    return found
