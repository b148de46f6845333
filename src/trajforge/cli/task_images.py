"""`trajforge tasks prune`: remove the task images this user built, and no other image.

Task images (tasks/environment.py) carry the build key and the uid that built them; `prune`
removes those of the user running it (images other users built, or built before images carried
their builder, are left, and counted), through the run's container engine.
"""

from __future__ import annotations

import asyncio
import os

from trajforge.cli.flags import Flag, Parser

FLAGS = [Flag("action", "str", "prune: remove the task images this user built", choices=("prune",), positional=True,
              metavar="ACTION"),
         Flag("container_engine", "str", "the engine whose images to prune", default="auto",
              choices=("auto", "podman", "docker")),
         Flag("dry_run", "bool", "list what would be removed, remove nothing")]


def main(argv: list[str]) -> int:
    ns = Parser("trajforge tasks", "Manage task environments' images.", FLAGS).parse(argv)
    from trajforge.sandbox.factory import SandboxProvider
    from trajforge.sandbox.sandbox_settings import ContainerSettings, SandboxSettings
    from trajforge.tasks.environment import prune

    settings = SandboxSettings(container=ContainerSettings(engine=ns.container_engine))

    async def run() -> int:
        async with SandboxProvider(settings) as provider:
            result = await prune(await provider.image_store(), os.getuid(), dry_run=ns.dry_run)
        verb = "would remove" if ns.dry_run else "removed"
        print(f"{verb} {len(result.removed)} task image(s) built by uid {os.getuid()}")
        for name in result.removed:
            print(f"  {name}")
        if result.others:
            print(f"left {result.others} task image(s) of other users (or built before images named their builder)")
        for line in result.failed:
            print(f"  not removed: {line}")
        return 1 if result.failed else 0

    return asyncio.run(run())
