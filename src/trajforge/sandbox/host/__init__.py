"""The privileged side of the sandboxes: the zygote, namespaces, mounts, cgroups, disks, the router.

Run by the runner and by the zygote, outside every sample's reach; what runs in a sandbox before
its sample does (sandbox_init.py) drops every privilege before the sample's first request.
"""
