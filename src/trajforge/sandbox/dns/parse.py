"""DNS wire format for the samples' DNS forwarder (forward.py): parse, check, re-serialise.

Pure functions on bytes, stdlib only (they run in the forwarder's isolated interpreter). A sample
may send anything to its resolver address; what reaches the host's resolver is only ever built
here from a parsed query (`encode_query`): a header whose only flags are RD, AD and CD, exactly
one question (a name of labels, no compression, qtype, qclass) and at most one OPT record (its
payload size and DO bit; every EDNS option dropped). A message that is not such a query, or
has anything left over, is `Malformed` and goes nowhere. A well-formed query outside what
samples may ask (`refusal`: class IN, data types and ANY, names of letters, digits, `-` and `_`)
gets a REFUSED answer from the forwarder itself. Replies are checked (`check_reply`) before they go
back: a response to that id and question whose every record lies inside the message (compression
pointers only backwards, so no loops), nothing left over.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace

MAX_QUERY = 4096  # bytes of a query a sample may send (real ones are < 600)
MAX_REPLY = 4096  # the largest EDNS payload asked for upstream, so the largest reply relayed
_HEADER = struct.Struct(">HHHHHH")
_FIXED = struct.Struct(">HHIH")  # type, class, ttl, rdlength of a record
_QR, _OPCODE = 0x8000, 0x7800
_KEPT_FLAGS = 0x0100 | 0x0020 | 0x0010  # RD, AD, CD: what a client may ask of a resolver
_OPT, _CLASS_IN, _ANY = 41, 1, 255
_DO = 0x8000
_NAME_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
SERVFAIL, REFUSED = 2, 5  # the rcodes of the forwarder's own answers


class Malformed(ValueError):
    """Not a message the forwarder passes on (the reason, for tests and counters)."""


@dataclass(frozen=True, slots=True)
class Query:
    """What a query is made of once parsed; `edns` is the OPT record's (payload size, DO) or None."""

    id: int
    flags: int
    labels: tuple[bytes, ...]
    qtype: int
    qclass: int
    edns: tuple[int, bool] | None = None

    @property
    def key(self) -> tuple[bytes, int, int]:
        """The question as a resolver answers it (names compare without case)."""
        return b".".join(self.labels).lower(), self.qtype, self.qclass


def _name(data: bytes, pos: int) -> tuple[tuple[bytes, ...], int]:
    """An uncompressed name at `pos` (a query's only name comes first: it has nothing to point to)."""
    labels: list[bytes] = []
    size = 1
    while True:
        if pos >= len(data):
            raise Malformed("name runs past the end")
        n = data[pos]
        if n == 0:
            return tuple(labels), pos + 1
        if n & 0xC0:
            raise Malformed("compression or extended label in a query name")
        size += n + 1
        if size > 255:
            raise Malformed("name longer than 255 bytes")
        if pos + 1 + n > len(data):
            raise Malformed("label runs past the end")
        labels.append(data[pos + 1:pos + 1 + n])
        pos += 1 + n


def _skip_name(data: bytes, pos: int) -> int:
    """Past a possibly compressed name at `pos`. Every pointer goes below the lowest offset read so
    far, so following them ends; returns where the name ends in place."""
    floor, end, size = pos, -1, 1
    while True:
        if pos >= len(data):
            raise Malformed("name runs past the end")
        n = data[pos]
        if n == 0:
            return pos + 1 if end < 0 else end
        kind = n & 0xC0
        if kind == 0xC0:
            if pos + 1 >= len(data):
                raise Malformed("pointer runs past the end")
            target = (n & 0x3F) << 8 | data[pos + 1]
            if target < _HEADER.size or target >= floor:
                raise Malformed("compression pointer that does not point backwards")
            if end < 0:
                end = pos + 2
            floor = pos = target
            continue
        if kind:
            raise Malformed("extended label type")
        size += n + 1
        if size > 255:
            raise Malformed("name longer than 255 bytes")
        pos += 1 + n


def _opt(data: bytes, pos: int) -> tuple[tuple[int, bool], int]:
    """The OPT record at `pos` (root name, then type 41): (payload size, DO), its options walked."""
    if data[pos:pos + 1] != b"\x00" or pos + 1 + _FIXED.size > len(data):
        raise Malformed("additional record that is not an OPT record")
    rtype, payload, ttl, rdlen = _FIXED.unpack_from(data, pos + 1)
    if rtype != _OPT:
        raise Malformed("additional record that is not an OPT record")
    pos += 1 + _FIXED.size
    end = pos + rdlen
    if end > len(data):
        raise Malformed("OPT data runs past the end")
    while pos < end:
        if pos + 4 > end:
            raise Malformed("EDNS option header runs past the OPT data")
        pos += 4 + struct.unpack_from(">H", data, pos + 2)[0]
    if pos != end:
        raise Malformed("EDNS option runs past the OPT data")
    if ttl >> 16 & 0xFF:
        raise Malformed(f"EDNS version {ttl >> 16 & 0xFF}")
    return (payload, bool(ttl & _DO)), end


