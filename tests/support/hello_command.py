"""A test-only subcommand: one module; tests/test_architecture.py registers it with one line."""

from __future__ import annotations

from trajforge.cli.flags import Flag, Parser

FLAGS = [Flag("greeting_name", "str", "who to greet", required=True), Flag("times", "int", "how often", default=1)]


def main(argv: list[str]) -> int:
    ns = Parser("trajforge hello", "Greet someone (test only).", FLAGS).parse(argv)
    for _ in range(ns.times):
        print(f"hello {ns.greeting_name}")
    return 0
