"""The sandbox backends, one package each: local, bwrap, container (factory.BACKENDS)."""
