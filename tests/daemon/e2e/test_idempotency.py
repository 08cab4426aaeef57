"""One effect per request id: a failed push is retried without training again, and a request that
already succeeded is answered with its `succeeded` (same commit, `duplicate: true`), found in this
host's journal or, without it, in the Hub commit that records the request id."""

import shutil

import pytest

from daemon.settings import Settings
from schemas import Failed, Started, Succeeded
from testbed.client import submit_and_follow
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import sft_request

pytestmark = pytest.mark.slow


async def test_one_training_and_one_commit_per_request_id(
    shared_daemon: DaemonProcess, published: HubServer, shared_settings: Settings
) -> None:
    settings = shared_settings
    request = sft_request("once-only")
    published.fail("POST", r"/api/repos/create", 403, times=1)
    first = await submit_and_follow(settings, request)
    assert isinstance(first[-1], Failed) and first[-1].code == "hub_unauthorized"
    assert any(isinstance(e, Started) for e in first)  # it trained, then the push was refused

    second = await submit_and_follow(settings, request)  # the operator fixed the token; the request is sent again
    done = second[-1]
    assert isinstance(done, Succeeded) and not done.duplicate
    assert not any(isinstance(e, Started) for e in second), "the artifact on disk was pushed; nothing was trained again"
    commits = published.commits("results/once-only")
    assert [c.sha for c in commits] == [done.commit_sha]

    third = await submit_and_follow(settings, request)
    again = third[-1]
    assert isinstance(again, Succeeded) and again.duplicate and again.commit_sha == done.commit_sha
    assert again.metrics == done.metrics and not any(isinstance(e, Started) for e in third)

    # Another host holds no journal of this request: the Hub commit's record of the request id is enough.
    shutil.rmtree(settings.jobs_dir / "once-only")
    fourth = await submit_and_follow(settings, request)
    from_hub = fourth[-1]
    assert isinstance(from_hub, Succeeded) and from_hub.duplicate and from_hub.commit_sha == done.commit_sha
    assert "adapter_model.safetensors" in from_hub.files
    assert len(published.commits("results/once-only")) == 1
