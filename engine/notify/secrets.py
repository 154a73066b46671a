"""Secrets (the Slack bot token, the signing secret) from the environment or from files.

``NAME`` holds the value itself; ``NAME_FILE`` names a file holding it (Docker and
Kubernetes secrets).  The value is wrapped in :class:`Secret`, whose ``repr`` and
``str`` never show it, so it cannot end up in a log line or a rendered message by
accident.
"""

from __future__ import annotations

import os
from typing import Mapping

from whywait.engine.errors import ConfigError

from whywait.textfiles import read_text


class Secret:
    """A secret string; ``reveal()`` is the one way to read it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The secret itself, for the one place that needs it (an HTTP header, an HMAC key)."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __bool__(self) -> bool:
        return bool(self._value)


def read_secret(name: str, env: Mapping[str, str] | None = None) -> Secret | None:
    """Return the secret ``name`` from ``env[name]`` or the file ``env[name + "_FILE"]``.

    None when neither is set.  Both set, or an unreadable or empty file, is a
    :class:`ConfigError` naming the variable (never the value).
    """
    env = os.environ if env is None else env
    value = env.get(name) or None
    path = env.get(f"{name}_FILE") or None
    if value and path:
        raise ConfigError(f"set {name} or {name}_FILE, not both")
    if path:
        value = read_text(path, lambda line: ConfigError(f"{name}_FILE: {line}")).strip()
        if not value:
            raise ConfigError(f"{name}_FILE: {path} is empty")
    return Secret(value.strip()) if value else None
