"""`chatloom serve`: bind the port first, then run uvicorn, and stop with one clear line when the
start cannot succeed.

The order matters for a first run: a busy port is reported at once (before the model loads, which
takes seconds to minutes), and a model that fails to load stops the server with a non-zero exit
instead of leaving it answering 503 for ever. Other ways of running the app (`uvicorn --factory`,
tests) keep the lifespan's behaviour: /health says "error" and the process stays up."""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
from typing import Any

# access-log lines of these paths are dropped: load balancers and `docker compose` poll /health
# every few seconds, which buries everything else in the log
QUIET_PATHS = frozenset({"/health"})


class StartupError(Exception):
    """A start that cannot succeed: `message` is the one line printed, `code` the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class QuietPathsFilter(logging.Filter):
    """Drops uvicorn.access records of QUIET_PATHS (its args: client, method, path, version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            return args[2].split("?", 1)[0] not in QUIET_PATHS
        return True


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (listening starts with the server), or StartupError at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # as uvicorn does: a port whose old connections linger in TIME_WAIT can be reused at once;
    # a port another process listens on still fails
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = "already in use" if exc.errno in (98, 48, 10048) else (exc.strerror or str(exc))
        raise StartupError(
            f"cannot listen on {host}:{port}: {reason} (choose another with --port or CHATLOOM_PORT)"
        ) from exc
    return sock


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # alembic lists each plugin it sets up at INFO on every start: noise to a server's reader
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)


def run(settings: Any) -> int:
    """Serve until stopped; StartupError when the port is taken or the model cannot load."""
    sock = bind(settings.host, settings.port)
    try:
        return _serve(settings, sock)
    finally:
        sock.close()


def _serve(settings: Any, sock: socket.socket) -> int:
    import uvicorn
    from sqlalchemy.engine import make_url

    from app.main import create_app

    store = make_url(settings.database_url).render_as_string(hide_password=True)
    print(f"chatloom: conversations in {store}", file=sys.stderr, flush=True)
    configure_logging(settings.log_level)
    app = create_app(settings)
    config = uvicorn.Config(app, log_level=settings.log_level, timeout_graceful_shutdown=5)
    # uvicorn.Config sets up uvicorn's loggers: the filter goes on after it
    logging.getLogger("uvicorn.access").addFilter(QuietPathsFilter())
    server = uvicorn.Server(config)

    def stop_on_load_error() -> None:
        server.should_exit = True

    app.state.on_load_error = stop_on_load_error
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    print(
        f"chatloom: http://{host}:{settings.port} (/health is 503 until the model is loaded)",
        file=sys.stderr,
        flush=True,
    )
    # Ctrl-C: uvicorn shuts down, then re-raises it (uvicorn.run swallows it, Server.run does not)
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])
    if app.state.load_error:
        raise StartupError(f"the model failed to load: {app.state.load_error}")
    return 0
