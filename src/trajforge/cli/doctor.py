"""`trajforge doctor`: which sandbox backends work on this machine (the report: sandbox/doctor.py)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from trajforge.cli.flags import Flag, Parser

FLAGS = [Flag("json", "bool", "print the report as JSON"),
         Flag("container_engine", "str", "engine to check (default: both)", default="auto",
              choices=("auto", "podman", "docker")),
         Flag("repair", "bool", "first mend what is broken on this host (a wedged container storage), saying each step")]


def main(argv: list[str]) -> int:
    ns = Parser("trajforge doctor", "Show which sandbox backends work here.", FLAGS).parse(argv)
    from trajforge.sandbox.doctor import format_report, gather_report, repair

    mended = asyncio.run(repair()) if ns.repair else None
    report, statuses = asyncio.run(gather_report(ns.container_engine))
    report["euid"] = os.geteuid()
    if mended is not None:
        report["repair"] = {"healthy": mended[0], "steps": mended[1]}
    if ns.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        if mended is not None:
            print("repair:" if mended[1] else "repair: nothing to mend", *(f"  {line}" for line in mended[1]),
                  sep="\n", end="\n\n")
        print(format_report(report, statuses))
    return 0 if mended is None or mended[0] else 1
