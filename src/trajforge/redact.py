"""The one secret scrubber: every secret the process holds, replaced by a fixed marker on the way out.

A tool under the local sandbox can read the runner's own command line and environment from
/proc, and a model may repeat whatever it read; so instead of guessing where a key could surface,
everything the runner saves or prints (trajectory lines, checkpoint messages, statistics,
config.json, log and progress output) passes through `REGISTRY`, which knows every model and
tool API key of the run. Keys shorter than `MIN_LENGTH` are not scrubbed: replacing a 3-letter
string everywhere would corrupt data without protecting anything.

This module is a leaf (at run time it imports only the toolset catalog, itself a leaf), so the
CLI's error guard, the runner and the sample workers (also Ray actors, which know their node's own keys) share it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trajforge.config import RunConfig

MARKER = "***"
MIN_LENGTH = 8
# Environment variables whose value is a credential by name (OPENROUTER_API_KEY, BRAVE_API_KEY,
# TAVILY_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY...), besides the ones a config names.
_SECRET_NAME = re.compile(r"(?:^|_)(?:API_?KEY|TOKEN|SECRET|SECRET_KEY|ACCESS_KEY|PASSWORD|PASSWD|PAT|PRIVATE_KEY"
                          r"|CREDENTIALS?|AUTH|DSN)$", re.I)
# ...and by shape, whatever the name: a URL with a password (DATABASE_URL=postgres://u:pw@host)
# or a private key in PEM.
_URL_PASSWORD = re.compile(r"://[^/\s:@]*:([^/\s@]+)@")
_PEM_KEY = "PRIVATE KEY-----"


class Scrubber:
    """Replaces each known secret (and its JSON-escaped spelling) by MARKER in text and bytes."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._text: list[str] = []
        self._bytes: list[bytes] = []
        self.add(*secrets)

    def add(self, *secrets: str | None) -> None:
        for s in secrets:
            s = (s or "").strip()
            if len(s) < MIN_LENGTH:
                continue
            # Longest first, so a key that contains another is replaced whole.
            for form in {s, json.dumps(s)[1:-1]}:
                if form not in self._text:
                    self._text.append(form)
                    self._bytes.append(form.encode())
        self._text.sort(key=len, reverse=True)
        self._bytes.sort(key=len, reverse=True)

    def __bool__(self) -> bool:
        return bool(self._text)

    def text(self, s: str) -> str:
        for secret in self._text:
            if secret in s:
                s = s.replace(secret, MARKER)
        return s

    def bytes(self, b: bytes) -> bytes:
        for secret in self._bytes:
            if secret in b:
                b = b.replace(secret, MARKER.encode())
        return b

    def value(self, obj: Any) -> Any:
        """A copy of a JSON-like value with every string scrubbed (keys included)."""
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {self.text(k) if isinstance(k, str) else k: self.value(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [self.value(v) for v in obj]
        return obj


REGISTRY = Scrubber()
"""The process-wide scrubber: the runner and workers add the run's secrets at start."""


def secret_env_names(environ: Mapping[str, str]) -> list[str]:
    """The environment variables that hold a credential, by their name or their value's shape."""
    return [n for n, v in environ.items()
            if _SECRET_NAME.search(n) or _PEM_KEY in v or _URL_PASSWORD.search(v)]


def secret_parts(value: str) -> list[str]:
    """A secret, each of its lines (a command may print one line of a PEM key) and a URL's password."""
    lines = value.splitlines()
    lines = [line for line in lines if not line.startswith("-----")] if len(lines) > 1 else []  # not PEM's BEGIN/END
    return [value, *lines, *_URL_PASSWORD.findall(value)]


def run_secrets(config: RunConfig, environ: Mapping[str, str] = os.environ) -> list[str]:
    """Every secret a run holds: --api_key, credential environment variables (secret_env_names),
    and the variables the `tools:` section names for its own keys (each toolset's spec says which
    of its settings name one: catalog.ToolsetCaps.key_settings)."""
    from trajforge.catalog import TOOLSETS

    names = set(secret_env_names(environ))
    for spec in TOOLSETS.specs():
        section = getattr(config.tools, spec.settings) if spec.settings else None
        names |= {n for key in spec.capabilities.key_settings if (n := getattr(section, key))}
    values = [environ.get(n) or "" for n in sorted(names)]
    if config.api_key is not None:
        values.append(config.api_key.get_secret_value())
    return [part for v in values for part in secret_parts(v) if part.strip()]


def hide_in_proc(secrets: Iterable[str]) -> bool:
    """Overwrite `secrets` in this process's command line and environment as /proc/<pid>/cmdline
    and /proc/<pid>/environ show them.

    `--api_key=...` and `OPENROUTER_API_KEY=...` are otherwise readable by every process of the
    same user (`ps`, or a command under the local sandbox). Python keeps its own copies of argv
    and the environment (sys.argv, os.environ), so this changes nothing else: a child process
    started with os.environ still gets the real value, which is why the sandboxes start commands
    with a clean environment. Linux only; False when the kernel refuses (the scrubber still keeps
    the key out of the data).
    """
    wanted = [s.encode() for s in secrets if len(s.strip()) >= MIN_LENGTH]
    if not wanted:
        return True
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2:].split()
        # arg_start, arg_end, env_start, env_end: fields 48 to 51 of stat(5)
        regions = ((int(fields[45]), int(fields[46])), (int(fields[47]), int(fields[48])))
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            for start, end in regions:
                mem.seek(start)
                text = mem.read(end - start)
                hidden = text
                for secret in wanted:
                    hidden = hidden.replace(secret, b"*" * len(secret))  # same length: the layout is kept
                if hidden != text:
                    mem.seek(start)
                    mem.write(hidden)
        return True
    except (OSError, ValueError, IndexError):
        return False

