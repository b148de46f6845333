"""`trajforge distributions`: list the toolset distributions (built-in and a --config file's)."""

from __future__ import annotations

from pathlib import Path

from trajforge.cli.flags import Flag, Parser
from trajforge.config import RunConfig
from trajforge.config.load import build_config

FLAGS = [Flag("config", "path", "YAML config file with custom distributions")]


def print_distributions(config: RunConfig) -> int:
    from trajforge.catalog.distributions import format_distributions

    print(format_distributions(config.all_distributions()))
    return 0


def main(argv: list[str]) -> int:
    config_file: Path | None = Parser("trajforge distributions", "List the toolset distributions.",
                                      FLAGS).parse(argv).config
    return print_distributions(build_config({}, config_file))
