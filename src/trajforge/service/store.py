"""The rollout service's own state, in a sqlite3 file of the run directory (RunLayout.service_state).

The run's files (batch files, checkpoint) hold every rollout as they do for `run`; this store holds
what only the service knows: the groups it accepted (their row, size, lane and first sample), what
each rollout became for a trainer, the stream's cursor (a group's place in the order groups
finished), the acks, the policy version, and each lane's policy. A lane is the groups that share
one policy and so one run of the engine (the default lane, '', is the service's own run); a
rollout has a service-wide `idx` and its sample index in its lane's run, `lidx`. Every change is
one transaction, so a SIGKILL leaves the state of the last one: an acked group stays acked, a
finished group keeps its cursor, and a group is never half made.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

QUEUED, FINISHED, ACKED, CANCELLED = "queued", "finished", "acked", "cancelled"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS groups (
    id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, row TEXT NOT NULL, n INTEGER NOT NULL,
    first INTEGER NOT NULL, state TEXT NOT NULL, cursor INTEGER UNIQUE, payload TEXT,
    lane TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS rollouts (
    idx INTEGER PRIMARY KEY, gid TEXT NOT NULL, k INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
    result BLOB, scored INTEGER NOT NULL DEFAULT 0, lane TEXT NOT NULL DEFAULT '', lidx INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS rollouts_of_group ON rollouts (gid);
CREATE TABLE IF NOT EXISTS lanes (key TEXT PRIMARY KEY, policy TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pushed (gid TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass(frozen=True, slots=True)
class Slot:
    """A rollout not yet final: its group, its place in the group, the service's runs of it so far."""

    gid: str
    k: int
    attempts: int
    idx: int  # service-wide (the slot's lane-local index is its sample index in the lane's run)


