"""``harombe serve``: run the service on uvicorn until SIGINT / SIGTERM.

It binds 127.0.0.1:8000 unless told otherwise (``--host``/``--port``, or ``service.host`` /
``service.port`` in the config, with the library's config file and ``HAROMBE__…`` overrides).
It refuses a non-loopback address unless tokens are configured. On SIGINT or SIGTERM uvicorn
stops taking requests, lets running ones finish, and the app's shutdown removes every sandbox
the service made.
"""

from __future__ import annotations

import argparse
import signal
import sys

import structlog

from harombe.config import HarombeConfig
from harombe.errors import ConfigError
from harombe.security.approval.policy_line import policy_line
from harombe.service.auth import is_loopback

log = structlog.get_logger(__name__)

#: Seconds running requests get to finish after SIGTERM before their connections are closed.
GRACE_S = 60

HELP = """\
Serve harombe over HTTP: the fips sidecar contract (GET /healthz, GET /profile,
POST /execute), the REST API under /v1 (see /docs and /openapi.json), MCP over
streamable HTTP at /mcp, and the approvals page at /approvals.

Binding: 127.0.0.1:8000 by default. Without tokens in service.tokens the service
answers this machine only, and refuses to bind any other address.

Auth: callers send 'Authorization: Bearer <token>'. Configure tokens in the config
file (service.tokens: name plus one of token, sha256 or env; role client or
approver). Deciding approvals needs an approver token or the approval key printed
at start (open the printed /approvals?key=... link).
"""


def check_binding(config: HarombeConfig, host: str) -> None:
    """Refuse to listen beyond this machine without tokens: anyone who can reach the port
    could otherwise run code."""
    if not is_loopback(host) and not config.service.tokens:
        raise ConfigError(
            f"refusing to bind {host}: no tokens are configured, so anyone who reaches this "
            "address could run code; add service.tokens to the config (see harombe serve "
            "--help) or bind 127.0.0.1"
        )


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from harombe.config import load_config
    from harombe.service.app import create_app
    from harombe.service.server import Server
    from harombe.service.state import Service

    config = load_config(args.config)
    host = args.host or config.service.host
    port = config.service.port if args.port is None else args.port
    check_binding(config, host)
    service = Service(config)
    for problem in service.profile_set.problems:  # the others work; say which does not
        disabled = f"profile {problem.profile!r} disabled: " if problem.profile else ""
        print(f"harombe serve: warning: {disabled}{problem.message}", file=sys.stderr)
    app = create_app(service=service)
    shown = f"[{host}]" if ":" in host else host
    service.broker.url = f"http://{shown}:{port}/approvals"
    print(f"harombe serve: http://{shown}:{port}  (API docs: /docs)", file=sys.stderr)
    print(
        f"approvals page: http://{shown}:{port}/approvals?key={service.approval_key}",
        file=sys.stderr,
    )
    print(policy_line(service.gate, "serve"), file=sys.stderr, flush=True)
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again with the handler
    # it found: this one makes that a clean exit (status 0), as a service manager expects.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    settings = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                              timeout_graceful_shutdown=GRACE_S)  # fmt: skip
    Server(
        settings,
        on_shutdown=service.begin_shutdown,
        header_timeout_s=config.service.header_timeout_s,
    ).run()
    return 0


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)
