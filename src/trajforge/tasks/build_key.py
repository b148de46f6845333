"""The key a task image is cached under: everything that decides what its build makes.

A cached image is used only when its key is the one its task's build would have now: the build
context (environment/: names, contents, link targets, every mode bit and owner: load.tree_hash
with metadata), the image id of every base it builds FROM (each resolved through the image store,
so a base image that changed under the same tag makes a new key), and the build arguments
([environment].build_args). The key is the image's tag (`localhost/trajforge-task-env:<key>`) and
its build-key label (environment.LABEL), and both are checked before a cached image is used: an image
tagged so by anyone who can write to the image store, without the label, is built over.

`base_images` reads the FROM lines of a Dockerfile (pure): continuation lines joined, comments
skipped, `--platform=` flags dropped, ARGs before the first FROM and build arguments filled in
($NAME, ${NAME}, ${NAME:-default}), stages named by an earlier `AS` and `scratch` left out.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Mapping

from trajforge.sandbox.interface import ImageStore, SandboxError
from trajforge.tasks.load import tree_hash
from trajforge.task_spec import TaskSpec

_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def _lines(text: str) -> list[str]:
    """Instructions, one a line: comments dropped, continuation lines joined."""
    out, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending)
    return out


def _fill(word: str, values: Mapping[str, str]) -> str:
    """$NAME and ${NAME} filled in; ${NAME:-word} is `word` when NAME is unset or empty."""
    return _VAR.sub(lambda m: values.get(m.group(1) or m.group(3)) or m.group(2) or "", word)


def base_images(dockerfile: str, build_args: Mapping[str, str]) -> list[str]:
    """The images a Dockerfile builds FROM, in order, each once."""
    values: dict[str, str] = {}
    stages: set[str] = set()
    bases: list[str] = []
    seen_from = False
    for line in _lines(dockerfile):
        word, _, rest = line.partition(" ")
        op = word.upper()
        if op == "ARG" and not seen_from:
            name, eq, default = rest.strip().partition("=")
            values[name] = build_args.get(name, default.strip().strip('"') if eq else "")
        elif op == "FROM":
            seen_from = True
            parts = [p for p in rest.split() if not p.startswith("--")]
            if not parts:
                continue
            image = _fill(parts[0], {**values, **build_args})
            if len(parts) >= 3 and parts[1].lower() == "as":
                stages.add(parts[2].lower())
            if image.lower() != "scratch" and image.lower() not in stages and image not in bases:
                bases.append(image)
    return bases


async def build_key(spec: TaskSpec, store: ImageStore) -> str:
    """The key of `spec`'s image now (the module doc); a base that cannot be had counts as missing
    (its build then says why)."""
    context = spec.environment_dir
    content = await asyncio.to_thread(tree_hash, context, metadata=True)
    try:
        dockerfile = (context / "Dockerfile").read_text(encoding="utf-8", errors="replace")
    except OSError:
        dockerfile = ""
    args = dict(spec.build_args)
    h = hashlib.blake2b(digest_size=16)
    h.update(f"context\0{content}\0".encode())
    for ref in base_images(dockerfile, args):
        info = await store.inspect(ref)
        if info is None:
            try:
                await store.ensure(ref)  # pulled, as the build would
                info = await store.inspect(ref)
            except SandboxError:
                info = None
        h.update(f"from\0{ref}\0{info.id if info is not None else 'missing'}\0".encode())
    for name, value in sorted(args.items()):
        h.update(f"arg\0{name}\0{value}\0".encode())
    return h.hexdigest()
