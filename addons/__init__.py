"""mitmproxy addons between coding agents (Claude Code, Codex CLI, ...) and a self-hosted model server.

Scripts (load with `mitmdump -s addons/<name>.py`):
  strip_billing.py    the proxy: its list of one-concern addons, below (`proxy_addons()`)
  capture.py          records every API request for `python -m stable_prefix.captures`
  session_page.py     serves the capture session's page, live, on the proxy's /stable-prefix/session
  toolcall_stream.py  turns tool calls written as text into real tool calls
  json_mode_guard.py  keeps strict json_schema requests from stalling the server

The proxy's addons, in the order their hooks run (each declares the options it reads):
  forward_proxy.py    ForwardProxy: Anthropic's hosts answered by the engine (anthropic_engine)
  normalizer.py       Normalizer: the rules and the server's needs over each API request
  routing_key.py      RoutingKey: the lane's key in a header, for routers (lane_routing_header)
  prefix_diagnosis.py DiagnosePrefix: the one prefix diagnosis per request, in the log and flow.comment
  streaming.py        StreamEventStreams: server-sent events streamed, never buffered
  response_chains.py  FollowResponseChains: the history a server holds behind a Responses previous_response_id
  llama_slots.py      LlamaSlots: llama.cpp's slot lanes (llama_slots)
  stream_recovery.py  StreamRecovery: a broken-off chat stream completed (stream_recovery, stall_timeout)
  engine_errors.py    EngineErrors: the protocol's error when the engine fails (answer_engine_failures)
  exposure.py         ExposureWarning: the warning when the proxy listens beyond loopback (expose_proxy)

What they share (plain modules, imported as `stable_prefix.addons.<name>`):
  rules/           what is volatile in a request: one module per rule, listed in rules.RULES
  normalize.py     which rules run, in their order, then server_compat.py and router_compat.py
  request_shape.py where each API keeps system text, conversation and tools
  prompt_order.py  the bytes of a request in the order the model reads them
  lanes.py         which requests belong together (main, sub-agents, side), and their routing key
  diagnosis.py     per-lane comparison: stable prefix, first divergence, cause
  request_body.py  which flows are ours; reading and writing their JSON bodies (body I/O only)
  flow_notes.py    what the addons leave on a flow (flow.metadata, the client's headers, flow.comment)
  client_writes.py the one seam over mitmproxy's Http1Server.send: recovery, then error answers
  responses_input.py  the Responses API's input items (what Codex CLI sends)
  sse_events.py    server-sent events cut out of a chunked stream
"""
