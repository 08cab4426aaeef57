"""`adapterd keys FOLDER`: a new key pair for signed events (docs/guarantees.md), or with `--team` for a team's
producers, whose signature binds a request to the team it names (deploy/README.md, "Priority classes and teams").

The private key goes to every host that publishes events (its `event_signing_key_file`, handed over
as a systemd credential); the public key to everyone who reads them (`event_verify_keys`, and the
consumers). The private key is written readable by its owner alone, and neither file is ever
overwritten: a key pair in use is replaced by rotation, not by accident.
"""

from __future__ import annotations

import os
from pathlib import Path

from daemon.errors import UsageError
from schemas.signing import EventSigner, new_key_pair

PRIVATE_NAME = "event-signing-key.pem"
PUBLIC_NAME = "event-verify-key.pub"


def team_names(team: str) -> tuple[str, str]:
    """The files of a team's producer key pair (`adapterd keys --team`): `<team>-producer-key.pem` and `.pub`."""
    return f"{team}-producer-key.pem", f"{team}-producer-key.pub"


def make_key_pair(folder: Path, team: str | None = None) -> tuple[str, str]:
    """Write the pair into `folder` (made if missing): the fleet's event keys, or with `team` that team's producer keys
    (its producers' producer_key_file, and the operator's teams.<team>.producer_keys); the key id and the public key,
    or a UsageError."""
    private, public = new_key_pair()
    private_name, public_name = team_names(team) if team is not None else (PRIVATE_NAME, PUBLIC_NAME)
    folder.mkdir(parents=True, exist_ok=True)
    taken = [name for name in (private_name, public_name) if (folder / name).exists()]
    if taken:
        raise UsageError(f"{folder / taken[0]} exists: a key pair is never overwritten (rotate: docs/guarantees.md)")
    descriptor = os.open(folder / private_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(private)
    signer = EventSigner.from_file(folder / private_name)
    what = f"team {team} producer" if team is not None else "event"
    (folder / public_name).write_text(f"# adapterd {what} key {signer.key_id}\n{public}\n")
    return signer.key_id, public