def parse_query(data: bytes) -> Query:
    """The one question of a standard query, or Malformed."""
    if len(data) < _HEADER.size + 5:
        raise Malformed("shorter than a header and a question")
    if len(data) > MAX_QUERY:
        raise Malformed(f"query over {MAX_QUERY} bytes")
    qid, flags, qd, an, ns, ar = _HEADER.unpack_from(data)
    if flags & _QR:
        raise Malformed("a response, not a query")
    if flags & _OPCODE:
        raise Malformed(f"opcode {(flags & _OPCODE) >> 11}, not QUERY")
    if qd != 1 or an or ns or ar > 1:
        raise Malformed(f"sections {qd}/{an}/{ns}/{ar}: one question and at most an OPT record expected")
    labels, pos = _name(data, _HEADER.size)
    if pos + 4 > len(data):
        raise Malformed("question runs past the end")
    qtype, qclass = struct.unpack_from(">HH", data, pos)
    pos += 4
    edns = None
    if ar:
        edns, pos = _opt(data, pos)
    if pos != len(data):
        raise Malformed(f"{len(data) - pos} bytes after the message")
    return Query(qid, flags & _KEPT_FLAGS, labels, qtype, qclass, edns)


def refusal(q: Query) -> str | None:
    """Why samples may not ask this (the forwarder answers REFUSED), or None."""
    if q.qclass != _CLASS_IN:
        return f"class {q.qclass}"
    if not (1 <= q.qtype < 128 or q.qtype == _ANY or 256 <= q.qtype < 0xFF00) or q.qtype == _OPT:
        return f"type {q.qtype}"  # meta types: zone transfers, TSIG, OPT; private use
    for label in q.labels:
        if not _NAME_CHARS.issuperset(label):
            return "a name with characters other than letters, digits, '-' and '_'"
    return None


def _question(q: Query) -> bytes:
    return b"".join(bytes((len(x),)) + x for x in q.labels) + b"\x00" + struct.pack(">HH", q.qtype, q.qclass)


def encode_query(q: Query) -> bytes:
    """The query rebuilt from its parts: what goes to the resolver."""
    head = _HEADER.pack(q.id, q.flags & _KEPT_FLAGS, 1, 0, 0, 1 if q.edns else 0)
    if q.edns is None:
        return head + _question(q)
    payload, do = q.edns
    opt = b"\x00" + _FIXED.pack(_OPT, max(512, min(payload, MAX_REPLY)), _DO if do else 0, 0)
    return head + _question(q) + opt


def for_upstream(q: Query, upstream_id: int, *, tcp: bool) -> Query:
    """The query as sent upstream: a fresh id; over TCP, the largest reply a UDP answer may be."""
    edns = (MAX_REPLY, q.edns[1]) if tcp and q.edns else q.edns
    return replace(q, id=upstream_id, edns=edns)


def answer(q: Query, rcode: int) -> bytes:
    """The forwarder's own answer with `rcode` and no records (REFUSED, SERVFAIL)."""
    flags = _QR | q.flags & _KEPT_FLAGS | 0x0080 | rcode  # RA: a resolver answers
    return _HEADER.pack(q.id, flags, 1, 0, 0, 0) + _question(q)


def check_reply(data: bytes, sent: Query) -> None:
    """Raise Malformed unless `data` answers `sent` (its id and question) and is whole."""
    if len(data) < _HEADER.size:
        raise Malformed("shorter than a header")
    if len(data) > MAX_REPLY:
        raise Malformed(f"reply over {MAX_REPLY} bytes")
    qid, flags, qd, an, ns, ar = _HEADER.unpack_from(data)
    if qid != sent.id or not flags & _QR or flags & _OPCODE:
        raise Malformed("not a response to this query")
    if qd != 1:
        raise Malformed(f"{qd} questions in the reply")
    labels, pos = _name(data, _HEADER.size)
    if pos + 4 > len(data):
        raise Malformed("question runs past the end")
    got = Query(qid, 0, labels, *struct.unpack_from(">HH", data, pos))
    if got.key != sent.key:
        raise Malformed("reply to another question")
    pos += 4
    if an + ns + ar > (len(data) - pos) // 11:
        raise Malformed("more records than the message can hold")
    for _ in range(an + ns + ar):
        pos = _skip_name(data, pos)
        if pos + _FIXED.size > len(data):
            raise Malformed("record runs past the end")
        pos += _FIXED.size + _FIXED.unpack_from(data, pos)[3]
        if pos > len(data):
            raise Malformed("record data runs past the end")
    if pos != len(data):
        raise Malformed(f"{len(data) - pos} bytes after the message")


def with_id(data: bytes, qid: int) -> bytes:
    """A checked reply given back under the client's own id."""
    return struct.pack(">H", qid) + data[2:]
