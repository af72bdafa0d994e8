"""stable_prefix/agents/: installing each pinned agent and running it in a sandbox."""
