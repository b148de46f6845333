"""The sandbox backends, one package each, each declared by a spec in trajforge.catalog.sandboxes (SANDBOXES)."""