class ServiceStore:
    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        # WAL with NORMAL: a commit survives the process's kill (SIGKILL), and costs no fsync each
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)
        self._add_lanes()
        self.db.execute("CREATE UNIQUE INDEX IF NOT EXISTS rollouts_of_lane ON rollouts (lane, lidx)")

    def _add_lanes(self) -> None:
        """A state written before lanes: every group is the default lane's, at its own index."""
        for table, added in (("groups", "lane TEXT NOT NULL DEFAULT ''"), ("rollouts", "lane TEXT NOT NULL DEFAULT ''"),
                             ("rollouts", "lidx INTEGER")):
            if added.split()[0] not in {c[1] for c in self.db.execute(f"PRAGMA table_info({table})")}:
                self.db.execute(f"ALTER TABLE {table} ADD COLUMN {added}")
        self.db.execute("UPDATE rollouts SET lidx = idx WHERE lidx IS NULL")

    def close(self) -> None:
        self.db.close()

    # ---- meta ----
    def get(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return orjson.loads(row[0]) if row else default

    def put(self, key: str, value: Any) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, orjson.dumps(value).decode()))

    # ---- lanes ----
    def add_lane(self, key: str, policy: dict[str, Any]) -> None:
        self.db.execute("INSERT OR IGNORE INTO lanes VALUES (?, ?)", (key, orjson.dumps(policy).decode()))

    def lanes(self) -> dict[str, dict[str, Any]]:
        """Each lane but the default one: {"policy": a POST /v1/groups `policy` or None, "tasks": whether of tasks}."""
        return {key: orjson.loads(policy) for key, policy in self.db.execute("SELECT key, policy FROM lanes")}

    def lane_rows(self, lane: str) -> list[tuple[str, int]]:
        """(row, n) of the lane's groups, in the order they were accepted: its run's dataset."""
        return self.db.execute("SELECT row, n FROM groups WHERE lane = ? ORDER BY seq", (lane,)).fetchall()

    def lane_rollouts(self, lane: str) -> list[tuple[int, str]]:
        """(sample index, group id) of the lane's rollouts, in sample order."""
        return self.db.execute("SELECT lidx, gid FROM rollouts WHERE lane = ? ORDER BY lidx", (lane,)).fetchall()

    # ---- groups ----
    def add_groups(self, groups: Sequence[tuple[str, bytes, int]], lane: str = "",
                   policy: dict[str, Any] | None = None) -> None:
        """(id, row line, n) each, of `lane` (with its `policy`: the lane's spec, stored once), in one
        transaction: all of them or none."""
        with self._tx():
            if policy is not None:
                self.add_lane(lane, policy)
            seq = self.db.execute("SELECT COALESCE(MAX(seq), -1) FROM groups").fetchone()[0] + 1
            idx = self.db.execute("SELECT COALESCE(MAX(idx), -1) FROM rollouts").fetchone()[0] + 1
            first = self.db.execute("SELECT COALESCE(MAX(lidx), -1) FROM rollouts WHERE lane = ?",
                                    (lane,)).fetchone()[0] + 1
            for gid, line, n in groups:
                self.db.execute("INSERT INTO groups VALUES (?, ?, ?, ?, ?, ?, NULL, NULL, ?)",
                                (gid, seq, line.decode(), n, first, QUEUED, lane))
                self.db.executemany("INSERT INTO rollouts (idx, gid, k, lane, lidx) VALUES (?, ?, ?, ?, ?)",
                                    [(idx + k, gid, k, lane, first + k) for k in range(n)])
                seq, idx, first = seq + 1, idx + n, first + n

    def slot(self, lane: str, lidx: int) -> Slot | None:
        """The rollout at sample index `lidx` of `lane`'s run while it is still open (its group
        queued, it not final)."""
        row = self.db.execute(
            "SELECT r.gid, r.k, r.attempts, r.idx FROM rollouts r JOIN groups g ON g.id = r.gid "
            "WHERE r.lane = ? AND r.lidx = ? AND r.result IS NULL AND g.state = ?", (lane, lidx, QUEUED)).fetchone()
        return Slot(*row) if row else None

    def note_attempt(self, idx: int) -> None:
        self.db.execute("UPDATE rollouts SET attempts = attempts + 1 WHERE idx = ?", (idx,))

    def settle(self, idx: int, result: bytes, scored: bool) -> str | None:
        """The rollout's final result (JSON); when it was its group's last, the group finishes (its id)."""
        with self._tx():
            gid = self.db.execute("UPDATE rollouts SET attempts = attempts + 1, result = ?, scored = ? WHERE idx = ? "
                                  "RETURNING gid", (result, int(scored), idx)).fetchone()[0]
            left = self.db.execute("SELECT COUNT(*) FROM rollouts WHERE gid = ? AND result IS NULL", (gid,)).fetchone()
            if left[0]:
                return None
            cursor = self.db.execute("SELECT COALESCE(MAX(cursor), 0) FROM groups").fetchone()[0] + 1
            self.db.execute("UPDATE groups SET state = ?, cursor = ? WHERE id = ?", (FINISHED, cursor, gid))
            return str(gid)

    def open_indices(self, lane: str) -> list[int]:
        """The sample indices in `lane`'s run of its open rollouts."""
        return [r[0] for r in self.db.execute(
            "SELECT r.lidx FROM rollouts r JOIN groups g ON g.id = r.gid WHERE r.result IS NULL AND g.state = ? "
            "AND r.lane = ?", (QUEUED, lane))]

    def open_lanes(self) -> dict[str, int]:
        """Each lane with open rollouts: how many."""
        return dict(self.db.execute(
            "SELECT r.lane, COUNT(*) FROM rollouts r JOIN groups g ON g.id = r.gid WHERE r.result IS NULL "
            "AND g.state = ? GROUP BY r.lane", (QUEUED,)).fetchall())

    def group(self, gid: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT id, row, n, state, cursor FROM groups WHERE id = ?", (gid,)).fetchone()
        if row is None:
            return None
        rollouts = [orjson.loads(r[0]) if r[0] else None for r in self.db.execute(
            "SELECT result FROM rollouts WHERE gid = ? ORDER BY k", (gid,))]
        return {"id": row[0], "row": orjson.loads(row[1]), "n": row[2], "state": row[3], "cursor": row[4],
                "rollouts": rollouts}

    def group_line(self, gid: str, cursor: int, scrub: Callable[[bytes], bytes]) -> bytes:
        """A finished group as the stream sends it: one JSON line, put together from the rollouts'
        results as they were saved (scrubbed already: no parsing again) and the row, `scrub`bed."""
        row, n = self.db.execute("SELECT row, n FROM groups WHERE id = ?", (gid,)).fetchone()
        results = self.db.execute("SELECT result, scored FROM rollouts WHERE gid = ? ORDER BY k", (gid,)).fetchall()
        head = orjson.dumps({"id": gid, "cursor": cursor, "n": n, "usable": sum(r[1] for r in results)})
        return b"".join((head[:-1], b',"row":', scrub(row.encode()), b',"rollouts":[',
                         b",".join(r[0] for r in results), b"]}\n"))

    def finished_after(self, cursor: int) -> Iterator[tuple[str, int]]:
        """(id, cursor) of finished, unacked groups past `cursor`, in the order they finished."""
        yield from self.db.execute("SELECT id, cursor FROM groups WHERE state = ? AND cursor > ? ORDER BY cursor",
                                   (FINISHED, cursor)).fetchall()

    def ack(self, ids: Sequence[str]) -> int:
        with self._tx():
            return sum(self.db.execute("UPDATE groups SET state = ? WHERE id = ? AND state = ?",
                                       (ACKED, gid, FINISHED)).rowcount for gid in ids)

    def note_pushed(self, gid: str) -> None:
        self.db.execute("INSERT OR IGNORE INTO pushed VALUES (?)", (gid,))

    def unpushed(self) -> list[tuple[str, int]]:
        """(id, cursor) of finished groups (acked or not) not yet pushed, in the order they finished."""
        return self.db.execute("SELECT id, cursor FROM groups WHERE cursor IS NOT NULL AND state IN (?, ?) "
                               "AND id NOT IN (SELECT gid FROM pushed) ORDER BY cursor", (FINISHED, ACKED)).fetchall()

    def cancel(self, gid: str) -> bool:
        return self.db.execute("UPDATE groups SET state = ? WHERE id = ? AND state = ?",
                               (CANCELLED, gid, QUEUED)).rowcount == 1

    def counts(self) -> dict[str, int]:
        found = dict(self.db.execute("SELECT state, COUNT(*) FROM groups GROUP BY state").fetchall())
        return {s: int(found.get(s, 0)) for s in (QUEUED, FINISHED, ACKED, CANCELLED)}

    def _tx(self) -> _Tx:
        return _Tx(self.db)


class _Tx:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *_: object) -> None:
        self.db.execute("ROLLBACK" if kind is not None else "COMMIT")
