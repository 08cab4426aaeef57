from pathlib import Path

import pytest

from daemon.demo_requests import PREFERENCE_ROWS
from daemon.settings import Settings
from schemas import Succeeded
from tests.helpers import (
    assert_adapter_trained,
    download,
    example_request,
    run_to_end,
)
from tests.hub_server import HubServer
from tests.processes import DaemonProcess

KTO_ROWS = [
    {"prompt": row["prompt"], "completion": row[column], "label": column == "chosen"}
    for row in PREFERENCE_ROWS for column in ("chosen", "rejected")
]


@pytest.mark.slow
async def test_kto_on_unpaired_labelled_rows(daemon: DaemonProcess, published: HubServer, settings: Settings, tiny_model_dir: Path, tmp_path: Path) -> None:
    request = example_request("kto", "kto-e2e", dataset={"rows": KTO_ROWS})
    done = (await run_to_end(settings, request))[-1]
    assert isinstance(done, Succeeded), done
    assert (done.method, done.trainer) == ("kto", "trl.KTOTrainer/trl.KTOConfig")
    assert_adapter_trained(download(published.endpoint, "results/kto-e2e", done.commit_sha, tmp_path), tiny_model_dir)
