"""The container backend: one container per sample, through Podman or the Docker CLI."""
