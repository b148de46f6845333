"""Named toolset distributions and the seeded per-sample draw of toolsets (docs/user-guide.md, "Toolsets and distributions").

A distribution gives each toolset an independent probability in percent. The draw flips each
toolset on its own and keeps the ones that came up and are available on this machine; when none
did, the highest-probability available toolset is used, so every sample gets at least one tool
(a distribution with no available toolset at all is refused when the run starts). The random
stream is seeded from the run seed and the sample identity, so a retried or resumed sample
gets exactly the toolsets it had before, whatever the order samples run in.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Collection
from dataclasses import dataclass, field

from trajforge.catalog import toolset_names

TOOLSETS: tuple[str, ...] = toolset_names()  # the built-in toolsets (config validates against toolset_names())


@dataclass(frozen=True, slots=True)
class Distribution:
    name: str
    description: str
    probabilities: dict[str, float] = field(default_factory=dict)

    def primary(self, available: Collection[str] | None = None) -> str | None:
        """The toolset used when no flip succeeds: the highest-probability one among `available`
        (every toolset when None) with a probability above 0, first listed on ties; None if none."""
        candidates = [(ts, p) for ts, p in self.probabilities.items()
                      if p > 0 and (available is None or ts in available)]
        return max(candidates, key=lambda kv: kv[1])[0] if candidates else None


def _d(name: str, description: str, **probs: float) -> Distribution:
    return Distribution(name, description, dict(probs))


BUILTIN: dict[str, Distribution] = {
    d.name: d
    for d in (
        _d("default", "all tools, all the time", web=100, vision=100, image_gen=100,
           terminal=100, file=100, moa=100, browser=100),
        _d("image_gen", "image generation with vision and web support",
           image_gen=90, vision=90, web=55, terminal=45, moa=10),
        _d("research", "web research with vision analysis and reasoning",
           web=90, browser=70, vision=50, moa=40, terminal=10),
        _d("science", "scientific research", web=94, terminal=94, file=94, vision=65,
           browser=50, image_gen=15, moa=10),
        _d("development", "terminal, files, reasoning, occasional web",
           terminal=80, file=80, moa=60, web=30, vision=10),
        _d("safe", "everything except terminal", web=80, browser=70, vision=60,
           image_gen=60, moa=50),
        _d("balanced", "equal probability of all toolsets", web=50, vision=50, image_gen=50,
           terminal=50, file=50, moa=50, browser=50),
        _d("minimal", "only web tools", web=100),
        _d("terminal_only", "terminal and file tools", terminal=100, file=100),
        _d("terminal_web", "terminal and file with web search", terminal=100, file=100, web=100),
        _d("creative", "image generation and vision", image_gen=90, vision=90, web=30),
        _d("reasoning", "heavy reasoning, few tools", moa=90, web=30, terminal=20),
        _d("browser_use", "full browser interaction", browser=100, web=80, vision=70),
        _d("browser_only", "only browser automation", browser=100),
        _d("browser_tasks", "browser-focused", browser=97, vision=12, terminal=15),
        _d("terminal_tasks", "terminal-focused, occasional others", terminal=97, file=97,
           web=97, browser=75, vision=50, image_gen=10),
        _d("mixed_tasks", "browser, terminal and file heavy", browser=92, terminal=92, file=92,
           web=35, vision=15, image_gen=15),
    )
}


def all_distributions(custom: dict[str, Distribution] | None = None) -> dict[str, Distribution]:
    """Built-in distributions, with config-defined ones added (a custom name may override)."""
    return {**BUILTIN, **(custom or {})}


def _flips(seed: int, dist_name: str, identity: str, n: int) -> tuple[int, ...]:
    """n uniform 32-bit numbers fixed by (seed, distribution, identity).

    sha512, not random.Random or hash(): the same in every process and Python version
    (PYTHONHASHSEED plays no part), and several times cheaper than seeding a Mersenne Twister.
    """
    block = hashlib.sha512(f"{seed}\x00{dist_name}\x00{identity}".encode()).digest()
    while len(block) < 4 * n:  # more than 16 toolsets: extend the stream by hashing it
        block += hashlib.sha512(block).digest()
    return struct.unpack(f">{n}I", block[: 4 * n])


def draw_toolsets(dist: Distribution, seed: int, identity: str,
                    available: Collection[str] | None = None) -> list[str]:
    """Flip every toolset independently; return the enabled, available ones in the distribution's
    order (`available` None: every toolset counts as available).

    Toolset k is on when its number u_k satisfies u_k / 2**32 < p_k / 100. If no available toolset
    is on, the primary (highest-probability) available toolset is used, so the result is never
    empty while any toolset of the distribution is available. The flips do not depend on
    `available`, so a toolset that comes up comes up on every machine.
    """
    flips = _flips(seed, dist.name, identity, len(dist.probabilities))
    chosen = [ts for u, (ts, p) in zip(flips, dist.probabilities.items())
              if u * 100 < p * 2**32 and (available is None or ts in available)]
    if chosen:
        return chosen
    primary = dist.primary(available)
    return [primary] if primary is not None else []


def format_distributions(dists: dict[str, Distribution]) -> str:
    lines = []
    for d in dists.values():
        lines.append(f"{d.name}: {d.description}")
        probs = ", ".join(f"{ts} {p:g}%" for ts, p in d.probabilities.items())
        lines.append(f"    {probs}")
    return "\n".join(lines)
