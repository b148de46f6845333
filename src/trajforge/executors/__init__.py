"""Where samples run: in this process (local) or on a Ray cluster (ray)."""
