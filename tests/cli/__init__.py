"""The stable-prefix command as a user runs it (up, the agent launchers, doctor), the installed wheel, what ships."""
