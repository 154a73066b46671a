"""The one duration syntax of whywait: ``250ms``, ``90s``, ``5m``, ``4h``, ``1d``, ``2w`` and sums like ``1h30m``.

Called wherever a duration is read: rule files (``window``, ``for``...), rule tests (``detected: [120s, 2m]``),
notify settings (``WHYWAIT_SLACK_REPEAT_INTERVAL``), ``whywait silence --for``, ``whywait replay --lead``.
The units are Prometheus's (without ``y``), so an operator writes the same thing in both places.
"""

from __future__ import annotations

import math
import re

from whywait.errors import DurationError

#: seconds per unit
UNITS: dict[str, float] = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_WHOLE = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+$")

EXPECTED = "a duration like '60s' (units ms, s, m, h, d, w)"


def parse_duration(value: object, what: str = "", *, bare_seconds: bool = False) -> float:
    """Return the seconds ``value`` stands for; raise :class:`DurationError` naming ``what`` otherwise.

    ``bare_seconds``: accept a plain number (``12``, ``"12"``) as seconds.  Rule files leave it off, so
    ``window: 60`` is refused rather than guessed; environment variables and rule-test offsets turn it on.
    Negative, infinite and NaN durations are always refused.
    """
    expected = EXPECTED + (" or a number of seconds" if bare_seconds else "")
    if isinstance(value, bool):
        raise DurationError(expected, value, what)
    if isinstance(value, (int, float)):
        if bare_seconds and math.isfinite(value) and value >= 0:
            return float(value)
        raise DurationError(expected, value, what)
    if not isinstance(value, str):
        raise DurationError(expected, value, what)
    text = value.strip()
    if bare_seconds and re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    if not _WHOLE.match(text):
        raise DurationError(expected, value, what)
    return sum(float(n) * UNITS[u] for n, u in _PART.findall(text))


def format_duration(seconds: float) -> str:
    """The shortest spelling of ``seconds`` that :func:`parse_duration` reads back (``90`` -> ``1m30s``)."""
    if seconds < 1 and seconds != 0:
        return f"{seconds * 1000:g}ms"
    out = ""
    rest = seconds
    for unit in ("w", "d", "h", "m"):
        n = int(rest // UNITS[unit])
        if n:
            out += f"{n}{unit}"
            rest -= n * UNITS[unit]
    if rest or not out:
        out += f"{rest:g}s"
    return out
