"""One daemon for the handler tests' end-to-end cases, as a host runs one daemon for many jobs.

Each case submits request ids of its own and reads only their events, so they can share a daemon
and its fork server, which imports torch and TRL once instead of once per case (about 20 s each on
2 cores). A case that needs settings, a daemon or a restart of its own keeps the `settings` and
`daemon` fixtures (tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from daemon.settings import Settings
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.conftest import own_settings


@pytest.fixture(scope="package")
async def shared_settings(kafka: str, hub: HubServer, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return await own_settings(kafka, hub, tmp_path_factory.mktemp("handlers-daemon"))


@pytest.fixture(scope="package")
def shared_daemon(shared_settings: Settings) -> Iterator[DaemonProcess]:
    process = DaemonProcess(shared_settings, shared_settings.work_dir.parent / "daemon.log").start()
    yield process
    process.stop()
