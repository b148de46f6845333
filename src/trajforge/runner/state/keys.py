"""Sample identities as 8-byte keys: how a million finished samples fit in a few megabytes.

A sample identity is "<24 hex digits of content hash>:<occurrence>" plus "#<rollout>" for rollouts
after the first (trajforge.dataset). Its key is the first 16 hex digits read as an integer, mixed
with the occurrence and the rollout, so the dataset pass computes it from the digest it already
has (`row_key`) and a record's sample_id gives the same one (`key_of`). Any other row identity (a
task's, a hand-written record's) is hashed whole, and its rollouts mixed in the same way, so
`rollout_key(key_of(row), r) == key_of(row#r)` for every identity. Two distinct samples of one
run share a key with a probability of about n^2 / 2^65 (1e-8 at a million samples).
"""

from __future__ import annotations

import hashlib
import re

from trajforge.dataset import split_rollout

MASK = (1 << 64) - 1
_OCC = 0x9E3779B97F4A7C15  # odd constants: distinct occurrences and rollouts spread over all 64 bits
_ROLL = 0xC2B2AE3D27D4EB4F
_IDENTITY = re.compile(r"([0-9a-f]{16})[0-9a-f]{8}:(0|[1-9]\d{0,8})")


def row_key(digest: bytes, occurrence: int, rollout: int = 0) -> int:
    """The key of the sample with content digest `digest` (12 bytes), occurrence and rollout."""
    return (int.from_bytes(digest[:8], "big") + occurrence * _OCC + rollout * _ROLL) & MASK


def rollout_key(key: int, rollout: int) -> int:
    """The key of rollout `rollout` of the row whose rollout 0 has key `key`."""
    return (key + rollout * _ROLL) & MASK


def key_of(identity: str) -> int:
    row, rollout = split_rollout(identity)
    m = _IDENTITY.fullmatch(row)
    if m is None:
        base = int.from_bytes(hashlib.blake2b(row.encode(), digest_size=8).digest(), "big")
    else:
        base = int(m.group(1), 16) + int(m.group(2)) * _OCC
    return (base + rollout * _ROLL) & MASK
