"""What a README audit found a new user hits (issue 37, part 4), each through the real CLI where
there is behaviour to check, and against the README's own text where the fix was to it."""

from __future__ import annotations

import re

from tests.conftest import REPO

README = (REPO / "README.md").read_text()


def _paragraph(starting: str) -> str:
    start = README.index(starting)
    return README[start:README.index("\n- ", start + 1)]


def test_the_readme_does_not_claim_docker_support_it_cannot_have_tested() -> None:
    container = re.sub(r"\s+", " ", _paragraph("- `container`: a container per sample"))
    assert "Docker is untested" in container and "no Docker daemon" in container
