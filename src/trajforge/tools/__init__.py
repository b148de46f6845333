"""Tools the agent can call, grouped into toolsets (the toolsets are declared in trajforge.catalog)."""
