"""finished.idx: where the record of every finished sample is, in 24 bytes a sample.

The batch files are the truth about kept trajectories; this index saves reading them. An entry is
three little-endian u64: the sample's key (runner.state.keys), its batch number << 32 | the record's
length, and the record's byte offset in batch_<N>.jsonl. The file starts with 16 bytes: a magic
string and a token; checkpoint.json names the token and how many entries it vouches for, so bytes
appended after it (a compaction interrupted before its snapshot) are ignored, and a rewritten
index that its snapshot never saw is recognised and not used. In memory the entries are three
arrays and a set of keys: about 100 MB at a million samples, against ~1.5 GB for the same as
Python objects.
"""

from __future__ import annotations

import os
import secrets
import sys
from array import array
from pathlib import Path

from trajforge.errors import OutputError

MAGIC = b"TFIDX1\n\0"
HEADER = len(MAGIC) + 8
ENTRY = 24


class Finished:
    def __init__(self) -> None:
        self.keys = array("Q")
        self.meta = array("Q")  # batch << 32 | length
        self.offsets = array("Q")
        self._set: set[int] = set()
        self.token = ""
        self.saved = 0  # entries of the file on disk that the snapshot vouches for
        self.rewrite = False  # entries were removed: the file is written anew at the next save

    def __len__(self) -> int:
        return len(self._set)

    def __contains__(self, key: int) -> bool:
        return key in self._set

    def add(self, key: int, batch: int, offset: int, length: int) -> bool:
        """Record a finished sample's record; False (nothing changes) when the sample has one already."""
        if key in self._set:
            return False
        self._set.add(key)
        self.keys.append(key)
        self.meta.append(batch << 32 | length)
        self.offsets.append(offset)
        return True

    def location(self, i: int) -> tuple[int, int, int]:
        """(batch, offset, length) of entry `i`."""
        m = self.meta[i]
        return m >> 32, self.offsets[i], m & 0xFFFFFFFF

    def remove(self, keys: set[int]) -> None:
        keep = [i for i, k in enumerate(self.keys) if k not in keys]
        self.keys = array("Q", (self.keys[i] for i in keep))
        self.meta = array("Q", (self.meta[i] for i in keep))
        self.offsets = array("Q", (self.offsets[i] for i in keep))
        self._set -= keys
        self.rewrite = True

    @classmethod
    def read(cls, path: Path, token: str, count: int) -> Finished | None:
        """The first `count` entries of the index at `path` if its token is `token`, else None."""
        try:
            with path.open("rb") as f:
                head = f.read(HEADER)
                data = f.read(count * ENTRY)
        except OSError:
            return None
        if head[:len(MAGIC)] != MAGIC or head[len(MAGIC):].hex() != token or len(data) != count * ENTRY:
            return None
        flat = array("Q")
        flat.frombytes(data)
        if sys.byteorder != "little":
            flat.byteswap()
        new = cls()
        new.keys, new.meta, new.offsets = flat[0::3], flat[1::3], flat[2::3]
        new._set = set(new.keys)
        new.token, new.saved = token, count
        if len(new._set) != count:
            return None  # not an index this code wrote
        return new

    def save(self, path: Path) -> None:
        """Put every entry on disk (appended, or the file written anew), fsynced; the snapshot
        written next vouches for them. Raises OutputError."""
        try:
            if self.rewrite or not self.token:
                self.token = secrets.token_hex(8)
                tmp = path.with_name(f".{path.name}.new.tmp")
                with tmp.open("wb") as f:
                    f.write(MAGIC + bytes.fromhex(self.token))
                    self._write(f, 0)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            elif len(self.keys) > self.saved:
                with path.open("r+b") as f:
                    f.truncate(HEADER + self.saved * ENTRY)  # what a compaction left unvouched goes first
                    f.seek(0, os.SEEK_END)
                    self._write(f, self.saved)
                    f.flush()
                    os.fsync(f.fileno())
        except OSError as e:
            raise OutputError(path, e) from None
        self.saved, self.rewrite = len(self.keys), False

    def _write(self, f, start: int) -> None:  # type: ignore[no-untyped-def]
        step = 1 << 16
        for lo in range(start, len(self.keys), step):
            hi = min(len(self.keys), lo + step)
            flat = array("Q", bytes(ENTRY * (hi - lo)))
            flat[0::3], flat[1::3], flat[2::3] = self.keys[lo:hi], self.meta[lo:hi], self.offsets[lo:hi]
            if sys.byteorder != "little":
                flat.byteswap()
            f.write(flat.tobytes())
