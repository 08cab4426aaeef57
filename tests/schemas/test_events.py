import json

import pytest
from pydantic import ValidationError

from schemas import Failed, FieldError, Rejected, Started, parse_event
from schemas.addresses import split_host_port


def test_events_round_trip_through_json() -> None:
    event = Failed(
        request_id="r", code="model_unavailable", message="m", stage="load_model", retryable=False, metadata={"a": "b"}
    )
    parsed = parse_event(event.model_dump_json().encode())
    assert parsed == event
    assert parsed.schema_version == 1 and parsed.host


def test_rejected_needs_a_reason_per_field() -> None:
    event = Rejected(request_id=None, reason="invalid", errors=[FieldError(path="model.id", message="missing")])
    assert parse_event(event.model_dump_json().encode()).errors[0].path == "model.id"


@pytest.mark.parametrize(
    "endpoint",
    [
        "10.0.0.5:9464/steal?x=",
        "10.0.0.5:9464/",
        "http://10.0.0.5:9464",
        "user@10.0.0.5:9464",
        "user:pw@10.0.0.5:9464",
        "10.0.0.5",
        "10.0.0.5:0",
        "10.0.0.5:65536",
        "10.0.0.5:9464#frag",
        "10.0.0.5:9464?q",
        " 10.0.0.5:9464",
        "10.0.0.5:9464\n",
        "host name:9464",
        "[not-ipv6]:9464",
        "-host:1",
        "10.0.0.5:9464 ",
        "\x1b[31mhost:1",
    ],
)
def test_a_started_events_endpoint_is_a_host_and_a_port_and_nothing_else(endpoint: str) -> None:
    raw = Started(request_id="r", method="sft", slot="cpu", pid=1).model_dump(mode="json") | {"endpoint": endpoint}
    with pytest.raises(ValidationError) as error:
        parse_event(json.dumps(raw).encode())
    assert error.value.errors()[0]["loc"][-1] == "endpoint"
    with pytest.raises(ValueError):
        split_host_port(endpoint)


@pytest.mark.parametrize(
    ("endpoint", "split"),
    [
        ("10.0.0.5:9464", ("10.0.0.5", 9464)),
        ("gpu-host-17.fleet.internal:443", ("gpu-host-17.fleet.internal", 443)),
        ("[::1]:9464", ("::1", 9464)),
        ("host_1:1", ("host_1", 1)),
    ],
)
def test_host_and_port_endpoints_are_taken(endpoint: str, split: tuple[str, int]) -> None:
    event = Started(request_id="r", method="sft", slot="cpu", pid=1, endpoint=endpoint, endpoint_scheme="https")
    assert parse_event(event.model_dump_json().encode()) == event
    assert split_host_port(endpoint) == split
