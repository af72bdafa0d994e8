"""The real agent CLIs end to end: each through the proxy to the patched engine, offline, on the tiny model."""
