"""Render deploy/haproxy.cfg.template for N chatloom replicas.

    python deploy/render_haproxy.py [--bind ADDR:PORT] [--stats ADDR:PORT] [--docker-dns] \\
        [NAME=]HOST:PORT ...

Each replica is HOST:PORT, optionally named (NAME=HOST:PORT; the default name is the host's, or
replicaN for an IP address). The name is what X-Served-By and HAProxy's stats show, and it seeds the
consistent hash: keep a replica's name when its address changes, or its sessions move.
--docker-dns resolves the replicas' names through Docker's DNS at run time (a restarted container
keeps its name, not its address). Prints the configuration; check it with `haproxy -c -f FILE`."""

from __future__ import annotations

import argparse
import ipaddress
import re
import sys
from pathlib import Path
from string import Template

TEMPLATE = Path(__file__).resolve().parent / "haproxy.cfg.template"
_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")

DOCKER_RESOLVERS = """
# Docker's embedded DNS: replicas are found by service name, again after a restart
resolvers docker
    nameserver dns 127.0.0.11:53
    hold valid 10s
"""


def parse_replica(spec: str, index: int) -> tuple[str, str]:
    """ "[name=]host:port" -> (name, "host:port")."""
    name, sep, address = spec.rpartition("=")
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"replica {spec!r}: expected [NAME=]HOST:PORT")
    if not sep:
        try:
            ipaddress.ip_address(host.strip("[]"))
            name = f"replica{index}"
        except ValueError:
            name = host
    if not _NAME.match(name):
        raise ValueError(f"replica {spec!r}: a name may hold letters, digits and - _ . : only")
    return name, address


def render(
    replicas: list[str], bind: str = "0.0.0.0:8000", stats: str | None = None, docker_dns: bool = False
) -> str:
    if not replicas:
        raise ValueError("name at least one replica")
    parsed = [parse_replica(spec, i) for i, spec in enumerate(replicas, 1)]
    names = [name for name, _ in parsed]
    if len(set(names)) != len(names):
        raise ValueError(f"replica names must differ: {names}")
    # a name that does not resolve yet (a container still starting) leaves its replica down
    dns = " resolvers docker init-addr last,libc,none" if docker_dns else ""
    session_servers = "\n".join(f"    server {name} {address}{dns}" for name, address in parsed)
    spread_servers = "\n".join(
        f"    server {name} {address} track by_session/{name}{dns}" for name, address in parsed
    )
    stats_section = ""
    if stats:
        stats_section = (
            "\n# HAProxy's own page (and ;csv): each replica's state, sessions, retries, redispatches\n"
            "frontend stats\n"
            f"    bind {stats}\n"
            "    http-request set-log-level silent\n"
            "    stats enable\n"
            "    stats uri /stats\n"
            "    stats refresh 5s\n"
        )
    text = Template(TEMPLATE.read_text()).substitute(
        bind=bind,
        resolvers=DOCKER_RESOLVERS if docker_dns else "",
        session_servers=session_servers,
        spread_servers=spread_servers,
        stats=stats_section,
    )
    return text.rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("replicas", nargs="+", metavar="[NAME=]HOST:PORT")
    ap.add_argument("--bind", default="0.0.0.0:8000", help="where HAProxy listens (default 0.0.0.0:8000)")
    ap.add_argument("--stats", help="where HAProxy's stats page listens (default: none)")
    ap.add_argument("--docker-dns", action="store_true", help="resolve replica names through Docker's DNS")
    args = ap.parse_args(argv)
    try:
        sys.stdout.write(render(args.replicas, args.bind, args.stats, args.docker_dns))
    except ValueError as exc:
        ap.error(str(exc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
