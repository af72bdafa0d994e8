"""mitmproxy addons between coding agents (Claude Code, Codex CLI, ...) and a self-hosted model server.

Scripts (load with `mitmdump -s addons/<name>.py`):
  strip_billing.py    keeps the prompt prefix stable and diagnoses it per lane
  capture.py          records every API request for `python -m stable_prefix.captures`
  session_page.py     serves the capture session's page, live, on the proxy's /stable-prefix/session
  toolcall_stream.py  turns tool calls written as text into real tool calls
  json_mode_guard.py  keeps strict json_schema requests from stalling the server

What they share (plain modules, imported as `addons.<name>`):
  rules/           what is volatile in a request: one module per rule, listed in rules.RULES
  normalize.py     which rules run, in their order, then server_compat.py and router_compat.py
  request_shape.py where each API keeps system text, conversation and tools
  prompt_order.py  the bytes of a request in the order the model reads them
  lanes.py         which requests belong together (main, sub-agents, side), and their routing key
  diagnosis.py     per-lane comparison: stable prefix, first divergence, cause
  request_body.py  which flows are ours; reading and writing their JSON bodies
  responses_input.py  the Responses API's input items (what Codex CLI sends)
  response_chains.py  the history a server holds behind a Responses previous_response_id
  sse_events.py    server-sent events cut out of a chunked stream
  exposure.py      the warning when the proxy listens beyond loopback
"""
