"""Kafka bootstrap strings (``HOST:PORT[,HOST:PORT...]``), checked before any connection is tried.

Shared by the engine's commands (``whywait.engine.localkafka.broker.check_bootstrap``, as a ``ConfigError``) and
the node agent (``whywait agent --bootstrap``, as an ``AgentConfigError``): a typo in an address is said as such,
not as a broker that does not answer.  Pure: stdlib only, so the agent can use it.
"""

from __future__ import annotations

import re

from whywait.errors import WhywaitError


class BootstrapError(WhywaitError, ValueError):
    """A bootstrap string is malformed; ``str()`` names where it came from and the part that is wrong (exit 2)."""


_HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")
BOOTSTRAP_FORM = "HOST:PORT[,HOST:PORT...], e.g. 127.0.0.1:9092"


def check_bootstrap(value: str, source: str = "--bootstrap") -> str:
    """``value`` checked as Kafka bootstrap servers, ``HOST:PORT[,HOST:PORT...]``; returned with spaces around its
    entries removed.  A malformed one is a :class:`BootstrapError` (exit 2) naming ``source`` (the flag or variable
    it came from) and the part that is wrong, never a broker "unreachable" later.

    HOST is a name or an IPv4 address, or an IPv6 address in brackets (``[::1]:9092``); PORT is 1-65535.
    """
    entries = value.split(",")
    several = len(entries) > 1
    good: list[str] = []
    for i, raw in enumerate(entries, 1):
        server = raw.strip()
        where = f"entry {i} ({server!r})" if several else repr(server)
        if not server:
            raise BootstrapError(f"{source} {value!r}: " + (f"entry {i} is empty" if several else "is empty")
                              + f"; expected {BOOTSTRAP_FORM}")
        host, colon, port = server.rpartition(":")
        if not colon:
            raise BootstrapError(f"{source} {value!r}: {where} has no port; expected {BOOTSTRAP_FORM}")
        wrong = [w for w in (_host_problem(host), _port_problem(port)) if w]
        if wrong:
            raise BootstrapError(f"{source} {value!r}: in {where}, {' and '.join(wrong)}; expected {BOOTSTRAP_FORM}")
        good.append(server)
    return ",".join(good)


def _host_problem(host: str) -> str | None:
    if not host:
        return "the host is missing"
    if host.startswith("[") or host.endswith("]"):
        import ipaddress

        try:
            if not (host.startswith("[") and host.endswith("]")):
                raise ValueError
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return f"the host {host!r} is not an IPv6 address in brackets"
        return None
    if ":" in host:
        return f"the host {host!r} has a ':' (an IPv6 address goes in brackets: [::1]:9092)"
    if not _HOST_NAME.fullmatch(host.removesuffix(".")):  # a trailing dot: a fully qualified name
        bad = sorted({c for c in host if not (c.isascii() and (c.isalnum() or c in "._-"))})
        what = ", ".join("a space" if c == " " else repr(c) for c in bad) if bad else "a '.' or '-' at an end"
        return f"the host {host!r} is not a host name or address (it has {what})"
    return None


def _port_problem(port: str) -> str | None:
    if not port:
        return "the port is missing"
    if not (port.isascii() and port.isdigit()):
        return f"the port {port!r} is not a number"
    if not 1 <= int(port) <= 65535:
        return f"the port {int(port)} is outside 1-65535"
    return None
