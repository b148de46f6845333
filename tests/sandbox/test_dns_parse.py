"""The DNS forwarder's wire format (sandbox/dns/parse.py): what may go to the host's resolver.

Pure functions, no event loop: well-formed queries are rebuilt from their parts, everything else
(HTTP, random bytes, other opcodes and sections, compression in a query, trailing bytes, oversize)
is refused; replies are checked against the question asked, compression pointer loops included.
"""

from __future__ import annotations

import random
import struct

import pytest

from trajforge.sandbox.dns import parse as wire
from trajforge.sandbox.dns.parse import Malformed


def header(qid: int = 0x1234, flags: int = 0x0100, qd: int = 1, an: int = 0, ns: int = 0, ar: int = 0) -> bytes:
    return struct.pack(">HHHHHH", qid, flags, qd, an, ns, ar)


def name(*labels: bytes) -> bytes:
    return b"".join(bytes((len(x),)) + x for x in labels) + b"\x00"


def opt(payload: int = 1232, ttl: int = 0, options: bytes = b"") -> bytes:
    return b"\x00" + struct.pack(">HHIH", 41, payload, ttl, len(options)) + options


def query(*labels: bytes, qtype: int = 1, qclass: int = 1, edns: bytes | None = None, flags: int = 0x0100) -> bytes:
    labels = labels or (b"example", b"com")
    return header(flags=flags, ar=1 if edns is not None else 0) + name(*labels) + struct.pack(">HH", qtype, qclass) \
        + (edns or b"")


COOKIE = struct.pack(">HH", 10, 8) + b"\x01\x02\x03\x04\x05\x06\x07\x08"  # an EDNS client cookie


def test_a_query_is_rebuilt_from_its_parts_with_only_what_a_resolver_needs() -> None:
    plain = query()
    assert wire.encode_query(wire.parse_query(plain)) == plain
    # EDNS: payload size and DO kept; the options (a cookie here: opaque bytes) and the Z bits dropped;
    # header bits a query has no use for (AA, TC, RA, Z, rcode) cleared; RD, AD, CD kept.
    sent = query(b"WwW", b"Example", b"com", edns=opt(1232, 0x8000 | 0x1234, COOKIE), flags=0x0100 | 0x0400 | 0x0200
                 | 0x0080 | 0x0040 | 0x0020 | 0x0010 | 0x0003)
    q = wire.parse_query(sent)
    assert (q.labels, q.qtype, q.qclass, q.edns) == ((b"WwW", b"Example", b"com"), 1, 1, (1232, True))
    rebuilt = wire.encode_query(q)
    assert rebuilt == header(flags=0x0100 | 0x0020 | 0x0010, ar=1) + name(b"WwW", b"Example", b"com") \
        + struct.pack(">HH", 1, 1) + opt(1232, 0x8000)
    assert COOKIE not in rebuilt
    # the payload size asked upstream stays in [512, MAX_REPLY]
    assert wire.parse_query(wire.encode_query(wire.parse_query(query(edns=opt(100))))).edns == (512, False)
    assert wire.parse_query(wire.encode_query(wire.parse_query(query(edns=opt(65000))))).edns == (wire.MAX_REPLY, False)
    # upstream: a fresh id; for a TCP client the largest EDNS size (it has no UDP limit)
    up = wire.for_upstream(q, 7, tcp=True)
    assert (up.id, up.edns, up.labels) == (7, (wire.MAX_REPLY, True), q.labels)
    assert wire.for_upstream(wire.parse_query(plain), 7, tcp=True).edns is None  # no OPT the client did not send


HTTP = b"GET / HTTP/1.0\r\nHost: 10.0.2.3\r\n\r\n"


