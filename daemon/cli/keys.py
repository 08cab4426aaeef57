"""`adapterd keys FOLDER`: a new key pair for signed events (docs/guarantees.md).

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


def make_key_pair(folder: Path) -> tuple[str, str]:
    """Write the pair into `folder` (made if missing); the key id and the public key, or a UsageError."""
    private, public = new_key_pair()
    folder.mkdir(parents=True, exist_ok=True)
    taken = [name for name in (PRIVATE_NAME, PUBLIC_NAME) if (folder / name).exists()]
    if taken:
        raise UsageError(f"{folder / taken[0]} exists: a key pair is never overwritten (rotate: docs/guarantees.md)")
    descriptor = os.open(folder / PRIVATE_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(private)
    signer = EventSigner.from_file(folder / PRIVATE_NAME)
    (folder / PUBLIC_NAME).write_text(f"# adapterd event key {signer.key_id}\n{public}\n")
    return signer.key_id, public
