"""The README's request examples are valid as written: one per method, and one with images per
vision-language method (`<method>-vision.json`)."""

import pytest

from schemas import REQUEST_MODELS, decode_request
from schemas.methods import METHODS
from tests.helpers import EXAMPLES_DIR

VISION = sorted(name for name, row in METHODS.items() if row.vision)


@pytest.mark.parametrize("method", sorted(REQUEST_MODELS))
def test_example_is_a_valid_request_of_its_method(method: str) -> None:
    request = decode_request((EXAMPLES_DIR / f"{method}.json").read_bytes())
    assert isinstance(request, REQUEST_MODELS[method]), request
    assert request.method == method


@pytest.mark.parametrize("method", VISION)
def test_vision_example_is_a_valid_request_of_its_method(method: str) -> None:
    request = decode_request((EXAMPLES_DIR / f"{method}-vision.json").read_bytes())
    assert isinstance(request, REQUEST_MODELS[method]), request


def test_every_example_is_for_a_known_method() -> None:
    assert {path.stem for path in EXAMPLES_DIR.glob("*.json")} == set(REQUEST_MODELS) | {
        f"{name}-vision" for name in VISION
    }
