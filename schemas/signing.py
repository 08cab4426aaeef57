"""Ed25519 signatures over the events' bytes: proof that the fleet wrote an event.

A daemon with the fleet's private key signs each event's value, the exact bytes it publishes, and
puts the signature in the record's `adapterd-signature` header as `ed25519:<key id>:<signature in
base64>`. The key id (the first 8 bytes of SHA-256 over the raw public key, in hex) names the public
key that checks it, so a reader can trust several keys at once while the fleet moves from one to
the next (docs/guarantees.md, "Rotating the signing key").

A public key is written as the base64 of its 32 raw bytes (what `adapterd keys` prints), or as a
PEM `PUBLIC KEY` block; a private key as a PEM PKCS#8 block, or as its 32 raw bytes (or their
base64).

This is the one module of `schemas` that imports more than pydantic: `cryptography` (OpenSSL's
Ed25519), and only inside the functions that read a key, sign or check, so a producer or a consumer
that never verifies never loads it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from .common import AdapterdError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

SIGNATURE_HEADER = "adapterd-signature"
# A request's signature by its producer's team key (deploy/README.md, "Priority classes and teams"): the same
# format over the record's value, in a header of its own so that it never reads as the fleet's own signature.
PRODUCER_SIGNATURE_HEADER = "adapterd-producer-signature"
_SCHEME = "ed25519"
_RAW_KEY_BYTES = 32

Unverified = Literal["unsigned", "unknown_key", "bad_signature", "malformed"]


class UnverifiedEvent(AdapterdError, ValueError):
    """An event without a valid signature of a trusted key: ignored, never acted on. `reason` is
    `unsigned`, `unknown_key` (signed by a key the reader does not trust), `bad_signature` (the
    bytes are not what the key signed) or `malformed` (a header that is not a signature, or two)."""

    def __init__(self, reason: Unverified, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: Unverified = reason


def _raw_public(public: Ed25519PublicKey) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return public.public_bytes(Encoding.Raw, PublicFormat.Raw)


def key_id(public: Ed25519PublicKey) -> str:
    """The id a signature names its key by: SHA-256 of the raw public key, its first 8 bytes in hex."""
    return hashlib.sha256(_raw_public(public)).hexdigest()[:16]


def public_key_text(public: Ed25519PublicKey) -> str:
    """A public key as `event_verify_keys` and a consumer take it: base64 of its 32 raw bytes."""
    return base64.b64encode(_raw_public(public)).decode()


def _base64_of(size: int, text: str) -> bytes | None:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == size else None


def read_public_key(text: str) -> Ed25519PublicKey:
    """One public key, from base64 of its 32 raw bytes or a PEM block; a ValueError says why not."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    text = text.strip()
    if text.startswith("-----BEGIN"):
        key = load_pem_public_key(text.encode())
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError(f"a PEM {type(key).__name__}, not an Ed25519 public key")
        return key
    raw = _base64_of(_RAW_KEY_BYTES, text)
    if raw is None:
        raise ValueError(f"not an Ed25519 public key (base64 of 32 bytes, or PEM): {text[:60]!r}")
    return Ed25519PublicKey.from_public_bytes(raw)


