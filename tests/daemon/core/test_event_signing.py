"""Signed events in the daemon, on in-memory parts (no broker): the publisher signs exactly the bytes
it sends with the host's key; the settings read the keys in every form and name the setting of a
bad one; a host with a signing key trusts its own public key, so it never takes an unsigned event;
the commands' event stream yields only what a trusted key signed and counts the rest by why; and
`adapterd keys` makes a pair that a host and a reader can use at once."""

from __future__ import annotations

import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from daemon.cli.app import app
from daemon.errors import ConfigError
from daemon.kafka.event_reader import EventStream
from daemon.kafka.publisher import Publisher
from daemon.settings import Settings, load_settings
from daemon.settings.secret_files import event_keys, event_signer
from schemas import SIGNATURE_HEADER, Accepted, Cancelled
from schemas.signing import EventKeys, EventSigner, new_key_pair
from testbed.memory_kafka import FakeRecord
from tests.fakes import FakeProducer


def key_files(folder: Path) -> tuple[Path, str]:
    """A private key file and its public key's text."""
    pem, public = new_key_pair()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "signing.pem").write_bytes(pem)
    return folder / "signing.pem", public


def test_the_publisher_signs_exactly_the_bytes_it_sends(tmp_path: Path) -> None:
    private, public = key_files(tmp_path)
    settings = Settings(gpus=[], warm_child=False, event_signing_key_file=private)
    message = Publisher(settings, FakeProducer({})).event_message(Accepted(request_id="r-1", method="sft"))
    assert EventKeys.parse([public]).verify(message.value, message.headers) == EventSigner.from_file(private).key_id
    unsigned = Publisher(Settings(gpus=[], warm_child=False), FakeProducer({})).event_message(
        Accepted(request_id="r-1", method="sft")
    )
    assert SIGNATURE_HEADER not in dict(unsigned.headers)


def test_bad_keys_are_refused_at_start_naming_their_setting(tmp_path: Path) -> None:
    (tmp_path / "not-a-key").write_text("hello\n")
    (tmp_path / "keys").write_text("# one good, one not\n" + new_key_pair()[1] + "\nbm90IGEga2V5\n")
    cases = {
        r"event_signing_key_file: cannot read .*missing: No such file": {
            "event_signing_key_file": tmp_path / "missing"
        },
        r"event_signing_key_file: .*not-a-key: not an Ed25519 private key": {
            "event_signing_key_file": tmp_path / "not-a-key"
        },
        r"event_verify_keys: key 1: not an Ed25519 public key": {"event_verify_keys": ["hello"]},
        r"event_verify_keys_file: .*keys: key 2: not an Ed25519 public key": {
            "event_verify_keys_file": tmp_path / "keys"
        },
    }
    for pattern, overrides in cases.items():
        with pytest.raises(ConfigError, match=pattern):
            load_settings(**overrides)


def test_the_trusted_keys_are_the_listed_the_filed_and_the_hosts_own(tmp_path: Path) -> None:
    private, own = key_files(tmp_path / "own")
    listed, filed, rotated = new_key_pair()[1], new_key_pair()[1], new_key_pair()[1]
    (tmp_path / "keys").write_text(f"{filed}\n{rotated}\n")
    settings = Settings(
        event_signing_key_file=private, event_verify_keys=[listed], event_verify_keys_file=tmp_path / "keys"
    )
    keys = event_keys(settings)
    assert keys is not None and set(keys.by_id) == set(EventKeys.parse([own, listed, filed, rotated]).by_id)
    assert event_keys(Settings()) is None and event_signer(Settings()) is None  # no key: events are read unverified
    alone = event_keys(Settings(event_signing_key_file=private))  # a host that signs refuses unsigned events
    assert alone is not None and set(alone.by_id) == {EventSigner.from_file(private).key_id}


class ListedReader:
    """The event stream's topic reader, over records given in advance."""

    def __init__(self, records: list[FakeRecord]) -> None:
        self.listed = records

    async def records(self, *, follow: bool = True) -> AsyncIterator[FakeRecord]:
        for record in self.listed:
            yield record

    async def stop(self) -> None:
        pass


