"""Issue 22's hostile inputs, decided in process as intake decides them (decode, then the host's
refusals): each ends in a rejection naming its field. Also the pieces that keep intake total: an
exception becomes an `internal` rejection, a rejection always fits its event, retry headers are
the daemon's own, paths stay inside their roots. No broker, no child: milliseconds."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest
from aiokafka.structs import ConsumerRecord

from daemon.admission.judge import refusal
from daemon.hub.push import PushFailed, local_target
from daemon.intake import internal_rejection
from daemon.kafka.retry_state import FIRST, RetrySigner
from daemon.resources.slots import Slots
from daemon.settings import Settings
from handlers.contract.jsonschema import generated_schemas
from schemas import FieldError, Rejection, decode_request
from schemas.locations import local_location_inside, within
from schemas.regex import ENGINE
from schemas.secrets import BUILTIN
from tests.helpers import sft_request
from tests.hostile import hostile_cases


def decide(raw: bytes, settings: Settings) -> Rejection | None:
    decoded = decode_request(raw)
    if isinstance(decoded, Rejection):
        return decoded
    return refusal(decoded, settings, Slots([], 1))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    (data).mkdir()
    (tmp_path / "data-backup").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "file").write_text('{"text": "secret rows"}\n')
    (data / "link").symlink_to(tmp_path / "outside")
    return data


@pytest.fixture
def host(tmp_path: Path, root: Path) -> Settings:
    return Settings(
        work_dir=tmp_path / "work",
        allowed_local_dataset_roots=[root],
        allowed_dataset_urls=["s3://bucket/*"],
        allowed_report_to=["mlflow", "tensorboard", "trackio"],
    )


@pytest.mark.parametrize("case", hostile_cases(sft_request("valid"), Path("/tmp/root")), ids=lambda case: case[0])
def test_each_hostile_input_is_rejected_naming_its_field(
    case: tuple[str, bytes, list[tuple[str, bytes]], str], host: Settings, root: Path
) -> None:
    name, raw, _, path = case
    raw = raw.replace(b"/tmp/root", str(root).encode())
    rejection = decide(raw, host)
    assert rejection is not None, f"{name} was accepted"
    assert path in [error.path for error in rejection.errors], rejection.errors
    json.dumps([error.model_dump() for error in rejection.bounded().errors]).encode("utf-8")  # it serialises
    if name.startswith("secret-"):
        assert rejection.reason == "secret_in_request"
        assert json.loads(raw)["metadata"]["note"] not in repr(rejection)


def test_the_valid_request_behind_them_is_accepted(host: Settings) -> None:
    assert decide(json.dumps(sft_request("valid")).encode(), host) is None


def test_the_secret_scan_and_request_patterns_run_on_re2() -> None:
    assert ENGINE == "re2"


def test_an_exception_while_deciding_becomes_an_internal_rejection() -> None:
    record = ConsumerRecord("requests", 0, 7, 0, 0, b"k", b"{}", None, 1, 2, [])
    rejection = internal_rejection(record, OverflowError("boom"))
    assert rejection.reason == "internal" and rejection.exception == "OverflowError"
    assert "OverflowError" in rejection.errors[0].message


def test_a_rejection_always_fits_its_event() -> None:
    errors = [FieldError(path="x" * 10_000 + "\ud800", message="\udfff" * 50_000)] * 500
    bounded = Rejection("invalid", errors, "r").bounded()
    assert len(bounded.errors) == 51 and bounded.errors[-1].message == "and 450 more errors"
    encoded = json.dumps([error.model_dump() for error in bounded.errors]).encode("utf-8")
    assert len(encoded) < 200_000


def record_with(value: bytes, headers: list[tuple[str, bytes]], key: bytes = b"r1") -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord("requests", 0, 1, 0, 0, key, value, None, len(key), len(value), headers)


def test_retry_state_is_read_only_when_the_daemon_signed_it(tmp_path: Path) -> None:
    signer = RetrySigner.from_settings(None, tmp_path, max_attempts=3)
    due = time.time() + 30
    signed = signer.headers(b"r1", b"request", 2, due)
    state = signer.read(record_with(b"request", signed))
    assert state.attempt == 2 and state.due == pytest.approx(due, abs=0.01)
    assert signer.read(record_with(b"request", [("adapterd-attempt", b"99"), ("adapterd-not-before", b"inf")])) == FIRST
    assert signer.read(record_with(b"another request", signed)) == FIRST  # headers moved onto other bytes
    assert signer.read(record_with(b"request", signed, key=b"r2")) == FIRST
    other_host = RetrySigner(b"a key this host does not have", max_attempts=3)
    assert other_host.read(record_with(b"request", signed)) == FIRST
    assert RetrySigner.from_settings(None, tmp_path, max_attempts=3).key == signer.key  # kept across restarts


def test_a_signed_due_time_has_a_ceiling(tmp_path: Path) -> None:
    signer = RetrySigner.from_settings(None, tmp_path, max_attempts=3)
    far = signer.headers(b"r1", b"request", 2, time.time() + 10**9)
    assert signer.read(record_with(b"request", far)).due <= time.time() + 3601  # type: ignore[operator]


def test_paths_are_judged_on_components_with_symlinks_resolved(root: Path) -> None:
    assert within(root / "a.jsonl", [root])
    assert not within(root / "link" / "file", [root])  # the symlink leads out
    assert not within(root.parent / "data-backup" / "x.jsonl", [root])  # a sibling that shares the prefix
    assert not local_location_inside(f"{root}*/x.jsonl", [root])
    assert local_location_inside(f"{root}/*.jsonl", [root])


def test_the_local_sink_never_writes_outside_its_folder(host: Settings) -> None:
    request = decode_request(json.dumps(sft_request("sink")).encode())
    assert not isinstance(request, Rejection)
    main = local_target(request, host)
    branch = local_target(
        request.model_copy(update={"output": request.output.model_copy(update={"revision": "exp/1"})}), host
    )
    assert main == host.outputs_dir.resolve() / "results" / "sink"
    assert (
        branch == host.outputs_dir.resolve() / "results" / "sink@exp" / "1"
    )  # beside main's folder: a main push keeps it
    for revision in ("../../../jobs", "../../other-org/model", "exp/../../../x"):
        escaped = request.model_copy(update={"output": request.output.model_copy(update={"revision": revision})})
        with pytest.raises(PushFailed):
            local_target(escaped, host)


def test_intake_scans_with_detect_secrets_rules_besides_its_own() -> None:
    from daemon.admission.secret_rules import LEFT_OUT, SCANNER
    from schemas.secrets import secret_kind

    shapes = {  # made-up values of shapes only detect-secrets' plugins know
        "SendGrid": "SG." + "a1B2c3D4e5F6g7H8i9J0kL" + "." + "m" * 43,
        "Square": "sq0csp-" + "Ab3" * 14 + "x",
        "Mailchimp": "0123456789abcdef0123456789abcdef-us12",
        "Telegram": "123456789:AAH" + "b" * 32,
    }
    for issuer, value in shapes.items():
        assert secret_kind(value) is None  # not among adapterd's own rules
        kind = SCANNER.kind(value)
        assert kind is not None and "detect-secrets" in kind, (issuer, kind)
        raw = json.dumps(sft_request("ds", metadata={"note": f"see {value}"})).encode()
        rejection = decode_request(raw, scanner=SCANNER)
        assert (
            isinstance(rejection, Rejection)
            and rejection.reason == "secret_in_request"
            and value not in repr(rejection)
        )
    assert SCANNER.kind("hf_" + "x" * 34) == "a Hugging Face token (hf_...)"  # adapterd's rules first
    assert all(": " in line for line in LEFT_OUT) and len(LEFT_OUT) < len(SCANNER.rules)


def test_intake_judges_key_names_by_detect_secrets_keyword_list_besides_its_own() -> None:
    from daemon.admission.secret_rules import KEYWORDS_DS, SCANNER

    assert {"password", "secret", "api_?key", "pwd"} <= set(KEYWORDS_DS)  # read from the plugin, not copied
    # (`db_pass`, detect-secrets' too, is adapterd's own since issue 46: `pass` as a whole last word.)
    for name in (
        "pwd",
        "dbpass",
        "authKey",
        "service_key",
        "clientKey",
        "contraseña",
        "CONTRASEÑA",
        "contrase\u00f1a\u200b",
    ):
        assert not BUILTIN.keys.names_credential(name), name  # not among adapterd's own keywords
        assert SCANNER.keys.names_credential(name), name
        raw = json.dumps(sft_request("ds-keyword", metadata={name: "short"})).encode()
        rejection = decode_request(raw, scanner=SCANNER)
        assert isinstance(rejection, Rejection) and rejection.reason == "secret_in_request", (name, rejection)
        assert [error.path for error in rejection.errors] == [f"metadata.{name}"] and "short" not in repr(rejection)
    for name in ("tokenizer_name", "max_tokens", "num_tokens", "tokenizer", "pad_token", "author", "pass_threshold"):
        assert not SCANNER.keys.names_credential(name), name


def test_no_field_name_of_the_request_contract_is_a_credential_name() -> None:
    # Every key of a request is judged, not a list of free-form fields: so no field of the contract
    # (TRL's, transformers', PEFT's included) may trip the rule. TRL's `hub_token` is not a field.
    from daemon.admission.secret_rules import SCANNER

    schema = json.loads(generated_schemas()["request.schema.json"])
    names: set[str] = set()

    def collect(node: object) -> None:
        if isinstance(node, dict):
            names.update(node.get("properties", {}) if isinstance(node.get("properties"), dict) else ())
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    collect(schema)
    assert len(names) > 300 and {"max_new_tokens", "pad_token", "eos_token", "stop_token", "pass_threshold"} <= names
    assert sorted(name for name in names if SCANNER.keys.names_credential(name)) == []


def test_the_scan_walks_a_request_only_when_a_string_of_it_may_be_a_credential() -> None:
    from daemon.admission.secret_rules import SCANNER

    image = (
        "data:image/png;base64,"
        + "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg" * 40
    )
    rows = [
        {
            "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is it?"}]}],
            "images": [image],
        }
    ]
    # An inline image's base64 is never decoded by the scan (only a whole string of that alphabet
    # is), so it does not make the scan walk every string of the request.
    assert not SCANNER.may_hold(json.dumps(sft_request("images", dataset={"rows": rows})).encode())
    encoded = base64.b64encode(b"hf_" + b"A" * 34).decode()  # a Hugging Face token, base64-encoded, as a whole string
    raw = json.dumps(sft_request("encoded", dataset={"rows": rows}, metadata={"note": encoded})).encode()
    assert SCANNER.may_hold(raw)
    assert SCANNER.find(json.loads(raw)) == [("metadata.note", "a Hugging Face token (hf_...), base64-encoded")]
