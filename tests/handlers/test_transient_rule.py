"""One transient rule decides both sides of a Hub call's failure: the daemon's push (daemon/hub/push.py) and the
child's downloads (handlers/toolkit/loading.py) each ask `handlers.protocol.is_transient_failure`, and so agree."""

from __future__ import annotations

import httpx2
import pytest
from huggingface_hub.errors import HfHubHTTPError

from daemon.hub.push import is_transient_push_failure
from handlers.protocol import TRANSIENT_HTTP_STATUS, is_transient_failure
from handlers.toolkit.loading import is_transient_download_failure


def hub_error(status: int) -> HfHubHTTPError:
    request = httpx2.Request("GET", "http://hub.invalid/api/models/tiny/base")
    return HfHubHTTPError(f"{status}", response=httpx2.Response(status, request=request))


CASES = [
    *[(hub_error(status), True) for status in sorted(TRANSIENT_HTTP_STATUS)],
    (hub_error(404), False),
    (hub_error(401), False),
    (hub_error(501), False),
    (httpx2.ConnectError("refused"), True),  # no answer at all
    (httpx2.ReadTimeout("slow"), True),
    (ValueError("base_model: not a Hub id"), False),  # not a Hub call's failure
    (OSError("disk full"), False),
]


@pytest.mark.parametrize(
    ("exc", "transient"), CASES, ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v)
)
def test_the_push_and_the_downloads_judge_every_failure_alike(exc: BaseException, transient: bool) -> None:
    assert is_transient_push_failure(exc) is transient
    assert is_transient_download_failure(exc) is transient


@pytest.mark.parametrize("status", [404, 429, 503])
def test_the_protocol_reads_the_answer_of_the_hubs_error(status: int) -> None:
    assert is_transient_failure(hub_error(status)) is (status in TRANSIENT_HTTP_STATUS)
