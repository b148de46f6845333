"""`trajforge doctor`: which sandbox backends work on this machine (the report: sandbox/doctor.py)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from trajforge.cli.flags import Flag, Parser

FLAGS = [Flag("json", "bool", "print the report as JSON"),
         Flag("container_engine", "str", "engine to check (default: both)", default="auto",
              choices=("auto", "podman", "docker"))]


def main(argv: list[str]) -> int:
    ns = Parser("trajforge doctor", "Show which sandbox backends work here.", FLAGS).parse(argv)
    from trajforge.sandbox.doctor import format_report, gather_report

    report, statuses = asyncio.run(gather_report(ns.container_engine))
    report["euid"] = os.geteuid()
    if ns.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_report(report, statuses))
    return 0
