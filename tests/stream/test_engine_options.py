"""``whywait engine``'s reliability options: one-line errors, and what their defaults mean."""

from __future__ import annotations

import socket

import pytest
from whywait.engine.commands.engine_cmd import instance_id, parse_skew
from whywait.engine.errors import ConfigError


def test_clock_skew_option() -> None:
    assert parse_skew("300") == 300.0 and parse_skew("90s") == 90.0
    assert parse_skew("off") is None and parse_skew("0") is None and parse_skew(None) is None
    for bad in ("-5", "soon", "inf", "nan"):
        with pytest.raises(ConfigError, match="--max-clock-skew"):
            parse_skew(bad)


def test_static_member_id_defaults_to_group_at_host() -> None:
    assert instance_id(None, "whywait-engine") == f"whywait-engine@{socket.gethostname()}"
    assert instance_id("eng-a", "g") == "eng-a" and instance_id("none", "g") is None
