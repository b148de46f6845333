"""One prompt in, one trajectory out: the agent loop, argument checks, ShareGPT conversion, stats."""
