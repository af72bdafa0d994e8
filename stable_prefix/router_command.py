"""The `stable-prefix router smg|haproxy|vllm-router --replica URL ...` command: a router before a team's engines.

Starts the router the user picked (the pinned install, `make routers`) with our key header, the key
policy and the retry settings (`stable_prefix/routers.py` owns them), and runs it until Ctrl-C; `--print` shows
its config file and command line instead, to run it elsewhere (a router on another machine, a service
manager). Each developer's proxy (`stable-prefix up --upstream http://ROUTER:PORT`) sends the key.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from stable_prefix import routers
from stable_prefix.servers import LOOPBACK, exit_description

DEFAULT_PORT = 8090
POLL_S = 0.5


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stable-prefix router", description="Run (or print) a router before several engines.")
    parser.add_argument("kind", choices=routers.ROUTER_KINDS)
    parser.add_argument("--replica", dest="replicas", action="append", default=[], metavar="URL", required=True,
                        help="an engine's base URL, e.g. http://10.0.0.2:8000 (repeat for each)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the router's port (default {DEFAULT_PORT})")
    parser.add_argument("--host", default=LOOPBACK, help=f"the address it listens on (default {LOOPBACK}; 0.0.0.0 for a team's LAN)")
    parser.add_argument("--policy", choices=routers.POLICIES, default="key",
                        help="key: our key header on a consistent-hash ring (default); round_robin; prefix: the router's own cache-aware policy")
    parser.add_argument("--key-header", help="the header holding the proxy's key (default: the one the router reads, x-smg-routing-key; "
                                             "vllm-router: x-session-id)")
    parser.add_argument("--hash-balance-factor", type=int, default=None, metavar="PERCENT",
                        help="HAProxy, policy key: bounded-load consistent hashing, no replica above PERCENT of the average load "
                             "(HAProxy's hash-balance-factor, e.g. 150; default: unbounded)")
    parser.add_argument("--health-interval", type=float, default=1.0, metavar="SECONDS", help="seconds between health checks (default 1)")
    parser.add_argument("--metrics-port", type=int, help="smg's and vllm-router's Prometheus port (default theirs, 29000)")
    parser.add_argument("--log-dir", type=Path, default=Path("build/router-logs"), help="its log (and HAProxy's config file)")
    parser.add_argument("--print", dest="print_only", action="store_true", help="print the config and command line; start nothing")
    return parser


def main(argv: list[str]) -> int:
    args = argument_parser().parse_args(argv)
    try:
        config = routers.router_config(args.kind, args.replicas, port=args.port, policy=args.policy, key_header=args.key_header,
                                       health_interval_s=args.health_interval, host=args.host, metrics_port=args.metrics_port,
                                       balance_factor=args.hash_balance_factor)
    except ValueError as error:
        print(f"stable-prefix router: {error}", file=sys.stderr)
        return 2
    if args.print_only:
        print(config.printed(), end="")
        return 0
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        with routers.running_router(args.kind, args.replicas, policy=args.policy, key_header=args.key_header, log_dir=args.log_dir,
                                    health_interval_s=args.health_interval, port=args.port, host=args.host,
                                    metrics_port=args.metrics_port, balance_factor=args.hash_balance_factor) as router:
            print(f"stable-prefix router: {args.kind} on {args.host}:{args.port} before {', '.join(args.replicas)} "
                  f"(policy {args.policy}{f', key header {config.key_header}' if config.key_header else ''}); log {router.log_path}. "
                  "Ctrl-C stops it.", flush=True)
            while router.process.poll() is None:
                time.sleep(POLL_S)
            print(f"stable-prefix router: {args.kind} {exit_description(router.process.returncode)}; log {router.log_path}", file=sys.stderr)
            return 1
    except routers.RouterNotInstalled as error:
        print(f"stable-prefix router: {error}", file=sys.stderr)
        return 2
    except (RuntimeError, TimeoutError) as error:
        print(f"stable-prefix router: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\nstable-prefix router: stopped {args.kind}.", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop_on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt  # a service manager's stop: the router is stopped as on Ctrl-C
