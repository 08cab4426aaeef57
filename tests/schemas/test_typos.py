from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from schemas import SFTRequest
from schemas.typos import closest, meant_field


class Leaf(BaseModel):
    model_config = ConfigDict(extra="forbid")
    weight: float = 1.0


class Other(BaseModel):
    model_config = ConfigDict(extra="forbid")
    height: float = 1.0


class Root(BaseModel):
    model_config = ConfigDict(extra="forbid")
    leaves: list[Leaf] = []
    pair: tuple[Leaf, Other] | None = None
    by_name: dict[str, Leaf] = {}
    either: Leaf | Other | None = None
    free: dict[str, Any] = {}


def meant(data: dict[str, Any]) -> list[str | None]:
    """The guess for each unknown field pydantic reports when validating `data` as a Root."""
    try:
        Root.model_validate(data)
    except ValidationError as exc:
        return [meant_field(Root, error["loc"]) for error in exc.errors() if error["type"] == "extra_forbidden"]
    raise AssertionError("valid")


def test_the_guess_is_a_field_of_the_model_at_the_errors_place() -> None:
    assert meant({"leavs": []}) == ["leaves"]
    assert meant({"leaves": [{}, {"weightt": 2}]}) == ["weight"]
    assert meant({"pair": [{}, {"heightt": 2}]}) == ["height"]  # a fixed tuple: the item's own type
    assert meant({"by_name": {"a": {"weightt": 2}}}) == ["weight"]
    # a plain union of models: pydantic tries each, naming it in the location, and each gets its own fields
    assert meant({"either": {"weightt": 2}}) == ["weight", None]


def test_no_guess_where_nothing_is_close_or_the_place_is_unknown() -> None:
    assert meant({"xyzzy": 1}) == [None]
    assert meant_field(Root, ("free", "a", "weightt")) is None  # a free-form dict has no fields
    assert meant_field(Root, ("nowhere", "weightt")) is None
    assert meant_field(Root, ()) is None


def test_a_discriminated_unions_tag_picks_the_member() -> None:
    # evaluation.suites: a suite's `kind` picks its model; pydantic puts the tag into the location
    loc = ("evaluation", "suites", 0, "task", "limt")
    assert meant_field(SFTRequest, loc) == "limit"
    assert meant_field(SFTRequest, ("evaluation", "suites", 0, "nosuchkind", "limt")) is None


def test_closest_keeps_the_cutoff() -> None:
    assert closest("learning_rat", ["learning_rate", "max_length"]) == "learning_rate"
    assert closest("max_sequence_len", ["max_length"]) is None
