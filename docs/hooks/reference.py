"""MkDocs hook: the configuration reference's tables, made at build time from the settings
themselves (trajforge.cli.reference), in place of the marker in configuration.md."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- generated: trajforge.cli.reference (docs/hooks/reference.py) -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != "configuration.md":
        return markdown
    from trajforge.cli.reference import markdown as reference

    if MARKER not in markdown:
        raise ValueError(f"configuration.md lost its marker {MARKER}: the reference has nowhere to go")
    return markdown.replace(MARKER, reference())