async def test_the_stream_yields_only_what_the_fleet_signed_and_counts_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    private, _ = key_files(tmp_path / "fleet")
    stranger = EventSigner.from_file(key_files(tmp_path / "stranger")[0])
    fleet = EventSigner.from_file(private)
    settings = Settings(event_signing_key_file=private)

    def record(event: Accepted | Cancelled, signer: EventSigner | None, key: str | None = None) -> FakeRecord:
        value = event.model_dump_json().encode()
        headers = [(SIGNATURE_HEADER, signer.sign(value))] if signer is not None else []
        return FakeRecord(settings.events_topic, 0, 0, (key or event.request_id or "").encode(), value, headers)  # type: ignore[arg-type]

    genuine, other = Accepted(request_id="r-1", method="sft"), Cancelled(request_id="r-2", reason="by an operator")
    stream = EventStream(settings)
    stream.reader = ListedReader(
        [  # type: ignore[assignment]
            record(Cancelled(request_id="r-1", reason="forged"), None),  # unsigned
            record(Cancelled(request_id="r-1", reason="forged"), stranger),  # another key
            record(genuine, fleet),
            record(other, fleet, key="r-1"),  # a genuine event of r-2, written again under r-1's key
            record(Cancelled(request_id="r-1", reason="done"), fleet),
        ]
    )
    seen = [event async for event in stream.events("r-1")]
    assert [event.type for event in seen] == ["accepted", "cancelled"] and seen[1].reason == "done"  # type: ignore[union-attr]
    assert stream.ignored == {"unsigned": 1, "unknown_key": 1, "misplaced": 1}
    await stream.__aexit__(None, None, None)  # the command says how many it ignored, on stderr
    said = capsys.readouterr()
    assert (
        f"adapterd: ignored 3 event(s) in {settings.events_topic}" in said.err
        and "1 unsigned" in said.err
        and not said.out
    )


def test_adapterd_keys_makes_a_pair_a_host_and_a_reader_use(tmp_path: Path) -> None:
    folder = tmp_path / "keys"
    made = CliRunner().invoke(app, ["keys", str(folder)])
    assert made.exit_code == 0, made.output
    private = folder / "event-signing-key.pem"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    settings = Settings(event_signing_key_file=private, event_verify_keys_file=folder / "event-verify-key.pub")
    keys, signer = event_keys(settings), event_signer(settings)
    assert keys is not None and signer is not None and list(keys.by_id) == [signer.key_id]
    assert f"key {signer.key_id}" in made.output and 'event_verify_keys = ["' in made.output
    again = CliRunner().invoke(app, ["keys", str(folder)])
    assert (
        again.exit_code == 2
        and "is never overwritten" in again.output
        and private.read_bytes().startswith(b"-----BEGIN PRIVATE KEY")
    )


async def test_a_batch_is_taken_by_the_streams_own_rules_in_order(tmp_path: Path) -> None:
    """`verified_many` (the table's reader): the same verdicts as `verified`, one a record, in order, from the worker
    threads; a record that is not an event counted rather than raised; a misplaced copy refused before its id is
    taken, so the genuine event after it is still taken once."""
    private, _ = key_files(tmp_path / "fleet")
    stranger = EventSigner.from_file(key_files(tmp_path / "stranger")[0])
    fleet = EventSigner.from_file(private)
    settings = Settings(event_signing_key_file=private)

    def record(value: bytes, signer: EventSigner | None, key: str) -> FakeRecord:
        headers: list[tuple[str, bytes | None]] = [(SIGNATURE_HEADER, signer.sign(value))] if signer else []
        return FakeRecord(settings.events_topic, 0, 0, key.encode(), value, headers)

    genuine = Accepted(request_id="r-1", method="sft").model_dump_json().encode()
    batch = [
        record(genuine, fleet, "r-2"),  # a genuine event of r-1 written again under r-2's key
        record(genuine, stranger, "r-1"),
        record(b'{"not": "an event"}', fleet, "r-1"),
        record(genuine, fleet, "r-1"),
        record(genuine, fleet, "r-1"),  # the same, again
        *(
            record(Cancelled(request_id=f"r-{n}", reason="x").model_dump_json().encode(), fleet, f"r-{n}")
            for n in (3, 4)
        ),
    ]
    stream = EventStream(settings, quiet=True)
    taken = await stream.verified_many(batch)
    assert [event.request_id if event else None for event in taken] == [None, None, None, "r-1", None, "r-3", "r-4"]
    assert stream.ignored == {"misplaced": 1, "unknown_key": 1, "not_an_event": 1}
    assert stream.repeated == {"repeated": 1}
