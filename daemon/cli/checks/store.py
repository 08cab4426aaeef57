"""`adapterd doctor`'s check of the checkpoint store: reachable, writable by this host, and trusted
as far as the fleet signed it. It writes a probe checkpoint under a request id of its own, reads its
manifest back through the same verification a resume goes through, downloads it, and removes it; a
shared folder that others than its owner may write is said (docs/guarantees.md, "Whom to trust")."""

from __future__ import annotations

import os
import stat
import tempfile
import uuid
from pathlib import Path

from daemon.settings import Settings
from daemon.store.checkpoints import StoreError
from daemon.store.download import download
from daemon.store.opening import store_of, store_signing

# What the probe's line says: ok (True, False, or None for nothing to check), what it
# found, and whether it is a warning.
Found = tuple[bool | None, str, bool]


def store_check(settings: Settings) -> Found:
    """The store checked from this host, blocking (the doctor runs it in a thread)."""
    if settings.checkpoint_store is None:
        return None, "none: checkpoints stay on this host's disk (checkpoint_store)", False
    signing = store_signing(settings)
    store = store_of(settings)
    if signing is None or store is None:
        return (
            False,
            f"{settings.checkpoint_store} cannot be used: no event_signing_key_file, or fsspec "
            "cannot open it (the log says which)",
            False,
        )
    probe = f"adapterd-doctor-{uuid.uuid4().hex[:12]}"
    try:
        store.requests()
    except StoreError as exc:
        return False, f"{store.url} does not answer: {exc}", False
    try:
        with tempfile.TemporaryDirectory(prefix="adapterd-doctor-") as folder:
            saved = Path(folder) / "saved"
            saved.mkdir()
            (saved / "probe.txt").write_text(f"written by adapterd doctor on {settings.host}\n")
            try:
                store.upload(probe, saved, 1)
            except StoreError as exc:
                return False, f"{store.url} is not writable by this host: {exc}", False
            read_back = store.complete(probe)
            if [manifest.step for manifest in read_back] != [1]:
                return (
                    False,
                    f"{store.url}: the manifest this host wrote does not verify when read back (the log says why)",
                    False,
                )
            download(store, probe, read_back[0], Path(folder) / "downloaded")
    except StoreError as exc:
        return False, f"{store.url}: the probe checkpoint could not be read back whole: {exc}", False
    finally:
        try:
            store.remove(probe)
        except StoreError:
            pass  # said by the checks above, or left for the store's retention
    found = (
        f"{store.url} reachable and writable; a manifest signed with key {signing.signer.key_id} read back and verified"
    )
    if settings.checkpoint_store.startswith("/"):
        mode = os.stat(settings.checkpoint_store).st_mode
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            return (
                True,
                (
                    f"{found}; but its folder is writable by {'others' if mode & stat.S_IWOTH else 'its group'} "
                    f"(mode {stat.filemode(mode)}): only the fleet's user should write it (chmod 0755 or 0700)"
                ),
                True,
            )
    return True, found, False
