"""Isolated per-sample environments: the Sandbox protocol and its backends.

The invariant every backend keeps, and the tests check from inside the helper
(tests/sandbox/test_isolation.py, tests/sandbox/test_hermetic.py):

1. No process that runs in a sample's view or handles its files holds a privilege or a handle of
   the host. The helper that serves a sample's file operations and spawns its commands, every
   command, and a container's file helper have real, effective and saved uid and gid equal to
   the sample's, no supplementary group, empty permitted, effective, inheritable, ambient and
   bounding capability sets, no_new_privs, and no descriptor of a host namespace, a host
   directory or another sample. What needs root (namespaces, mounts, cgroups, loop devices,
   veth links) is done by the zygote and by a sandbox's first process before any sample exists
   in it; neither ever runs code or reads a path that a sample can write. The egress DNS
   forwarder (dns/), which reads samples' packets, runs as an id of its own on the same terms.
2. An interpreter in a sample's view loads no code after its start: it imports everything first
   and seals the import system (guard.py), and a row's cwd never covers the runtime or the
   system (cwd_policy.py).
3. No state is shared between samples: every pid, network, IPC, UTS, cgroup and mount namespace,
   /tmp, /dev/shm and workspace is made for one sample and destroyed after it (sandbox_pool.py makes
   them ahead of time, in the background).

`local` is the exception by name: no isolation at all (docs/sandboxes.md says what it hides).
"""
