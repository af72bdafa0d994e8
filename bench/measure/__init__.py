"""What the runs report: metrics from per-request rows, what a long run watches for growth, and every Markdown writer (report.py, team_report.py, restart_report.py, soak_report.py)."""