@pytest.mark.parametrize(("data", "why"), [
    (b"", "shorter"),
    (header(), "shorter"),
    (HTTP, "opcode"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40), None),  # a TLS ClientHello
    (b"SSH-2.0-OpenSSH_9.6\r\n", None),
    (query(flags=0x8180), "response"),
    (query(flags=0x0100 | 1 << 11), "opcode 1"),  # IQUERY
    (query(flags=0x0100 | 2 << 11), "opcode 2"),  # STATUS
    (query(flags=0x0100 | 4 << 11), "opcode 4"),  # NOTIFY
    (query(flags=0x0100 | 5 << 11), "opcode 5"),  # UPDATE
    (header(qd=0) + bytes(5), "sections"),
    (header(qd=2) + name(b"a") + b"\x00\x01\x00\x01" + name(b"b") + b"\x00\x01\x00\x01", "sections"),
    (header(an=1) + name(b"a") + b"\x00\x01\x00\x01", "sections"),
    (header(ns=1) + name(b"a") + b"\x00\x01\x00\x01", "sections"),
    (header(ar=2) + name(b"a") + b"\x00\x01\x00\x01" + opt() + opt(), "sections"),
    # a TSIG (type 250) where only OPT may be: another carrier of bytes
    (header(ar=1) + name(b"a") + b"\x00\x01\x00\x01" + name(b"k") + struct.pack(">HHIH", 250, 255, 0, 4) + b"abcd",
     "not an OPT"),
    (header(ar=1) + name(b"a") + b"\x00\x01\x00\x01" + b"\x00" + struct.pack(">HHIH", 1, 1, 0, 0), "not an OPT"),
    (header() + b"\xc0\x0c\x00\x01\x00\x01", "compression"),  # a pointer to itself
    (header() + b"\x01a\xc0\x0c\x00\x01\x00\x01", "compression"),  # back to its own start: a loop
    (header() + b"\x41a\x00\x00\x01\x00\x01", "compression or extended"),  # label type 01
    (header() + b"\x81a\x00\x00\x01\x00\x01", "compression or extended"),  # label type 10
    (header() + b"\x3fabcdefgh", "label runs past the end"),
    (header() + b"\x03abc\x05abcde", "name runs past the end"),
    (header() + name(b"abcde"), "question runs past"),
    (header() + name(b"abcde") + b"\x00\x01\x00", "question runs past"),
    (header() + name(*[b"x" * 63] * 4) + b"\x00\x01\x00\x01", "255"),
    (query() + b"\x00", "1 bytes after"),
    (query() + HTTP, "bytes after"),
    (query(edns=opt()) + b"trailing", "bytes after"),
    (query(edns=opt(options=struct.pack(">HH", 10, 200) + b"x")), "option runs past"),
    (query(edns=opt(options=b"\x00\x0a\x00")), "option header"),
    (query(edns=b"\x00" + struct.pack(">HHIH", 41, 1232, 0, 50)), "OPT data runs past"),
    (query(edns=opt(ttl=1 << 16)), "version 1"),
    (query(b"a" * 63, edns=opt(options=struct.pack(">HH", 12, 5000) + bytes(5000))), "over 4096"),
])
def test_what_is_not_a_standard_query_is_malformed(data: bytes, why: str | None) -> None:
    with pytest.raises(Malformed, match=why):
        wire.parse_query(data)


def test_random_payloads_and_every_truncation_of_a_query_are_refused() -> None:
    rng = random.Random(53)
    for size in (1, 2, 11, 12, 17, 30, 100, 512, 1500, 4096, 5000):
        for _ in range(200):
            with pytest.raises(Malformed):
                wire.parse_query(rng.randbytes(size))
    whole = query(b"www", b"example", b"org", edns=opt(options=COOKIE))
    for cut in range(len(whole)):
        with pytest.raises(Malformed):
            wire.parse_query(whole[:cut])


