"""Who may write each of the fleet's topics, as docs/guarantees.md's recipe says ("Whom to trust"), and
the brokers' ACLs judged against it: `adapterd doctor`'s acls line (daemon/cli/checks/doctor.py).

- the requests topic (the default class's queue): upstream producers, and the fleet (retries; with
  priority classes the records it writes again);
- each other class's topic: the fleet (a request naming its class is moved there), and producers only
  where the operator lets them submit to that class directly;
- the claims topic, the events topic and the DLQ: the fleet alone (a claim is run, an event is acted on);
- the state topic (the table of requests): the fleet alone (its keepers; `adapterd jobs` and the fleet's view
  read it, and a tombstone, which no signature covers, removes a request from it);
- the control topic: operators and producers (cancels); the fleet reads it.

adapterd keeps no other topic: a retry's state and a preemption's count travel in signed headers. The fleet's
principal also reads its consumer groups' offsets and joins them: the requests' group, the class topics' queue
groups, and the table keepers' (`<group_id>.table`).
"""

from __future__ import annotations

from dataclasses import dataclass

from daemon.kafka.admin.acls import ANYONE, Writers
from daemon.settings import Settings


@dataclass(frozen=True)
class Rule:
    """One topic of the recipe: whether the fleet writes it, and whom else the recipe lets write it ("": no one)."""

    topic: str
    fleet_writes: bool
    others: str


@dataclass(frozen=True)
class Verdict:
    """A topic's writers against its rule: `ok` False when the fleet may not write what it writes, `warn` when
    someone the recipe keeps off may write it; `text` says who may."""

    ok: bool
    warn: bool
    text: str


def recipe(settings: Settings) -> list[Rule]:
    """The fleet's topics, each with who the recipe lets write it."""
    rules = [Rule(settings.requests_topic, True, "producers")]
    rules += [
        Rule(topic, True, "producers, where they submit to this class directly")
        for topic in settings.class_topics.values()
        if topic != settings.requests_topic
    ]
    rules += [Rule(settings.claims_topic, True, "")] if settings.class_topics else []
    rules += [
        Rule(settings.events_topic, True, ""),
        Rule(settings.dlq_topic, True, ""),
        Rule(settings.state_topic, True, ""),
        Rule(settings.control_topic, False, "operators, producers"),
    ]
    return rules


def verdict(rule: Rule, found: Writers) -> Verdict:
    others = ", ".join(found.others)
    if rule.fleet_writes and not found.may_write:
        return Verdict(
            False,
            False,
            f"{rule.topic}: {found.principal} may not (kafka-acls --add --allow-principal {found.principal} "
            f"--operation Write --topic {rule.topic}); may write it: {others or 'no one listed'}",
        )
    if found.anyone:
        return Verdict(
            True,
            True,
            f"{rule.topic}: anyone ({ANYONE}); the recipe: the fleet"
            + (f" and {rule.others}" if rule.others else " alone"),
        )
    if not rule.others and found.others:
        return Verdict(True, True, f"{rule.topic}: also {others}; the recipe: the fleet alone")
    if not found.others:
        return Verdict(
            True, False, f"{rule.topic}: the fleet alone" if rule.fleet_writes else f"{rule.topic}: no one listed"
        )
    return Verdict(True, False, f"{rule.topic}: {'also ' if rule.fleet_writes else ''}{others}")
