"""The documents the fleet writes to its checkpoint store, signed, and what a host accepts of them.

Whoever can write the store could otherwise steer every host: a checkpoint's `manifest.json` names
the files a host downloads and resumes from, and `succeeded.json` makes a host answer a request
without training it. So each is written as an envelope, signed with the fleet's event key
(schemas/signing.py, `event_signing_key_file`) and verified with the keys a host trusts on events
(`event_keys`: the verify keys and its own), before anything in it is used:

    {"adapterd_store": 1, "kind": "manifest", "request_id": "r1", "step": 5,
     "document": "<the document's JSON text>", "signature": "ed25519:<key id>:<base64>"}

An envelope in the object rather than a signature in a sidecar object: the manifest stays the one
object written last, so a checkpoint is whole or not by one write (a sidecar would be a second
commit point, with a window where one is there without the other), and a host reads one object,
not two. The signature covers what the document is for, not only its bytes: the kind, the request
id and the step, as the reader expects them from where it read it (`binding`), then the document's
exact text; so a genuine manifest of another request or step, or a genuine succeeded.json copied
to another request, does not verify. The fields beside `document` are for people reading the store.

A manifest's file names are paths inside its checkpoint's folder (`safe_name`), and its size, its
files' count and their listed bytes are bounded, so a store cannot make a host write anywhere else
or fill its disk. What fails any of this is `Untrusted`, with a reason from a closed set; `skipped`
logs (`checkpoint_store.untrusted`) and counts it (`adapterd_checkpoint_store_untrusted_total`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from daemon.ops.metrics import STORE_UNTRUSTED
from schemas.common import AdapterdError
from schemas.signing import SIGNATURE_HEADER, EventKeys, EventSigner, UnverifiedEvent

log = structlog.get_logger()

Kind = Literal["manifest", "succeeded"]
Reason = Literal[
    "unsigned", "unknown_key", "bad_signature", "malformed", "misplaced", "unsafe_name", "link", "too_large"
]

FORMAT = 1
MAX_DOCUMENT_BYTES = (
    4 * 2**20
)  # a manifest of MAX_FILES files is about 1.5 MB; a succeeded event under 1 MB (max_message_bytes)
MAX_FILES = 10_000  # a sharded full fine-tune's checkpoint has a few hundred; the trainer writes nothing near this
MAX_NAME_CHARS = 1024
MAX_NAME_DEPTH = 16


class Untrusted(AdapterdError):
    """A document or file of the store that is not the fleet's, or not safe to use: skipped, never acted on."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: Reason = reason


@dataclass(frozen=True)
class StoreSigning:
    """The fleet's key that signs what this host writes, and the keys whose signatures it trusts."""

    signer: EventSigner
    keys: EventKeys


def binding(kind: Kind, request_id: str, step: int | None) -> bytes:
    """What a signature is for, signed before the document's text."""
    return f"adapterd-store/{FORMAT}\n{kind}\n{request_id}\n{'' if step is None else step}\n".encode()


def seal(signing: StoreSigning, kind: Kind, request_id: str, step: int | None, document: dict[str, Any]) -> bytes:
    """The envelope of `document`, signed for `kind` of `request_id` at `step`: the object's bytes."""
    text = json.dumps(document, indent=2)
    signature = signing.signer.sign(binding(kind, request_id, step) + text.encode())
    return json.dumps(
        {
            "adapterd_store": FORMAT,
            "kind": kind,
            "request_id": request_id,
            "step": step,
            "document": text,
            "signature": signature.decode(),
        },
        indent=2,
    ).encode()


