"""The documentation site (mkdocs.yml, docs/): it builds with `mkdocs build --strict` offline, so a
broken link or anchor or a page missing from the nav fails here as in CI; its configuration
reference is made from the settings themselves; the README stays a first hour's read and points
at every page."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

from tests.support.commands import user_env
from tests.support.docs import REPO, nav_pages, page
from trajforge.cli.reference import markdown, run_sections
from trajforge.cli.run import _default_text, run_flags
from trajforge.config import RunConfig

MARKER = "<!-- generated: trajforge.cli.reference (docs/hooks/reference.py) -->"


def build(site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"),
                           "--site-dir", str(site)], cwd=site.parent, env=user_env(), capture_output=True, text=True,
                          timeout=300)


def anchors(markdown_text: str) -> set[str]:
    """The ids MkDocs gives a page's headings (its toc extension's default slugify)."""
    from markdown.extensions.toc import slugify

    return {slugify(m, "-") for m in re.findall(r"^#{1,6} (.+)$", markdown_text, re.M)}


def test_the_site_builds_strict_and_its_reference_holds_every_setting(tmp_path: Path) -> None:
    proc = build(tmp_path / "site")
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    built = html.unescape((tmp_path / "site" / "configuration.html").read_text(encoding="utf-8"))
    for name in RunConfig.model_fields:
        assert f"<code>{name}</code>" in built, name
    assert MARKER not in built and "<code>--sandbox_disk</code>" in built


def test_a_broken_link_or_a_page_left_out_of_the_nav_fails_the_build(tmp_path: Path) -> None:
    # the build of a copy of the docs: one link to an anchor no page has, one page the nav lacks
    import shutil

    shutil.copytree(REPO / "docs", tmp_path / "docs")
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    guide = tmp_path / "docs" / "user-guide.md"
    guide.write_text(guide.read_text() + "\nSee [the limits](sandboxes.md#no-such-section).\n")
    (tmp_path / "docs" / "orphan.md").write_text("# Orphan\n")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=tmp_path, env=user_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "no-such-section" in proc.stderr and "orphan.md" in proc.stderr, proc.stderr


def test_the_configuration_reference_is_the_settings_own() -> None:
    """Every setting of every layer's section, each with its flag, its default as --help says it and
    its help: nothing of it is written by hand in the page, which holds only the marker."""
    reference = markdown()
    source = page("configuration.md")
    assert source.count(MARKER) == 1
    flags = {f.name: f.help for f in run_flags()}
    for section in run_sections():
        assert f"`{section.__name__}`" in reference
        for name in section.model_fields:
            rows = [line for line in reference.splitlines() if line.startswith(f"| `{name}` |")]
            assert len(rows) == 1, name
            assert f"| `{name}` |" not in source, f"{name}: written by hand in configuration.md"
            if name in flags:
                default = _default_text(name, strict_required=False).strip().removeprefix("[default: ").removesuffix("]")
                assert rows[0] == f"| `{name}` | `--{name}` | {default} | {' '.join(flags[name].split())} |", rows[0]
            else:
                assert "| file only |" in rows[0], rows[0]
    assert "| `tools.web.max_results` | file only | 5 |" in reference  # a nested section's keys, by path
    assert "| `compression.target_max_tokens` | 15250 |" in reference  # the compressor's file


def test_the_readme_is_a_first_hours_read_that_points_at_every_page() -> None:
    readme = page("README.md")
    assert len(readme.splitlines()) <= 250
    for section in ("## Quick start", "## Running a real job", "## View and export", "## Documentation",
                    "## Architecture"):
        assert section in readme, section
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)(?:#[\w-]*)?\)", readme))
    pages = set(nav_pages())
    assert pages - {"index.md"} <= linked, pages - linked
    for target, anchor in re.findall(r"\]\(docs/([\w-]+\.md)#([\w-]+)\)", readme):  # the site checks its own
        assert anchor in anchors(page(target)), f"README.md links to {target}#{anchor}, which it lacks"
    on_disk = {p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")}
    assert on_disk == pages  # every page is in the nav (the strict build says so too)
