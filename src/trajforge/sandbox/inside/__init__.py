"""What runs in a sample's view: the helper that serves its file operations and spawns its commands.

Nothing here holds a privilege or a handle of the host (the sandbox package's invariant); every
module is stdlib only, since the helper runs as one assembled script (helper.source).
"""
