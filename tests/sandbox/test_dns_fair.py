"""The DNS forwarder's fair shares (sandbox/dns/fair.py) as plain logic: rates, queues, turns, slots."""

from __future__ import annotations

from trajforge.sandbox.dns.fair import BURST, IDLE, RATE, FairShare, heavier


def test_a_client_gets_its_burst_then_its_rate_and_no_one_else_s() -> None:
    share: FairShare[int] = FairShare()
    assert all(share.admit("a", 0.0) for _ in range(BURST))
    assert not share.admit("a", 0.0)  # over its rate: dropped unread
    assert share.admit("b", 0.0)  # another client's bucket is its own
    assert not share.admit("a", 0.5 / RATE)
    assert share.admit("a", 1.0 / RATE) and not share.admit("a", 1.0 / RATE)
    assert sum(share.admit("a", 10.0) for _ in range(10 * BURST)) == BURST  # refilled to the burst, no more


def test_a_full_queue_drops_its_own_oldest() -> None:
    share: FairShare[int] = FairShare(queue=3)
    assert [share.put("a", i, 0.0) for i in range(5)] == [None, None, None, 0, 1]
    assert share.put("b", 100, 0.0) is None
    assert [share.take() for _ in range(5)] == [("a", 2), ("b", 100), ("a", 3), ("a", 4), None]


def test_queued_datagrams_are_handled_round_robin() -> None:
    """A burst of one client waits behind the others' next datagram, not in front of it."""
    share: FairShare[str] = FairShare()
    for i in range(4):
        share.put("flood", f"f{i}", 0.0)
    share.put("victim", "v0", 0.0)
    assert share.take() == ("flood", "f0")
    share.put("other", "o0", 0.0)
    share.put("victim", "v1", 0.0)
    order = []
    while (turn := share.take()) is not None:
        order.append(turn[1])
    assert order == ["v0", "f1", "o0", "v1", "f2", "f3"]


def test_upstream_slots_per_client_and_in_all() -> None:
    share: FairShare[int] = FairShare(inflight=6, inflight_each=4)
    for client in ("a", "b", "c"):
        share.admit(client, 0.0)
    for key in range(4):
        assert share.slot("a") == (True, None)
        share.sent("a", ("a", key))
    assert share.slot("a") == (False, None)  # its own cap
    for key in range(2):
        assert share.slot("b") == (True, None)
        share.sent("b", ("b", key))
    # Every slot taken: b (2 upstream) is lighter than a (4) by two, so it takes a's oldest slot.
    assert share.slot("b") == (True, ("a", 0))
    share.done("a", ("a", 0))
    share.sent("b", ("b", 2))
    assert share.slot("b") == (False, None)  # now 3 against 3: no slot passed to and fro
    assert share.slot("c") == (True, ("a", 1))  # a newcomer always gets one
    share.done("b", ("b", 0))
    assert share.total == 5 and share.slot("c") == (True, None)  # a slot free again: no one gives one up


def test_the_state_of_idle_clients_is_forgotten() -> None:
    share: FairShare[int] = FairShare()
    share.admit("gone", 0.0)
    share.admit("busy", 0.0)
    share.put("busy", 1, 0.0)
    share.admit("upstream", 0.0)
    share.sent("upstream", 7)
    share.forget_idle(IDLE / 2)
    assert set(share.clients) == {"gone", "busy", "upstream"}
    share.forget_idle(IDLE)
    assert set(share.clients) == {"busy", "upstream"}


def test_a_slot_passes_from_the_heaviest_to_a_client_lighter_by_two() -> None:
    assert heavier({"a": 8, "b": 8, "c": 3}, "new") == "a"
    assert heavier({"a": 8, "b": 8}, "b") is None  # as heavy: keeps what it has
    assert heavier({"a": 8, "b": 7}, "b") is None  # 8 and 7 would become 7 and 8: no passing back and forth
    assert heavier({"a": 8, "b": 6}, "b") == "a"
    assert heavier({}, "x") is None
