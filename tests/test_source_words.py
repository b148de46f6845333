"""Comments and docstrings in src/ name things that exist.

A comment that points at a file or module that moved sends the reader nowhere (issue 46 item 7),
and a document outside the repository cannot be read by anyone who has only the repository. So:
every repository path (`dir/file.py`, `name.md`, `dir/`) and every `trajforge.module[.name]` that a
comment or docstring of src/ names must exist, and none cites the product spec, which is not in the
repository (say what the sentence means, or point at the README).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "trajforge"

# `dir/name.py`, `name.md`, `dir/sub/` -- not part of a URL, an absolute path or a longer word.
FILE = re.compile(r"(?<![\w./:~-])((?:[\w-]+/)*[\w-]+\.(?:py|md))(?![\w/-])")
DIRECTORY = re.compile(r"(?<![\w./:~-])((?:[\w-]+/){1,}[\w-]+/)(?![\w.-])")
DOTTED = re.compile(r"(?<![\w.])(trajforge(?:\.\w+)+)")
SPEC = re.compile(r"\bSPEC\b(?:\.md)?(?: section)?")


def texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a module."""
    source = path.read_text(encoding="utf-8")
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.append((first.lineno, first.value.value))
    return found


@cache
def file_names() -> frozenset[str]:
    """The name of every file of the repository (its source, tests, benchmarks and examples)."""
    roots = [REPO / d for d in ("src", "tests", "bench", "examples")]
    return frozenset(p.name for root in roots for p in root.rglob("*") if p.is_file()) | \
        frozenset(p.name for p in REPO.iterdir() if p.is_file())


def exists(path: Path, named: str) -> bool:
    """Whether `named` is a path of the repository seen from `path`: with a directory, from the
    root, from src/ or src/trajforge/, or from the directory of `path` or one of its parents inside
    the package; a bare file name (`zygote.py`, a module of a neighbouring package), anywhere."""
    if "/" not in named:
        return named in file_names()
    bases = [REPO, REPO / "src", SRC, *[d for d in path.parents if d == SRC or SRC in d.parents]]
    return any((base / named).exists() for base in bases)


@cache
def top_level_names(module: Path) -> frozenset[str]:
    names: set[str] = set()
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def module_exists(dotted: str) -> bool:
    """`trajforge.a.b[.name]`: the longest prefix that is a module or package of src/, then at most
    a name defined at its top level (deeper attributes are not checked)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = REPO / "src" / Path(*parts[:n])
        module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if module.is_file():
            rest = parts[n:]
            return not rest or rest[0] in top_level_names(module) or (base.is_dir() and (base / rest[0]).exists())
    return False


def test_every_path_and_module_a_comment_names_exists() -> None:
    stale = []
    for path in sorted(SRC.rglob("*.py")):
        for line, text in texts(path):
            where = f"{path.relative_to(REPO)}:{line}"
            stale += [f"{where}: {m}" for m in FILE.findall(text) + DIRECTORY.findall(text) if not exists(path, m)]
            stale += [f"{where}: {m}" for m in DOTTED.findall(text) if not module_exists(m.rstrip("."))]
    assert stale == []


def test_no_comment_cites_the_spec_which_is_not_in_the_repository() -> None:
    cites = [f"{path.relative_to(REPO)}:{line}: {m}" for path in sorted(SRC.rglob("*.py"))
             for line, text in texts(path) for m in SPEC.findall(text)]
    assert cites == []


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """The rules fail on a stale name (a mutation check of the two tests above)."""
    here = SRC / "tools" / "web" / "fetch.py"
    assert exists(here, "egress.py") and exists(here, "tools/web/egress.py") and exists(here, "bench/RESULTS.md")
    assert exists(here, "zygote.py") and not exists(here, "tools/egress.py") and not exists(here, "web_search.py")
    assert exists(here, "sandbox/backends/") and not exists(here, "commands/")
    assert module_exists("trajforge.cli.run") and module_exists("trajforge.cli.run.run_flags")
    assert not module_exists("trajforge.commands.run") and not module_exists("trajforge.cli.run.no_such_name")
    sample = tmp_path / "m.py"
    sample.write_text('"""See tools/egress.py and trajforge.cmdline (SPEC section 2)."""\n# also config_load.py\n')
    found = [m for _, text in texts(sample) for m in FILE.findall(text) + DOTTED.findall(text) + SPEC.findall(text)]
    assert sorted(found) == ["SPEC section", "config_load.py", "tools/egress.py", "trajforge.cmdline"]
