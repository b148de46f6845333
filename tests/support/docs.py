"""The documentation as a reader finds it: README.md, then the pages of the docs site (mkdocs.yml's
nav, in its order). Tests that check what the docs say read a page from here by its file name, so
text moved between pages is found where it now is."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "mkdocs.yml"


def nav_pages() -> list[str]:
    """The site's pages (paths under docs/), in the nav's order."""
    config = yaml.safe_load(SITE.read_text(encoding="utf-8"))
    pages: list[str] = []

    def walk(entries: list) -> None:
        for entry in entries:
            target = next(iter(entry.values())) if isinstance(entry, dict) else entry
            if isinstance(target, list):
                walk(target)
            else:
                pages.append(target)

    walk(config["nav"])
    return pages


def documents() -> list[str]:
    """Every Markdown document a user reads, in reading order, as paths relative to the repository."""
    return ["README.md", *(f"docs/{p}" for p in nav_pages())]


def page(name: str) -> str:
    """The text of README.md or of a docs page (`sandboxes.md`)."""
    return (REPO / (name if name == "README.md" else f"docs/{name}")).read_text(encoding="utf-8")
