"""Fair shares of the DNS forwarder's work between its clients: pure logic, no I/O, stdlib only.

A client is a source address. In the run's router each sample has one of its own (its slot's
/30), which its processes cannot change: they hold no capability, so they can neither add an
address nor send from one their namespace does not have. What one client gets:
- a rate: a token bucket of RATE queries a second and BURST at once. A query beyond it is
  dropped unread, UDP or TCP, REFUSED ones included (a query the forwarder answers itself costs
  it as much as one it passes on). The kernel drops datagrams beyond the same rate before they
  reach the forwarder's socket (service.admission_rules): a socket one sample fills loses every
  other sample's datagrams, whatever the forwarder does with what it reads;
- a queue of at most QUEUE datagrams read but not yet handled; a full queue drops its oldest.
  The forwarder reads its socket empty into the queues, then handles them round robin, one
  datagram of each client per turn: a burst of others waits behind the client's, not in front;
- upstream, at most INFLIGHT_EACH queries at a time, and INFLIGHT for all clients together,
  which bounds what the forwarder asks of the resolver behind it. When every upstream slot is
  taken, a client with fewer queries upstream than the heaviest client takes the heaviest one's
  oldest slot (that query ends unanswered; UDP clients retry): a slow or silent upstream (names
  under a zone that never answers) held by many flooding clients delays nobody else. TCP
  connections are shared the same way (`heavier`, in forward.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping
from typing import Generic, TypeVar

RATE, BURST = 200.0, 100  # queries a second per client, and at once: a lookup is two (A and AAAA)
QUEUE = 64  # datagrams of one client read and not handled yet
INFLIGHT, INFLIGHT_EACH = 1024, 64  # queries upstream in all, and of one client
IDLE = 30.0  # seconds after which a client with nothing queued or upstream is forgotten

Item = TypeVar("Item")


def heavier(loads: Mapping[Hashable, int], client: Hashable) -> Hashable | None:
    """When every slot of a resource is taken: the client `client` takes one from, the one holding
    the most if that is at least two more than `client` holds (one passed over leaves no pair
    that would pass it back), else None."""
    if not loads:
        return None
    top = max(loads, key=loads.__getitem__)
    return top if loads[top] >= loads.get(client, 0) + 2 else None


class _Client(Generic[Item]):
    __slots__ = ("tokens", "stamp", "queue", "upstream")

    def __init__(self, now: float, burst: float) -> None:
        self.tokens, self.stamp = burst, now
        self.queue: deque[Item] = deque()
        self.upstream: dict[Hashable, None] = {}  # keys of its queries upstream, oldest first


class FairShare(Generic[Item]):
    """Per-client rates, queues and upstream slots (module doc); `now` is a monotonic clock."""

    def __init__(self, *, rate: float = RATE, burst: int = BURST, queue: int = QUEUE,
                 inflight: int = INFLIGHT, inflight_each: int = INFLIGHT_EACH) -> None:
        self.rate, self.burst, self.queue = rate, float(burst), queue
        self.inflight, self.inflight_each = inflight, inflight_each
        self.clients: dict[Hashable, _Client[Item]] = {}
        self.ring: deque[Hashable] = deque()  # clients with something queued, in turn
        self.total = 0  # queries upstream

    def _client(self, client: Hashable, now: float) -> _Client[Item]:
        state = self.clients.get(client)
        if state is None:
            state = self.clients[client] = _Client(now, self.burst)
        return state

    def admit(self, client: Hashable, now: float) -> bool:
        """Take one query's token from the client's bucket; False: over its rate, drop the query."""
        state = self._client(client, now)
        state.tokens = min(self.burst, state.tokens + (now - state.stamp) * self.rate)
        state.stamp = now
        if state.tokens < 1.0:
            return False
        state.tokens -= 1.0
        return True

    def put(self, client: Hashable, item: Item, now: float) -> Item | None:
        """Queue an admitted datagram; the client's oldest one when its queue was full (dropped)."""
        state = self._client(client, now)
        dropped = state.queue.popleft() if len(state.queue) >= self.queue else None
        if not state.queue:
            self.ring.append(client)
        state.queue.append(item)
        return dropped

    def take(self) -> tuple[Hashable, Item] | None:
        """The next queued datagram, round robin between clients; None when none is queued."""
        if not self.ring:
            return None
        client = self.ring.popleft()
        state = self.clients[client]
        item = state.queue.popleft()
        if state.queue:
            self.ring.append(client)  # its next one after every other client's
        return client, item

    def slot(self, client: Hashable) -> tuple[bool, Hashable | None]:
        """Whether a query of `client` may go upstream now, and the key of the query to end first
        to free the slot it takes (the heaviest client's oldest), or None."""
        state = self.clients[client]
        if len(state.upstream) >= self.inflight_each:
            return False, None
        if self.total < self.inflight:
            return True, None
        top = heavier({c: len(s.upstream) for c, s in self.clients.items()}, client)
        return (False, None) if top is None else (True, next(iter(self.clients[top].upstream)))

    def sent(self, client: Hashable, key: Hashable) -> None:
        """A query of `client` went upstream as `key`."""
        self.clients[client].upstream[key] = None
        self.total += 1

    def done(self, client: Hashable, key: Hashable) -> None:
        """The query `key` of `client` ended (answered, timed out or its slot taken)."""
        del self.clients[client].upstream[key]
        self.total -= 1

    def forget_idle(self, now: float) -> None:
        """Drop the state of clients with nothing queued or upstream and a full bucket again."""
        idle = [c for c, s in self.clients.items()
                if not s.queue and not s.upstream and now - s.stamp >= max(IDLE, self.burst / self.rate)]
        for client in idle:
            del self.clients[client]
