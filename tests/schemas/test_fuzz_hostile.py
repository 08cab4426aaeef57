"""Structure-aware fuzzing of decoding and intake's decision with Hypothesis: the shipped examples
with one or more leaves replaced by what a hostile producer sends (huge and non-finite numbers,
lone surrogates, long strings, regex metacharacters, `..`, `::`, credentials, deep nesting).

Properties, for every input: deciding never raises; a rejection names at least one error, each with
a message; a rejection fits its event (bounded, UTF-8, far below the broker's message size); an
accepted request's `accepted` event serialises within it too. A CI run draws `FUZZ_EXAMPLES`
inputs (200 by default); `ADAPTERD_FUZZ_EXAMPLES=100000` is the long run. Inputs that found bugs
are replayed first from tests/corpus/hostile/ (`@example` would hide them in code).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.admission.judge import refusal
from daemon.resources.slots import Slots
from daemon.settings import Settings
from schemas import Accepted, Rejection, decode_request
from tests.fuzz import EXAMPLES, leaf_paths, set_leaf
from tests.hostile import CREDENTIALS

FUZZ_EXAMPLES = int(os.environ.get("ADAPTERD_FUZZ_EXAMPLES", "200"))
MAX_EVENT_BYTES = 1_000_000  # the broker's default message.max.bytes is 1 MiB
CORPUS = Path(__file__).parents[1] / "corpus" / "hostile"
HOST = Settings(
    work_dir=Path("/nonexistent/adapterd-fuzz"),
    allowed_local_dataset_roots=[Path("/data")],
    allowed_dataset_urls=["s3://bucket/*"],
)

LEAVES = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([2**63, -(2**63) - 1, 10**18, 10**4000]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=50),
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3),
    st.sampled_from(
        [
            "../../../jobs",
            "/data/link::file://",
            "/data*/x.jsonl",
            "s3://bucket/x::memory://",
            ".",
            "..",
            "(a+)+$",
            "a{4294967296}",
            "(?<=x)y",
            "[",
            "\\",
            "x" * 5000,
            "a-" * 3000 + "x:/",
            "refs/pr/1",
        ]
    ),
    st.sampled_from(sorted(CREDENTIALS.values())),
    st.recursive(
        st.none() | st.booleans() | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
        max_leaves=20,
    ),
)


@st.composite
def hostile_messages(draw: st.DrawFn) -> bytes:
    document = copy.deepcopy(draw(st.sampled_from(EXAMPLES)))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        set_leaf(document, draw(st.sampled_from(leaf_paths(document))), draw(LEAVES))
    if draw(st.booleans()):  # a new key somewhere, as metadata or an unknown field
        document.setdefault("metadata", {})[draw(st.text(max_size=10))] = draw(LEAVES)
    return json.dumps(document, allow_nan=True).encode("utf-8", errors="surrogatepass")


def check(raw: bytes) -> None:
    decoded = decode_request(raw, b"fuzz-key")
    rejection = decoded if isinstance(decoded, Rejection) else refusal(decoded, HOST, Slots([], 1))
    if rejection is not None:
        assert rejection.errors and all(error.message for error in rejection.errors)
        errors = json.dumps([error.model_dump() for error in rejection.bounded().errors]).encode("utf-8")
        assert len(errors) < MAX_EVENT_BYTES
    else:
        assert not isinstance(decoded, Rejection)  # for mypy: `rejection` is None only for a request
        # What the daemon takes it to mean survives its own encoding (the child's spec is this dump): read
        # again, it is the same request.
        again = decode_request(decoded.model_dump_json(exclude_unset=True).encode(), b"fuzz-key")
        assert again == decoded, (again, decoded)
        accepted = Accepted(
            request_id=decoded.request_id, host="h", metadata=decoded.metadata, method=decoded.method, attempt=1
        )  # type: ignore[attr-defined]
        assert len(accepted.model_dump_json().encode()) < MAX_EVENT_BYTES


def test_the_corpus_that_found_bugs_is_replayed() -> None:
    files = sorted(CORPUS.glob("*.json"))
    assert files
    for path in files:
        check(path.read_bytes())


@settings(
    max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(hostile_messages())
def test_no_hostile_message_makes_deciding_raise(raw: bytes) -> None:
    check(raw)
