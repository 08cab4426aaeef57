"""The operator's words for the fleet's queue: its priority classes, in order, and each team's share.

With no classes the fleet is what it always was: each requests partition a first-in-first-out queue
read by one host. With classes, the requests topics are one queue per class (`queue_topic`), read by
whichever hosts have room.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from schemas.request_base import DEFAULT_TEAM, QUEUE_NAME_PATTERN


class PriorityClass(BaseModel):
    """One class of requests. Classes are listed highest first; a request of a higher class starts
    before any of a lower one, and may stop a `preemptible` lower one at its checkpoint to take its slot."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=QUEUE_NAME_PATTERN)
    preemptible: bool = Field(
        False, description="Whether a waiting request of a higher class may stop its jobs at a checkpoint."
    )


class TeamShare(BaseModel):
    """One team's share of the fleet's slots under contention, within a class: slot-time follows `weight`;
    a team never holds more than `max_slots` at once; a share left idle is lent to whoever waits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    weight: float = Field(1.0, gt=0, le=1_000_000)
    max_slots: int | None = Field(None, ge=1, le=1_000_000)
    # Who may write as the team (daemon/admission/grants.py): once any team lists keys, every request must be signed
    # by a key of the team it names, and may use only that team's classes.
    producer_keys: list[str] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "Ed25519 public keys (base64 of 32 bytes, or PEM) whose adapterd-producer-signature makes a request this "
            "team's; once any team has keys, requests must be signed by a key of the team they name."
        ),
    )
    producer_keys_file: Path | None = Field(
        None,
        description="A file of such keys, one a line (# comments), e.g. the old and the new one while they rotate.",
    )
    classes: list[str] | None = Field(
        None,
        description=(
            "The priority classes this team's requests may use; unset: every class. Enforced "
            "once any team has producer keys."
        ),
    )


def queue_topic(requests_topic: str, classes: list[PriorityClass], default_class: str, name: str) -> str:
    """The topic a class's requests wait in: the requests topic itself for the default class (producers
    that name no class write there), `<requests_topic>.<class>` for the others."""
    if name not in {c.name for c in classes}:
        raise KeyError(name)
    return requests_topic if name == default_class else f"{requests_topic}.{name}"


# The header a host's dispatcher sets on a request it claims: the class it runs as (daemon/fleet/claimed.py reads it
# for the job, daemon/cli/waiting.py for the listing).
CLASS_HEADER = "adapterd-class"


def queue_group(group_id: str, name: str) -> str:
    """The consumer group of a class's queue: its members are the hosts with room for its requests."""
    return f"{group_id}.queue.{name}"


def team_of(team: str | None) -> str:
    return team or DEFAULT_TEAM
