"""What the commands say of the topics: `adapterd topics` of what it found and did (daemon/kafka/admin/topics.py
`make_topics`), one line a finding, and `adapterd doctor` of each topic's partitions against the settings.

What doctor compares against: `topic_partitions`, the partitions the operator wants (the default of `adapterd
topics --partitions`, so what was asked is what is checked); a topic with fewer fails. Unset, only the fleet's
queue (the requests, class and claims topics) is compared, with this host's own slots, a lower bound of the
fleet's: one partition is read by one host at a time, so a queue with fewer partitions than the fleet has slots
leaves slots idle; fewer is a warning, since the fleet's size is not known here.

The state topic (the table of requests) is checked apart (`table_verdict`): compacted, and with at least the events
topic's partitions, else the daemons keep no table.
"""

from __future__ import annotations

from daemon.kafka.admin.topics import COMPACTED, GROWTH, TopicsMade
from daemon.settings import Settings


def report(made: TopicsMade) -> tuple[list[str], bool]:
    """The lines to print and whether the command failed: a topic refused, or one with fewer
    partitions than asked and not grown."""
    lines = [f"adapterd: topic {name} was not created: {reason}" for name, reason in made.refused.items()]
    lines += [
        f"adapterd: topic {name} has {have} partition(s), fewer than the {want} asked; not changed"
        for name, (have, want) in made.short.items()
    ]
    if made.short:
        lines.append(f"adapterd: --grow adds them; {GROWTH}")
    lines += [f"created {name} ({count} partitions)" for name, count in made.created.items()]
    lines += [f"grew {name} from {had} to {now} partitions" for name, (had, now) in made.grown.items()]
    if made.grown:
        lines.append(f"grown: {GROWTH}")
    lines += [f"exists {name} ({count} partitions)" for name, count in made.existing.items()]
    failed = bool(made.refused or made.short)
    if not failed:
        lines.append("topics ready: " + ", ".join([*made.created, *made.grown, *made.existing]))
    return lines, failed


def topics_verdict(
    settings: Settings, names: list[str], partitions: dict[str, int], slots: int
) -> tuple[bool, str, bool]:
    """The doctor's topics check: (ok, detail, warn) for `names` described as `partitions` (a missing one absent)."""
    missing = [name for name in names if name not in partitions]
    if missing:
        return False, f"missing: {', '.join(missing)}; create them (adapterd topics --partitions N)", False
    found = ", ".join(f"{name} ({partitions[name]} partitions)" for name in names)
    if settings.topic_partitions is not None:
        short = [name for name in names if partitions[name] < settings.topic_partitions]
        if short:
            return (
                False,
                (
                    f"fewer partitions than topic_partitions ({settings.topic_partitions}): "
                    + ", ".join(f"{name} ({partitions[name]})" for name in short)
                    + f"; adapterd topics --grow adds them ({GROWTH})"
                ),
                False,
            )
        return True, f"{found}; at least topic_partitions ({settings.topic_partitions}) each", False
    queues = [
        settings.requests_topic,
        *settings.class_topics.values(),
        *([settings.claims_topic] if settings.class_topics else []),
    ]
    short = [name for name in dict.fromkeys(queues) if partitions[name] < slots]
    if short:
        return (
            True,
            (
                f"fewer partitions than this host's {slots} slot(s), so fewer than the fleet's: "
                + ", ".join(f"{name} ({partitions[name]})" for name in short)
                + "; set topic_partitions to the fleet's slots and run adapterd topics --grow"
            ),
            True,
        )
    return True, f"{found}; partitions not compared with the fleet's slots (set topic_partitions)", False


def table_verdict(settings: Settings, partitions: dict[str, int], config: dict[str, str]) -> tuple[bool, str]:
    """The doctor's table check: (ok, detail) for the state topic of `partitions` (absent: missing) and `config`."""
    state, events = settings.state_topic, settings.events_topic
    if state not in partitions:
        return False, f"state_topic {state} is missing: no daemon keeps the table; create it (adapterd topics)"
    policy = config.get("cleanup.policy", "")
    if "compact" not in policy.split(","):
        return (
            False,
            (
                f"state_topic {state} is not compacted (cleanup.policy={policy or 'unknown'}): it would keep every "
                f"entry ever written, or delete current ones; kafka-configs --alter --entity-type topics --entity-name "
                f"{state} --add-config " + ",".join(f"{name}={value}" for name, value in COMPACTED.items())
            ),
        )
    if events in partitions and partitions[state] < partitions[events]:
        return (
            False,
            (
                f"state_topic {state} has {partitions[state]} partition(s), fewer than {events}'s "
                f"{partitions[events]}: no daemon keeps the table; adapterd topics --grow adds them"
            ),
        )
    return True, f"{state} compacted (cleanup.policy={policy}), {partitions[state]} partitions"
