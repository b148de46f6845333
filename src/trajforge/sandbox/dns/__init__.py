"""The samples' DNS forwarder in egress mode: DNS carries DNS only.

A sample's resolver address (slirp's 10.0.2.3) would relay any bytes sent to its port 53 to the
host's resolver. The firewall (host/router.py for bwrap, network.py for containers) redirects
that port to a forwarder instead, which passes on only queries it parsed and rebuilt:
- parse.py: the DNS wire format, pure functions (what may go upstream, what may come back);
- forward.py: the forwarder process, which handles sample input and so holds nothing;
- launch.py: its start as root, in the namespace it serves, up to dropping every privilege;
- service.py: the runner's handle on one forwarder (start, close).
Nothing here imports anything on import: the forwarder's interpreter loads this package alone.
"""
