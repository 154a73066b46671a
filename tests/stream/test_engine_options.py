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


@pytest.mark.parametrize("flag,value", [("--align", "-1"), ("--restore-window", "-5"), ("--warmup", "-2"),
                                        ("--partitions", "0")])
def test_a_bad_setting_is_said_before_the_broker_is_asked(tmp_path, capsys, flag: str, value: str) -> None:
    # Both wrong (the broker at port 1 answers nothing): the flag is named, not hidden behind "unreachable".
    from whywait.engine.cli import main
    from whywait.simulate.cluster import make_cluster

    topo = tmp_path / "t.yaml"
    make_cluster(nodes=2).to_yaml(topo)
    assert main(["engine", "--bootstrap", "127.0.0.1:1", "--topology", str(topo), flag, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0] and "127.0.0.1:1" not in err[0], err
