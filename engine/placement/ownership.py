"""Who owns a job: an ownership YAML maps Slurm accounts, Kubernetes namespaces or labels to a team.

::

    default_channel: "#gpu-alerts"          # where a job with no known owner is reported
    owners:
      - project: llm
        team: pretraining
        channel: "#llm-pretrain"
        match:                              # every key given must match; a list matches any of its globs
          slurm_account: [llm, "llm-*"]
      - project: vision
        team: vision
        channel: "#vision"
        match:
          namespace: "vision-*"
          labels: {team: vision}

The first owner whose ``match`` fits wins.  A job nobody matches goes to
``default_channel`` with team ``no owner known`` and its account or namespace as the
project, so the alert still reaches someone and says why it is not the team's channel.

:class:`OwnershipFile` re-reads the file when it changes (checked at most once a
second): the watcher and the engine never restart for an ownership change, and a broken
edit keeps the last good rules and says why (file:line) once.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from whywait.engine.placement.model import Owner, PlacementError

from whywait import yamlio
from whywait.errors import YamlError
from whywait.textfiles import read_text

log = logging.getLogger("whywait.placement")

NO_OWNER_TEAM = "no owner known"
_TOP = {"default_channel", "owners"}
_OWNER = {"project", "team", "channel", "match"}
_MATCH = {"slurm_account", "namespace", "labels", "user"}


@dataclass(frozen=True)
class OwnerRule:
    """One ``owners`` entry: the owner and what a job must show to be theirs."""

    owner: Owner
    accounts: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def matches(self, account: str | None, namespace: str | None, labels: Mapping[str, str],
                user: str | None) -> bool:
        def any_glob(value: str | None, globs: tuple[str, ...]) -> bool:
            return value is not None and any(fnmatch.fnmatchcase(value, g) for g in globs)

        return ((not self.accounts or any_glob(account, self.accounts))
                and (not self.namespaces or any_glob(namespace, self.namespaces))
                and (not self.users or any_glob(user, self.users))
                and all(any_glob(labels.get(k), v) for k, v in self.labels.items()))


@dataclass(frozen=True)
class Ownership:
    """The parsed file: rules in order and the default channel."""

    rules: tuple[OwnerRule, ...] = ()
    default_channel: str | None = None

    def resolve(self, account: str | None = None, namespace: str | None = None,
                labels: Mapping[str, str] | None = None, user: str | None = None) -> Owner:
        """The owner of a job with these facts; the default owner (``known=False``) when no rule fits."""
        for r in self.rules:
            if r.matches(account, namespace, labels or {}, user):
                return r.owner
        return Owner(account or namespace or "unknown", NO_OWNER_TEAM, self.default_channel, known=False)


def _globs(v: Any) -> tuple[str, ...] | None:
    if isinstance(v, str) and v:
        return (v,)
    if isinstance(v, list) and v and all(isinstance(x, str) and x for x in v):
        return tuple(v)
    return None


def parse_ownership(text: str, source: str) -> Ownership:
    """Parse an ownership YAML; every problem is reported together with its ``file:line``."""
    try:
        doc = yamlio.loads(text, source)
    except YamlError as exc:
        raise PlacementError(str(exc)) from None
    data, lines = doc.data, yamlio.dotted(doc.lines)
    problems: list[str] = []

    def bad(key: str, what: str) -> None:
        probe = key
        while probe and probe not in lines:
            probe = probe.rsplit(".", 1)[0] if "." in probe else (probe.rsplit("[", 1)[0] if "[" in probe else "")
        problems.append(f"{source}:{lines.get(probe, 1)}: {key}: {what}")

    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PlacementError(f"{source}:1: expected a mapping with 'owners' and 'default_channel' "
                             f"(got {type(data).__name__})")
    for k in data:
        if k not in _TOP:
            bad(str(k), f"unknown key (valid: {', '.join(sorted(_TOP))})")
    default = data.get("default_channel")
    if default is not None and not (isinstance(default, str) and default.startswith("#")):
        bad("default_channel", f"expected a Slack channel such as '#gpu-alerts' (got {default!r})")
        default = None
    owners = data.get("owners") or []
    if not isinstance(owners, list):
        bad("owners", f"expected a list (got {type(owners).__name__})")
        owners = []
    rules: list[OwnerRule] = []
    for i, o in enumerate(owners):
        key = f"owners[{i}]"
        if not isinstance(o, dict):
            bad(key, f"expected a mapping (got {o!r})")
            continue
        for k in o:
            if k not in _OWNER:
                bad(f"{key}.{k}", f"unknown key (valid: {', '.join(sorted(_OWNER))})")
        ok = True
        for k in ("project", "team"):
            if not (isinstance(o.get(k), str) and o[k]):
                bad(f"{key}.{k}", f"expected a non-empty string (got {o.get(k)!r})")
                ok = False
        channel = o.get("channel")
        if channel is not None and not (isinstance(channel, str) and channel.startswith("#")):
            bad(f"{key}.channel", f"expected a Slack channel such as '#ml-infra' (got {channel!r})")
            ok = False
        match = o.get("match")
        if not isinstance(match, dict) or not match:
            bad(f"{key}.match", "expected a mapping with at least one of "
                                f"{', '.join(sorted(_MATCH))} (got {match!r})")
            continue
        fields: dict[str, Any] = {}
        for k, v in match.items():
            if k not in _MATCH:
                bad(f"{key}.match.{k}", f"unknown key (valid: {', '.join(sorted(_MATCH))})")
                ok = False
            elif k == "labels":
                if not isinstance(v, dict) or not v or any(_globs(x) is None for x in v.values()):
                    bad(f"{key}.match.labels", f"expected label: glob pairs (got {v!r})")
                    ok = False
                else:
                    fields["labels"] = {str(lk): _globs(lv) for lk, lv in v.items()}
            elif _globs(v) is None:
                bad(f"{key}.match.{k}", f"expected a glob or a list of globs (got {v!r})")
                ok = False
            else:
                fields[{"slurm_account": "accounts", "namespace": "namespaces", "user": "users"}[k]] = _globs(v)
        if ok:
            rules.append(OwnerRule(Owner(o["project"], o["team"], channel), **fields))
    if problems:
        problems.sort(key=lambda text: int(text[len(source) + 1:].split(":", 1)[0]))  # in file order
        raise PlacementError(f"{len(problems)} problem(s) in {source}:\n  " + "\n  ".join(problems)
                             if len(problems) > 1 else problems[0])
    return Ownership(tuple(rules), default)


class OwnershipFile:
    """An ownership YAML that is re-read when it changes; :meth:`current` is what to resolve with.

    A missing path (None) means no rules: every job gets the default owner, with
    ``default_channel`` from the constructor.
    """

    def __init__(self, path: str | os.PathLike[str] | None, default_channel: str | None = None,
                 check_every_s: float = 1.0, clock: Any = time.monotonic) -> None:
        self.path = Path(path) if path is not None else None
        self.check_every_s = check_every_s
        self.clock = clock
        self._checked = -float("inf")
        self._stamp: tuple[float, int] | None = None
        self._data = Ownership((), default_channel)
        self.last_error: str | None = None
        self.reloads = 0
        if self.path is not None:
            self._data = parse_ownership(self._read(), str(self.path))  # a bad file at start is an error
            self._stamp = self._stat()

    def _read(self) -> str:
        assert self.path is not None
        return read_text(self.path, PlacementError)

    def _stat(self) -> tuple[float, int] | None:
        try:
            st = self.path.stat()  # type: ignore[union-attr]
            return (st.st_mtime, st.st_size)
        except OSError:
            return None

    def current(self) -> Ownership:
        """The rules now in force, reloading the file first when it changed since the last look."""
        if self.path is None:
            return self._data
        now = self.clock()
        if now - self._checked < self.check_every_s:
            return self._data
        self._checked = now
        stamp = self._stat()
        if stamp == self._stamp:
            return self._data
        self._stamp = stamp
        try:
            self._data = parse_ownership(self._read(), str(self.path))
            self.reloads += 1
            self.last_error = None
            log.info("ownership: reloaded %s (%d rule(s))", self.path, len(self._data.rules))
        except PlacementError as exc:
            if str(exc) != self.last_error:
                log.error("ownership: keeping the previous rules: %s", exc)
            self.last_error = str(exc)
        return self._data

    def resolve(self, **facts: Any) -> Owner:
        """Shortcut for ``current().resolve(...)``."""
        return self.current().resolve(**facts)
