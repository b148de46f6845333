"""Ray token authentication, decided once per process so every Ray piece trajforge starts agrees.

Ray 2.60 is inconsistent on its own: `ray start --head` turns token authentication on when a
token file exists (~/.ray/auth_token, which any earlier `ray.init()` writes), while
`ray.init(address=...)` and `ray start --address` only use it when RAY_AUTH_MODE says so. Left
alone, a head started after an `--executor ray` run rejects its own driver (InvalidAuthToken).
`decide` reads the environment the way Ray's head does and the caller exports the result as
RAY_AUTH_MODE, so the head, the driver and a worker node all run in the same mode. Pure: no
Ray import, so errors here are plain messages.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trajforge.errors import UsageError

MODE_VAR = "RAY_AUTH_MODE"
TOKEN_VAR = "RAY_AUTH_TOKEN"
TOKEN_PATH_VAR = "RAY_AUTH_TOKEN_PATH"
HOW = (f"give every node the same token (${TOKEN_VAR}, ${TOKEN_PATH_VAR} or ~/.ray/auth_token; "
       f"`ray get-auth-token --generate` makes one), or set {MODE_VAR}=disabled on all nodes of a private network")


@dataclass(frozen=True, slots=True)
class AuthDecision:
    mode: str  # "token" or "disabled"
    source: str  # where the mode (and token) came from, for the one line the commands print

    def describe(self) -> str:
        return f"Ray authentication: {self.mode} ({self.source})"


def token_source(environ: Mapping[str, str], home: Path | None = None) -> str | None:
    """Where Ray would find a token, in Ray's order, or None."""
    if environ.get(TOKEN_VAR, "").strip():
        return f"${TOKEN_VAR}"
    path = environ.get(TOKEN_PATH_VAR, "").strip()
    if path:
        return f"${TOKEN_PATH_VAR} ({path})" if _nonempty(Path(path)) else None
    home = home if home is not None else Path(environ.get("HOME") or Path.home())
    default = home / ".ray" / "auth_token"
    return f"{default}" if _nonempty(default) else None


def _nonempty(path: Path) -> bool:
    try:
        return path.is_file() and path.stat().st_size > 0
    except OSError:
        return False


def decide(environ: Mapping[str, str] = os.environ, home: Path | None = None) -> AuthDecision:
    """The mode every Ray process of this command uses. Raises UsageError when token mode is
    asked for but there is no token: Ray would fail later with a less helpful message."""
    asked = environ.get(MODE_VAR, "").strip().lower()
    source = token_source(environ, home)
    if asked:
        if asked not in ("token", "disabled"):
            raise UsageError(f"{MODE_VAR}={environ[MODE_VAR]!r} is not a Ray authentication mode: "
                             "use token or disabled")
        if asked == "token" and source is None:
            raise UsageError(f"{MODE_VAR}=token but no Ray authentication token was found: {HOW}")
        return AuthDecision(asked, f"{MODE_VAR}={asked}" + (f", token from {source}" if asked == "token" else ""))
    if source is not None:
        return AuthDecision("token", f"{MODE_VAR} unset and a token exists: {source}")
    return AuthDecision("disabled", f"{MODE_VAR} unset and no token found")


def apply(decision: AuthDecision) -> None:
    """Export the decision, so this process and every Ray process it starts share it."""
    os.environ[MODE_VAR] = decision.mode
    if "ray" in sys.modules:  # Ray caches its config at import: refresh it, as Ray itself does
        try:
            from ray._raylet import Config

            Config.initialize("")
        except Exception:  # another Ray version: child processes still read the environment
            pass


def is_auth_failure(text: str) -> bool:
    """Whether Ray output or an exception text is an authentication failure."""
    return "InvalidAuthToken" in text or "AuthenticationError" in text or "authentication token" in text.lower()


def failure_message(where: str, decision: AuthDecision) -> str:
    return (f"{where}: the Ray cluster rejected this node's authentication ({decision.describe()}); "
            f"every node must use the same {MODE_VAR} and token: {HOW}")
