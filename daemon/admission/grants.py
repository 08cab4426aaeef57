"""Whether a request may be what it says it is: the team it names, and the priority class it runs as.

A request's `team` and `priority_class` are fields a producer writes; Kafka does not tell a consumer who
wrote a record. So the operator binds each team to keys (`teams.<name>.producer_keys`, or
`producer_keys_file`) and, optionally, to the classes it may use (`teams.<name>.classes`). Once any team
has a key (bound mode), every request must carry an `adapterd-producer-signature` by a key of the team it
names (no team: `default`), over exactly the record's value, whose JSON names the team and class the key
vouches for; a team the operator does not list, or a class it is not granted, is refused. Without any
key (open mode) nothing is checked: teams and classes are claims, and the start-up log and
`adapterd doctor` say so.

A pure decision (`Grants.refusal`), made where a request is admitted: intake, for the requests topic
and the claims topic (daemon/intake.py), and the fleet's dispatcher at a queue's head, before the
request is ordered as its team and class (daemon/fleet/dispatcher.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

from daemon.settings.fleet import TeamShare, team_of
from daemon.settings.secret_files import team_keys
from schemas import FieldError, Rejection, RequestBase
from schemas.signing import PRODUCER_SIGNATURE_HEADER, EventKeys, UnverifiedEvent

Headers = Iterable[tuple[str, bytes | None]] | None


@dataclass(frozen=True)
class Grants:
    """The operator's binding of teams to keys and classes, read once from the settings."""

    keys: Mapping[str, EventKeys]  # team → the keys that may write as it (empty: none may)
    classes: Mapping[str, frozenset[str] | None]  # team → the classes it may use (None: every class)

    @classmethod
    def from_settings(cls, teams: Mapping[str, TeamShare]) -> Grants:
        """The grants of `teams` (settings already validated: each class known); a
        ValueError names a key that is wrong."""
        classes = {name: None if team.classes is None else frozenset(team.classes) for name, team in teams.items()}
        return cls({name: team_keys(name, team) for name, team in teams.items()}, classes)

    @cached_property
    def bound(self) -> bool:
        """Whether teams are bound to keys: any team has one (asked of every record intake reads: once)."""
        return any(len(keys) for keys in self.keys.values())

    def describe(self) -> str:
        """What the binding is, for the start-up log and `adapterd doctor`."""
        if not self.bound:
            return (
                "open: a request's team and priority_class are claims, not checked: any producer may name any team and "
                "class (bind them: teams.<name>.producer_keys, deploy/README.md)"
            )
        teams = ", ".join(
            f"{team} ({len(keys)} key(s), classes "
            f"{'all' if self.classes.get(team) is None else ', '.join(sorted(self.classes[team] or ())) or 'none'})"
            for team, keys in sorted(self.keys.items())
        )
        return (
            f"bound: each request must be signed ({PRODUCER_SIGNATURE_HEADER}) by a key of the team it names: {teams}"
        )

    def owner(self, key_id: str) -> str | None:
        """The team a key belongs to (for the rejection's message), None when it is none's."""
        return next((team for team, keys in self.keys.items() if key_id in keys.by_id), None)

    def refusal(
        self, request: RequestBase, value: bytes | None, headers: Headers, priority_class: str | None
    ) -> Rejection | None:
        """Why `request` (decoded from `value`, with the record's `headers`) may not run as its team, in
        `priority_class` (the class it runs as: what it names, or its topic's, or the default); None when it may,
        and always None in open mode."""
        if not self.bound:
            return None
        team = team_of(request.team)
        keys = self.keys.get(team)
        if keys is None:
            known = ", ".join(sorted(self.keys))
            return _refused(request, "team", f"unknown team {team!r}: the operator's teams are {known}")
        try:
            keys.verify(value or b"", headers, PRODUCER_SIGNATURE_HEADER)
        except UnverifiedEvent as exc:
            return _refused(request, "team", f"not signed by a key of team {team!r}: {self._why(exc, headers)}")
        granted = self.classes.get(team)
        if priority_class and granted is not None and priority_class not in granted:
            allowed = ", ".join(sorted(granted)) or "none"
            return _refused(
                request, "priority_class", f"team {team!r} may not use class {priority_class!r}; its classes: {allowed}"
            )
        return None

    def _why(self, exc: UnverifiedEvent, headers: Headers) -> str:
        """What was wrong with the signature, in words a producer can act on; the key's own team when it has one."""
        if exc.reason == "unsigned":
            return f"the record has no {PRODUCER_SIGNATURE_HEADER} header"
        if exc.reason == "unknown_key":
            signed = next((text for name, text in headers or () if name == PRODUCER_SIGNATURE_HEADER), b"") or b""
            key = signed.split(b":")[1].decode("ascii", errors="replace")[:32] if signed.count(b":") >= 2 else "?"
            owner = self.owner(key)
            return f"signed by key {key}, " + (f"a key of team {owner!r}" if owner else "which is no team's key")
        if exc.reason == "bad_signature":
            return (
                "the signature does not match the record's bytes (signed before they were changed, or with another key)"
            )
        return f"a malformed {PRODUCER_SIGNATURE_HEADER}: {exc}"


def _refused(request: RequestBase, path: str, message: str) -> Rejection:
    return Rejection("policy", [FieldError(path=path, message=message)], request.request_id)
