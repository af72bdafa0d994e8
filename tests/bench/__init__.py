"""bench/: the session, the replay and its clients, the metrics and reports, the commands at their smallest."""
