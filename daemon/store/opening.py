"""The host's checkpoint store, opened from the operator's settings with the fleet's signing key: one
rule for every job, the retention sweep and `adapterd doctor`'s store line."""

from __future__ import annotations

import structlog

from daemon.settings import Settings
from daemon.settings.secret_files import event_keys, event_signer
from daemon.store.checkpoints import CheckpointStore, StoreError
from daemon.store.documents import StoreSigning

log = structlog.get_logger()


# The store's keys by the settings that name them: read once per process (a rotated key comes with a restart).
_SIGNING: dict[tuple[object, ...], StoreSigning | None] = {}


def store_signing(settings: Settings) -> StoreSigning | None:
    """The fleet's key that signs what this host writes to the store, and the keys it trusts there
    (those it trusts on events); None without a signing key. Read once per process and key files:
    each job opens the store on the event loop, which reads no file for it."""
    names = (settings.event_signing_key_file, tuple(settings.event_verify_keys), settings.event_verify_keys_file)
    if names not in _SIGNING:
        signer, keys = event_signer(settings), event_keys(settings)
        _SIGNING[names] = None if signer is None or keys is None else StoreSigning(signer, keys)
    return _SIGNING[names]


def store_of(settings: Settings) -> CheckpointStore | None:
    """The host's checkpoint store, None without one (or one fsspec cannot open, or, past the
    settings' own check, no key to sign and verify it by: said, and jobs go on locally)."""
    if settings.checkpoint_store is None:
        return None
    signing = store_signing(settings)
    if signing is None:  # settings refuse this at start; a copy of them made in code is not validated again
        log.warning(
            "checkpoint_store.unsigned", error="checkpoint_store without event_signing_key_file: the store is not used"
        )
        return None
    try:
        return CheckpointStore(
            settings.checkpoint_store,
            settings.dataset_storage_options,
            host=settings.host,
            signing=signing,
            max_bytes=settings.checkpoint_store_max_bytes,
        )
    except StoreError as exc:
        log.warning("checkpoint_store.unusable", error=str(exc))
        return None
