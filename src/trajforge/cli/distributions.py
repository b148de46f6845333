"""`trajforge distributions`: list the toolset distributions (built-in and a --config file's)."""

from __future__ import annotations

from pathlib import Path

from trajforge.cli.flags import Parser, add_flags, parse_flags
from trajforge.config import RunConfig
from trajforge.config.load import build_config

FLAGS = [("config", "path", "YAML config file with custom distributions")]


def print_distributions(config: RunConfig) -> int:
    from trajforge.catalog.distributions import format_distributions

    print(format_distributions(config.all_distributions()))
    return 0


def main(argv: list[str]) -> int:
    parser = Parser(prog="trajforge distributions", description="List the toolset distributions.")
    add_flags(parser, FLAGS)
    config_file: Path | None = parse_flags(parser, argv, FLAGS).config
    return print_distributions(build_config({}, config_file))
