"""A test-only subcommand: one module; tests/test_architecture.py registers it with one line."""

from __future__ import annotations

from trajforge.cli.flags import Flag, Parser, add_flags, parse_flags
from trajforge.errors import UsageError

FLAGS: list[Flag] = [("greeting_name", "str", "who to greet"), ("times", "int", "how often")]


def main(argv: list[str]) -> int:
    parser = Parser(prog="trajforge hello", description="Greet someone (test only).")
    add_flags(parser, FLAGS)
    ns = parse_flags(parser, argv, FLAGS)
    if ns.greeting_name is None:
        raise UsageError("missing required flag --greeting_name")
    for _ in range(ns.times or 1):
        print(f"hello {ns.greeting_name}")
    return 0
