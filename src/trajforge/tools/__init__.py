"""Tools the agent can call, grouped into toolsets, and the distributions that sample toolsets."""
