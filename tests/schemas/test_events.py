from schemas import Failed, FieldError, Rejected, parse_event


def test_events_round_trip_through_json() -> None:
    event = Failed(request_id="r", code="model_unavailable", message="m", stage="load_model", retryable=False, metadata={"a": "b"})
    parsed = parse_event(event.model_dump_json().encode())
    assert parsed == event
    assert parsed.schema_version == 1 and parsed.host


def test_rejected_needs_a_reason_per_field() -> None:
    event = Rejected(request_id=None, reason="invalid", errors=[FieldError(path="model.id", message="missing")])
    assert parse_event(event.model_dump_json().encode()).errors[0].path == "model.id"
