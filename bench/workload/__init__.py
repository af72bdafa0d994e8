"""What the benchmarks send: the Claude Code-shaped session, its chat-completions form, the soak's requests, and the token ids an engine prefills for each."""
