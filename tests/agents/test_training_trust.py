"""The training inbox's trust rules without root: ownership by first reporter, the agent's own node, caps."""

from __future__ import annotations

import json
import os
import socket
import stat

from whywait.agents.agent import TrainingInbox, bind_training_socket, read_datagrams

T0 = 1764442800.0


def step(job: str, rank: int, **kw: object) -> bytes:
    return json.dumps({"v": 1, "type": "step", "job": job, "rank": rank, "time": T0, "step": 1,
                       "duration_s": 1.0, **kw}).encode()


def test_first_sender_owns_the_job_and_others_are_refused() -> None:
    inbox = TrainingInbox("node-07", trusted_uids=frozenset({0}))
    inbox.feed(step("j", 0), uid=1000, pid=11)
    inbox.feed(step("j", 1, node="node-01"), uid=1001, pid=12)  # another user: refused
    inbox.feed(step("j", 2), uid=0, pid=13)  # root: trusted
    inbox.feed(step("k", 0), uid=1001, pid=12)  # its own job: fine
    assert inbox.rejected == 1 and inbox.pids == {11, 13, 12}
    msgs = {m["job"]: m for m in inbox.take_steps(T0 + 1)}
    assert [s["rank"] for s in msgs["j"]["steps"]] == [0, 2]
    assert all(s["node"] == "node-07" for m in msgs.values() for s in m["steps"])  # never the claimed node
    assert msgs["j"]["sender_uid"] == 1000 and msgs["k"]["sender_uid"] == 1001


def test_without_credentials_nothing_is_pinned_and_long_job_names_are_malformed() -> None:
    inbox = TrainingInbox("n", trusted_uids=frozenset())
    inbox.feed(step("j", 0))
    inbox.feed(step("x" * 300, 0), uid=5)
    assert inbox.owners == {} and inbox.malformed == 1


def test_socket_is_group_only_and_passes_credentials(tmp_path: "os.PathLike[str]") -> None:
    path = os.path.join(str(tmp_path), "agent.sock")
    sock = bind_training_socket(path, gid=os.getgid())
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
        inbox = TrainingInbox("n", trusted_uids=frozenset())
        c = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        c.sendto(step("j", 0), path)
        c.close()
        assert read_datagrams(sock, inbox) == 1
        assert inbox.owners["j"][0] == os.getuid() and inbox.pids == {os.getpid()}  # the kernel's word
    finally:
        sock.close()
