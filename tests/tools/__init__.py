"""tools/: what development builds (the tiny models)."""
