"""Signed events (schemas/signing.py): the fleet's signature over an event's exact bytes is taken from
a trusted key, and only from one; an unsigned, forged, altered or foreign-signed event raises
UnverifiedEvent with why; several keys are trusted at once while keys rotate; key files in every
form the settings take; and importing `schemas` loads no `cryptography`."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from schemas import SIGNATURE_HEADER, Accepted, EventKeys, Succeeded, UnverifiedEvent, read_event
from schemas.signing import EventSigner, new_key_pair, public_key_text, public_keys_text, read_private_key
from tests.helpers import event_document

ROOT = Path(__file__).parents[2]


def signer() -> EventSigner:
    return EventSigner(Ed25519PrivateKey.generate())


def trusting(*signers: EventSigner) -> EventKeys:
    return EventKeys.parse(public_key_text(one.public) for one in signers)


def accepted() -> bytes:
    return Accepted(request_id="signed-1", method="sft").model_dump_json().encode()


def test_a_signed_event_is_read_with_the_key_that_signed_it() -> None:
    fleet, value = signer(), accepted()
    headers = [("adapterd-event-type", b"accepted"), (SIGNATURE_HEADER, fleet.sign(value))]
    event = read_event(value, keys=trusting(fleet), headers=headers)
    assert isinstance(event, Accepted) and event.request_id == "signed-1"
    assert trusting(fleet).verify(value, headers) == fleet.key_id
    assert headers[1][1].startswith(f"ed25519:{fleet.key_id}:".encode())


@pytest.mark.parametrize("forge", ["unsigned", "altered", "foreign", "garbled", "twice", "null"])
def test_anything_but_a_trusted_keys_signature_over_those_bytes_is_refused(forge: str) -> None:
    fleet, stranger, value = signer(), signer(), accepted()
    genuine = fleet.sign(value)
    altered = value.replace(b'"sft"', b'"dpo"')
    value_read, headers, reason = {
        "unsigned": (value, [("adapterd-event-type", b"accepted")], "unsigned"),
        "altered": (altered, [(SIGNATURE_HEADER, genuine)], "bad_signature"),  # the fleet's signature, other bytes
        "foreign": (value, [(SIGNATURE_HEADER, stranger.sign(value))], "unknown_key"),
        # A stranger's signature under the fleet's key id: the id only picks the key, the key checks.
        "garbled": (
            value,
            [(SIGNATURE_HEADER, f"ed25519:{fleet.key_id}:".encode() + stranger.sign(value).rsplit(b":", 1)[1])],
            "bad_signature",
        ),
        "twice": (value, [(SIGNATURE_HEADER, b"ed25519:0:AAAA"), (SIGNATURE_HEADER, genuine)], "malformed"),
        "null": (value, [(SIGNATURE_HEADER, None)], "malformed"),
    }[forge]
    with pytest.raises(UnverifiedEvent) as raised:
        read_event(value_read, keys=trusting(fleet), headers=headers)
    assert raised.value.reason == reason


@pytest.mark.parametrize(
    "header",
    [b"", b"ed25519", b"rsa:abc:AAAA", b"ed25519:abc:not base64!", b"ed25519:abc:" + base64.b64encode(b"short")],
)
def test_a_header_that_is_not_a_signature_is_malformed(header: bytes) -> None:
    with pytest.raises(UnverifiedEvent) as raised:
        trusting(signer()).verify(accepted(), [(SIGNATURE_HEADER, header)])
    assert raised.value.reason == "malformed"


def test_without_keys_read_event_reads_as_before() -> None:
    """A consumer that does not verify (yet) reads every event, signed or not."""
    assert isinstance(read_event(accepted()), Accepted)


def test_a_forged_succeeded_is_refused_before_it_is_parsed() -> None:
    """The consumer's case: a `succeeded` written by hand, `published: main`, is never a deployable event."""
    forged = (
        Succeeded.model_validate(event_document("succeeded", request_id="forged", published="main"))
        .model_dump_json()
        .encode()
    )
    with pytest.raises(UnverifiedEvent):
        read_event(forged, keys=trusting(signer()), headers=[])


def test_while_keys_rotate_both_are_trusted_and_the_old_one_is_dropped_after() -> None:
    """Rotation (docs/guarantees.md): readers trust old and new, hosts move to the new, readers drop the old."""
    old, new, value = signer(), signer(), accepted()
    during, after = trusting(old, new), trusting(new)
    assert during.verify(value, [(SIGNATURE_HEADER, old.sign(value))]) == old.key_id
    assert during.verify(value, [(SIGNATURE_HEADER, new.sign(value))]) == new.key_id
    assert after.verify(value, [(SIGNATURE_HEADER, new.sign(value))]) == new.key_id
    with pytest.raises(UnverifiedEvent) as raised:
        after.verify(value, [(SIGNATURE_HEADER, old.sign(value))])
    assert raised.value.reason == "unknown_key"


def test_private_keys_are_read_as_pem_raw_bytes_or_base64(tmp_path: Path) -> None:
    pem, public = new_key_pair()
    key = read_private_key(pem)
    raw = key.private_bytes_raw()
    for data in (pem, raw, base64.b64encode(raw) + b"\n"):
        assert public_key_text(read_private_key(data).public_key()) == public
    for bad in (b"", b"x" * 31, b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"):
        with pytest.raises(ValueError):
            read_private_key(bad)


def test_public_keys_are_read_as_base64_or_pem_one_a_line_with_comments() -> None:
    first, second = Ed25519PrivateKey.generate().public_key(), Ed25519PrivateKey.generate().public_key()
    pem = second.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()
    text = f"# the old key, until Friday\n{public_key_text(first)}\n\n# the new one\n{pem}"
    keys = EventKeys.parse(public_keys_text(text))
    assert len(keys) == 2
    with pytest.raises(ValueError, match="key 2: not an Ed25519 public key"):
        EventKeys.parse([public_key_text(first), "bm90IGEga2V5"])


def test_importing_schemas_loads_no_cryptography() -> None:
    """A producer pays for cryptography only when it reads a key: schemas imports it lazily."""
    code = "import sys, schemas, schemas.signing; print('cryptography' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "False"