def unseal(keys: EventKeys, kind: Kind, request_id: str, step: int | None, raw: bytes) -> dict[str, Any]:
    """The document of an envelope read as `kind` of `request_id` at `step`, once its signature
    verifies for exactly that; an Untrusted says why not."""
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise Untrusted("too_large", f"{len(raw)} bytes or more, over {MAX_DOCUMENT_BYTES}")
    try:
        envelope = json.loads(raw)
    except ValueError as exc:
        raise Untrusted("malformed", f"not JSON: {exc}") from None
    if not isinstance(envelope, dict) or "signature" not in envelope:
        raise Untrusted("unsigned", "not a signed envelope (written before the store was signed, or by someone else)")
    text, signature = envelope.get("document"), envelope.get("signature")
    if envelope.get("adapterd_store") != FORMAT or not isinstance(text, str) or not isinstance(signature, str):
        raise Untrusted("malformed", "an envelope without its format, document text or signature")
    if (envelope.get("kind"), envelope.get("request_id"), envelope.get("step")) != (kind, request_id, step):
        raise Untrusted(
            "misplaced",
            f"signed for {envelope.get('kind')} of {envelope.get('request_id')!r} at step {envelope.get('step')}, "
            f"read as {kind} of {request_id!r} at step {step}",
        )
    try:
        keys.verify(binding(kind, request_id, step) + text.encode(), [(SIGNATURE_HEADER, signature.encode())])
    except UnverifiedEvent as exc:
        raise Untrusted(exc.reason, str(exc)) from None
    try:
        document = json.loads(text)
    except ValueError:
        raise Untrusted(
            "malformed", "its document is not JSON"
        ) from None  # signed so by a fleet's host: a bug, still not used
    if not isinstance(document, dict):
        raise Untrusted("malformed", "its document is not an object")
    return document


def safe_name(name: object) -> str:
    """`name` when it is a relative path inside a checkpoint's folder: '/'-separated segments, none
    empty, '.' or '..', no backslash or control character, not too long or deep; else Untrusted."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
        raise Untrusted("unsafe_name", f"not a file name: {str(name)[:80]!r}")
    segments = name.split("/")
    if (
        name.startswith("/")
        or len(segments) > MAX_NAME_DEPTH
        or any(segment in ("", ".", "..") for segment in segments)
    ):
        raise Untrusted("unsafe_name", f"not a relative path inside the checkpoint: {name[:80]!r}")
    if "\\" in name or any(ord(char) < 32 or ord(char) == 127 for char in name):
        raise Untrusted("unsafe_name", f"a backslash or control character in {name[:80]!r}")
    return name


def listed_files(document: dict[str, Any], max_bytes: int) -> dict[str, tuple[int, str]]:
    """A manifest's files (name → size, sha256), each name safe and the sizes within `max_bytes`
    together; an Untrusted says why not."""
    files = document.get("files")
    if not isinstance(files, dict):
        raise Untrusted("malformed", "a manifest without its files")
    if len(files) > MAX_FILES:
        raise Untrusted("too_large", f"{len(files)} files, over {MAX_FILES}")
    listed: dict[str, tuple[int, str]] = {}
    for name, entry in files.items():
        size, digest = (
            entry.get("size") if isinstance(entry, dict) else None,
            entry.get("sha256") if isinstance(entry, dict) else None,
        )
        if (
            not isinstance(size, int)
            or isinstance(size, bool)
            or size < 0
            or not isinstance(digest, str)
            or len(digest) != 64
        ):
            raise Untrusted("malformed", f"{str(name)[:80]!r}: no size and sha256")
        listed[safe_name(name)] = (size, digest)
    folders = {"/".join(name.split("/")[:depth]) for name in listed for depth in range(1, name.count("/") + 1)}
    if clash := folders & set(listed):  # a name that is another's folder: the download could not write both
        raise Untrusted("unsafe_name", f"{sorted(clash)[0][:80]!r} is a listed file and another's folder")
    total = sum(size for size, _ in listed.values())
    if total > max_bytes:
        raise Untrusted("too_large", f"{total} bytes listed, over checkpoint_store_max_bytes {max_bytes}")
    return listed


def skipped(error: Untrusted, kind: Kind, request_id: str, step: int | None, url: str) -> None:
    """Say and count a document or file of the store that was not used."""
    STORE_UNTRUSTED.labels(error.reason).inc()
    log.warning(
        "checkpoint_store.untrusted",
        kind=kind,
        request_id=request_id,
        step=step,
        reason=error.reason,
        url=url,
        error=str(error),
    )
