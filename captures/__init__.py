"""Captured Claude Code requests and the CLI that compares them.

    python -m stable_prefix.captures diff A.json B.json [--normalized] [--json]
    python -m stable_prefix.captures report DIR [--json] [--html FILE]

Inputs are records written by `addons/capture.py` or raw request bodies.
Prompt order, normalization and the diagnosis come from `addons/`, the same
code the proxy runs.
"""
