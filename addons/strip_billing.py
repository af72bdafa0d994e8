"""Keep Claude Code's prompt prefix stable on its way to a self-hosted model.

    mitmdump -s addons/strip_billing.py --mode reverse:http://127.0.0.1:8000 --listen-host 127.0.0.1 -p 8080 \\
        --set upstream_model=<served model name> --set max_tokens_cap=8192

For `POST /v1/messages`, `POST /v1/chat/completions` and `POST /v1/responses`
it applies the rules (`rules/`, one module each: billing header out, git
status, initial and conversation context moved behind the tools, turn
reminders pinned, system and developer messages rewritten, loaded tools
inlined) and what the server needs (`server_compat.py`: model name mapped,
max_tokens capped; `router_compat.py`), through `normalize.py`, and puts a one-line prefix diagnosis per
request into the log and into `flow.comment` (marking the flow when the prefix
broke). The diagnosis is made once the request has left, when the upstream
answers (or fails), so it costs the request no latency: the engine is busy
prefilling by then. Anthropic's own hosts, other paths, and bodies it cannot read go
through byte for byte; as a forward proxy with `anthropic_engine` set, Anthropic's
hosts are answered by the engine instead (`forward_proxy.py`). Server-sent events are streamed, not buffered. When the
engine cannot be reached or breaks off a stream, the client gets an error in
its protocol's shape (`engine_errors.py`), unless the stream is a chat
completion, which the proxy completes (`stream_recovery.py`, its own addon in
this script). For the Responses API it follows each
answer as it passes (its id and output items), so that a later request
continuing it (`previous_response_id`) is diagnosed with the history the server
puts in front of it (`response_chains.py`).

The proxy is the list at the end (`addons`), one concern per addon, in the
order mitmproxy runs their hooks (its own `default_addons()` is such a list):
- `ForwardProxy` (`forward_proxy.py`): Anthropic's hosts answered by the engine
  when `anthropic_engine` is set;
- `Normalizer` (`normalizer.py`): the rules and the server's needs, each its option;
- `RoutingKey` (`routing_key.py`): the lane's key in `lane_routing_header`;
- `DiagnosePrefix` (`prefix_diagnosis.py`): the one diagnosis per request,
  made when the upstream answers, into the log and `flow.comment`;
- `StreamEventStreams` (`streaming.py`): server-sent events streamed, never buffered;
- `FollowResponseChains` (`response_chains.py`): the Responses histories the diagnosis reads;
- `LlamaSlots` (`llama_slots.py`): llama.cpp's slot lanes (off unless `llama_slots`);
- `StreamRecovery` (`stream_recovery.py`): broken-off chat streams completed;
- `EngineErrors` (`engine_errors.py`): the protocol's error when the engine fails;
- `ExposureWarning` (`exposure.py`): the warning when the proxy listens beyond loopback.

Conventions for the addons in this folder:
- `mitmdump -s addons/x.py` loads a file as a script; it imports its siblings
  as `stable_prefix.addons.*` (the same modules tests import), which `make
  setup` installs into the venv (editable). Addons with dataclasses live in
  those modules, not in a script (mitmproxy does not register a script in
  sys.modules, where dataclasses look).
- Hooks are small; the logic lives in plain functions tested directly.
- Each addon declares the options it reads in `load()` and parses them in
  `configure()`; a bad value raises OptionsError naming the option and the
  value. A rule's option is written in its record (`rules/`).
- What the addons learned about a flow is in `flow.metadata["stable_prefix"]`
  (`flow_notes.py`); `capture.py` reads it. Notes for the user go to the log
  and into `flow.comment`.
"""

from __future__ import annotations

from stable_prefix.addons.engine_errors import EngineErrors
from stable_prefix.addons.exposure import ExposureWarning
from stable_prefix.addons.forward_proxy import ForwardProxy
from stable_prefix.addons.llama_slots import LlamaSlots
from stable_prefix.addons.normalizer import Normalizer
from stable_prefix.addons.prefix_diagnosis import DiagnosePrefix
from stable_prefix.addons.response_chains import FollowResponseChains, ResponseChains
from stable_prefix.addons.routing_key import RoutingKey
from stable_prefix.addons.stream_recovery import StreamRecovery
from stable_prefix.addons.streaming import StreamEventStreams


def proxy_addons() -> list:
    """The proxy's addons, in the order their hooks run: the forward proxy answers before anything reads the
    request; the routing key and the diagnosis read what the normalizer made; the diagnosis runs before the
    Responses chains follow what it diagnosed; the slot lanes pin the normalized body; the stream recovery
    follows the streams turned on before it. (What goes out on a failure is ordered in `client_writes.py`.)"""
    chains = ResponseChains()
    return [ForwardProxy(), Normalizer(), RoutingKey(), DiagnosePrefix(chains), StreamEventStreams(), FollowResponseChains(chains),
            LlamaSlots(), StreamRecovery(), EngineErrors(), ExposureWarning()]


addons = proxy_addons()