@pytest.mark.parametrize(("data", "refused"), [
    (query(), None),
    (query(b"_ldap", b"_tcp", b"xn--bcher-kva", b"example", qtype=33), None),
    (query(qtype=255), None),  # ANY
    (query(qtype=257), None),  # CAA
    (query(qtype=28, edns=opt()), None),
    (query(qclass=3, qtype=16), "class 3"),  # CH TXT version.bind: the resolver's own details
    (query(qclass=255), "class 255"),
    (query(qtype=252), "type 252"),  # AXFR
    (query(qtype=251), "type 251"),  # IXFR
    (query(qtype=41), "type 41"),  # OPT
    (query(qtype=0), "type 0"),
    (query(qtype=0xFF01), "type 65281"),
    (query(b"GET / HTTP", b"com"), "characters"),
    (query(b"a\x00b", b"com"), "characters"),
    (query(b"a.b", b"com"), "characters"),
    (query("bücher".encode(), b"com"), "characters"),
])
def test_the_queries_samples_may_ask(data: bytes, refused: str | None) -> None:
    why = wire.refusal(wire.parse_query(data))
    assert (why is None) if refused is None else (why is not None and refused in why), why


def reply_to(q: wire.Query, records: bytes = b"", count: int = 0, flags: int = 0x8180, qd: int = 1) -> bytes:
    return header(q.id, flags, qd, count) + name(*q.labels) + struct.pack(">HH", q.qtype, q.qclass) + records


def a_record(owner: bytes = b"\xc0\x0c", rdata: bytes = b"\xcb\x00\x71\x4d") -> bytes:
    return owner + struct.pack(">HHIH", 1, 1, 60, len(rdata)) + rdata


def test_a_reply_must_answer_the_question_asked_and_be_whole() -> None:
    q = wire.for_upstream(wire.parse_query(query(b"www", b"example", b"com")), 0x4242, tcp=False)
    good = reply_to(q, a_record() + b"\x03web\xc0\x0c" + struct.pack(">HHIH", 5, 1, 60, 2) + b"\xc0\x2d", 2)
    wire.check_reply(good, q)
    wire.check_reply(good.replace(b"example", b"EXAMPLE"), q)  # 0x20: names compare without case
    wire.check_reply(wire.answer(q, wire.REFUSED), q)
    assert wire.with_id(good, 0x0101)[:2] == b"\x01\x01" and wire.with_id(good, 0x0101)[2:] == good[2:]
    bad = {
        "another id": header(0x4243, 0x8180, 1) + good[12:],
        "a query": header(0x4242, 0x0100, 1) + good[12:],
        "another opcode": header(0x4242, 0x8180 | 4 << 11, 1) + good[12:],
        "no question": header(0x4242, 0x8180, 0, 0),
        "another question": reply_to(wire.for_upstream(wire.parse_query(query(b"evil", b"com")), 0x4242, tcp=False)),
        "another type": reply_to(wire.Query(0x4242, 0, q.labels, 28, 1)),
        "pointer to itself": reply_to(q, a_record(b"\xc0\x21"), 1),
        "forward pointer": reply_to(q, a_record(b"\xc0\x30"), 1),
        "pointer into the header": reply_to(q, a_record(b"\xc0\x02"), 1),
        "pointer loop": reply_to(q, b"\x01a\xc0\x21" + struct.pack(">HHIH", 1, 1, 0, 0), 1),
        "record past the end": reply_to(q, a_record()[:-1], 1),
        "fixed part past the end": reply_to(q, b"\xc0\x0c\x00\x01", 1),
        "more records than bytes": reply_to(q, a_record(), 2000),
        "trailing bytes": good + b"\x00",
        "oversize": reply_to(q, a_record(rdata=bytes(wire.MAX_REPLY)), 1),
        "a header only": good[:12],
    }
    for what, data in bad.items():
        with pytest.raises(Malformed):
            wire.check_reply(data, q)
        assert what  # (named for the reader)


def test_the_forwarder_s_own_answers_echo_the_question() -> None:
    q = wire.parse_query(query(b"a", qclass=3))
    data = wire.answer(q, wire.REFUSED)
    qid, flags, qd, an, ns, ar = struct.unpack_from(">HHHHHH", data)
    assert (qid, flags & 0x800F, qd, an, ns, ar) == (q.id, 0x8000 | wire.REFUSED, 1, 0, 0, 0)
    assert data[12:] == name(b"a") + struct.pack(">HH", 1, 3)