def read_private_key(data: bytes) -> Ed25519PrivateKey:
    """The private key from a key file's bytes: PEM PKCS#8, its 32 raw bytes, or their base64."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    if data.lstrip().startswith(b"-----BEGIN"):
        key = load_pem_private_key(data, password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"a PEM {type(key).__name__}, not an Ed25519 private key")
        return key
    if len(data) == _RAW_KEY_BYTES:
        return Ed25519PrivateKey.from_private_bytes(data)
    raw = _base64_of(_RAW_KEY_BYTES, data.decode("ascii", errors="replace"))
    if raw is None:
        raise ValueError(f"not an Ed25519 private key (PEM, 32 raw bytes or their base64; {len(data)} bytes)")
    return Ed25519PrivateKey.from_private_bytes(raw)


def public_keys_text(text: str) -> list[str]:
    """The keys of a keys file: one per line (blank lines and `#` comments skipped), or PEM blocks."""
    keys: list[str] = []
    block: list[str] | None = None
    for line in text.splitlines():
        line = line.strip()
        if block is not None:
            block.append(line)
            if line.startswith("-----END"):
                keys.append("\n".join(block))
                block = None
        elif line.startswith("-----BEGIN"):
            block = [line]
        elif line and not line.startswith("#"):
            keys.append(line)
    if block is not None:
        raise ValueError("a PEM block without its END line")
    return keys


class EventSigner:
    """Signs events with the fleet's private key: `sign(value)` is the `adapterd-signature` header."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self.private = private
        self.public = private.public_key()
        self.key_id = key_id(self.public)
        self._prefix = f"{_SCHEME}:{self.key_id}:".encode()

    @classmethod
    def from_file(cls, path: Path) -> EventSigner:
        return cls(read_private_key(path.read_bytes()))

    def sign(self, value: bytes) -> bytes:
        """The header's value for an event whose record value is exactly `value`."""
        return self._prefix + base64.b64encode(self.private.sign(value))


class EventKeys:
    """The public keys a reader trusts, by key id: an event is taken only with a signature of one."""

    def __init__(self, keys: Iterable[Ed25519PublicKey]) -> None:
        self.by_id = {key_id(key): key for key in keys}

    @classmethod
    def parse(cls, texts: Iterable[str]) -> EventKeys:
        """Keys from their texts (base64 or PEM); a ValueError names the one that is not a key (1-based)."""
        keys = []
        for number, text in enumerate(texts, 1):
            try:
                keys.append(read_public_key(text))
            except ValueError as exc:
                raise ValueError(f"key {number}: {exc}") from exc
        return cls(keys)

    @classmethod
    def from_file(cls, path: Path) -> EventKeys:
        return cls.parse(public_keys_text(path.read_text()))

    def __len__(self) -> int:
        return len(self.by_id)

    def verify(
        self, value: bytes, headers: Iterable[tuple[str, bytes | None]] | None, header: str = SIGNATURE_HEADER
    ) -> str:
        """The id of the trusted key that signed exactly `value`, as the record's `header` says (the fleet's
        signature by default; PRODUCER_SIGNATURE_HEADER for a request's producer); an UnverifiedEvent says why not."""
        from cryptography.exceptions import InvalidSignature

        found = [text for name, text in headers or () if name == header]
        if not found:
            raise UnverifiedEvent("unsigned", f"no {header} header")
        if len(found) > 1 or found[0] is None:
            raise UnverifiedEvent("malformed", f"{len(found)} {header} headers, or one without a value")
        scheme, _, rest = found[0].partition(b":")
        identifier, _, encoded = rest.partition(b":")
        signature = _base64_of(64, encoded.decode("ascii", errors="replace"))
        if scheme != _SCHEME.encode() or signature is None:
            raise UnverifiedEvent("malformed", f"not an {_SCHEME} signature: {found[0][:40]!r}")
        key = self.by_id.get(identifier.decode("ascii", errors="replace"))
        if key is None:
            raise UnverifiedEvent("unknown_key", f"signed by key {identifier[:32]!r}, which this reader does not trust")
        try:
            key.verify(signature, value)
        except InvalidSignature:
            raise UnverifiedEvent(
                "bad_signature", f"the signature of key {identifier.decode()} does not match the event's bytes"
            ) from None
        return identifier.decode()


def producer_headers(signer: EventSigner, value: bytes) -> list[tuple[str, bytes]]:
    """The headers a producer sends a request with, its `value` exactly the bytes of the record: its team
    key's signature, which vouches for the `team` and `priority_class` that value names."""
    return [(PRODUCER_SIGNATURE_HEADER, signer.sign(value))]


def new_key_pair() -> tuple[bytes, str]:
    """A fresh private key as PEM PKCS#8, and its public key as `event_verify_keys` takes it."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    return pem, public_key_text(private.public_key())
