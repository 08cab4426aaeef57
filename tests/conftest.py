"""The fixtures that start real services, all in one place: a Kafka broker, the local Hub server,
a tiny model and datasets published to it, object stores (moto's S3, a GCS emulator, Azurite), an MLflow tracking
server, a local Ray cluster, and the daemon itself as a child process.

Set ADAPTERD_TEST_BOOTSTRAP_SERVERS to use an external Kafka cluster instead of the local broker.
"""

from __future__ import annotations

import os

# The local Hub cannot serve Xet uploads; the client must take the plain HTTP path. Set before
# huggingface_hub is imported anywhere in the test process.
os.environ["HF_HUB_DISABLE_XET"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# gcsfs asks each bucket's type over gRPC, which the GCS emulator does not answer (every call would
# wait 60 s); set before gcsfs is imported, here and in the daemons and children the tests start.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
# A token in the developer's environment would make every daemon and Settings here push to the
# Hub (daemon/settings/secret_files.py reads $HF_TOKEN when no token is configured): the tests name theirs.
os.environ.pop("HF_TOKEN", None)

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.cli.demo.requests import PREFERENCE_ROWS
from daemon.kafka.admin.topics import ensure_topics
from daemon.local_broker import LocalKafka, free_port
from daemon.settings import Settings
from testbed.data import CHAT_DATASET, CHAT_ROWS, HUB_TOKEN, PREFERENCE_DATASET, TINY_MODEL
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from testbed.ray_cluster import RayCluster

# The fixtures that start a Kafka broker (and so the JVM), or hand one to a test.
BROKER_FIXTURES = {"local_broker", "kafka", "own_broker"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses a broker, through any fixture it depends on, is marked `broker`:
    `pytest -m "not slow and not broker"` is the quick subset, which needs neither Kafka nor Java.
    And the files with slow cases run first."""
    for item in items:
        if BROKER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.broker)
    # The files with end-to-end cases first, each file's tests kept together and in their order: on
    # two workers (`--dist loadfile`) the long files start early and the quick ones fill the end,
    # instead of the suite waiting on a long file that happened to start last.
    long_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in long_files)


@pytest.fixture(scope="session")
def local_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka | None]:
    """A local KRaft node, unless ADAPTERD_TEST_BOOTSTRAP_SERVERS names an external cluster (then None)."""
    if os.environ.get("ADAPTERD_TEST_BOOTSTRAP_SERVERS"):
        yield None
        return
    broker = LocalKafka(data_dir=tmp_path_factory.mktemp("kafka")).start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def kafka(local_broker: LocalKafka | None) -> str:
    """Bootstrap servers of a real broker: external if configured, else the local node's plaintext listener."""
    return os.environ.get("ADAPTERD_TEST_BOOTSTRAP_SERVERS") or local_broker.bootstrap_servers  # type: ignore[union-attr]


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[LocalKafka]:
    """A broker of this test's own, for tests that stop and restart it."""
    broker = LocalKafka(data_dir=tmp_path / "own-kafka").start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def hub() -> Iterator[HubServer]:
    server = HubServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from handlers.fixtures.tiny_model import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny_nan_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its final norm's weight NaN (handlers/fixtures/tiny_model.py `poison`): every loss
    a run of it logs is NaN on any CPU, where a large learning rate diverges on some and not others."""
    from handlers.fixtures.tiny_model import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-nan-model"), nan=True)


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny vision-language model (LLaVA) and its processor, built locally (handlers/fixtures/tiny_vlm.py)."""
    from handlers.fixtures.tiny_vlm import save_tiny_vlm

    return save_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"))


@pytest.fixture(scope="session")
def published(hub: HubServer, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> HubServer:
    """The tiny model and a chat dataset, on the local Hub under the ids requests name them by."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.endpoint, token=HUB_TOKEN)
    api.create_repo(TINY_MODEL, exist_ok=True)
    api.upload_folder(folder_path=tiny_model_dir, repo_id=TINY_MODEL, commit_message="tiny model")
    data = tmp_path_factory.mktemp("chat-dataset")
    (data / "data").mkdir()
    (data / "data" / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in CHAT_ROWS))
    api.create_repo(CHAT_DATASET, repo_type="dataset", exist_ok=True)
    api.upload_folder(folder_path=data, repo_id=CHAT_DATASET, repo_type="dataset", commit_message="chat rows")

    # Preference rows under other column names, with a train and a test split (from the file names).
    preferences = tmp_path_factory.mktemp("preference-dataset")
    (preferences / "data").mkdir()
    renamed = [{"question": r["prompt"], "good": r["chosen"], "bad": r["rejected"]} for r in PREFERENCE_ROWS]
    (preferences / "data" / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in renamed))
    (preferences / "data" / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in renamed[:2]))
    api.create_repo(PREFERENCE_DATASET, repo_type="dataset", exist_ok=True)
    api.upload_folder(
        folder_path=preferences, repo_id=PREFERENCE_DATASET, repo_type="dataset", commit_message="preferences"
    )
    return hub


S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3 API server on the loopback (moto's standalone server), with dummy credentials: what
    s3fs's own tests run against. Nothing reaches AWS."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="session")
def gcs_endpoint() -> Iterator[str]:
    """A GCS JSON API server on the loopback (gcp-storage-emulator, in memory, in this process) with
    the bucket `ml-data`; gcsfs reads it with `token="anon"`. Nothing reaches Google."""
    from gcp_storage_emulator.server import create_server

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket="ml-data")
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Azure Blob Storage on the loopback (Azurite, in memory): its connection string, which the
    tests hand to the daemon as the host's AZURE_STORAGE_CONNECTION_STRING, never in a request."""
    from tests.azurite import Azurite, connection_string

    server = Azurite(free_port(), tmp_path_factory.mktemp("azurite") / "azurite.log").start()
    yield connection_string(server.port)
    server.stop()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An MLflow tracking server on the loopback (its own environment, SQLite): its URI."""
    from tests.mlflow_server import MlflowServer

    server = MlflowServer(free_port(), tmp_path_factory.mktemp("mlflow")).start()
    yield server.uri
    server.stop()


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    """One local Ray head per test module that needs one (about 4 s to start, 1 GB; its two dozen processes, idle, still
    take the CPU a little, so it does not outlive its module): tests take it through `ray_cluster`."""
    cluster = RayCluster(tmp_path_factory.mktemp("ray"))
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def ray_cluster(ray_head: RayCluster) -> RayCluster:
    """The local Ray cluster, running: a test may stop it (an outage) and need not start it again, the next test's
    start does. Its jobs are forgotten when it stops (Ray keeps them in its GCS's memory), so each test submits and
    reads its own."""
    ray_head.start()  # nothing to do unless a test before this one left it stopped
    return ray_head


@pytest.fixture
async def settings(kafka: str, hub: HubServer, tmp_path: Path) -> Settings:
    """Settings with topics and a group of this test's own, so tests never see each other's messages."""
    return await own_settings(kafka, hub, tmp_path)


async def own_settings(kafka: str, hub: HubServer, tmp_path: Path) -> Settings:
    """The `settings` fixture's settings, for a fixture of wider scope: topics, a group and a work
    folder of its own, its topics created."""
    suffix = uuid.uuid4().hex[:8]
    settings = Settings(
        bootstrap_servers=kafka,
        requests_topic=f"requests-{suffix}",
        events_topic=f"events-{suffix}",
        dlq_topic=f"dlq-{suffix}",
        control_topic=f"control-{suffix}",
        state_topic=f"state-{suffix}",
        group_id=f"adapterd-{suffix}",
        work_dir=tmp_path / "work",
        hub_endpoint=hub.endpoint,
        hub_token=HUB_TOKEN,  # type: ignore[arg-type]
        progress_interval_s=0,
        allowed_local_model_roots=[tmp_path],
        log_format="json",
        metrics_address=f"127.0.0.1:{free_port()}",
    )
    await ensure_topics(settings)
    return settings


@pytest.fixture(scope="session")
async def shared_settings(kafka: str, hub: HubServer, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return await own_settings(kafka, hub, tmp_path_factory.mktemp("shared-daemon"))


@pytest.fixture(scope="session")
def shared_daemon(shared_settings: Settings) -> Iterator[DaemonProcess]:
    """One daemon, on default settings, for the end-to-end cases that need nothing of their own, as a
    host runs one daemon for many jobs: its fork server imports torch and TRL once instead of once
    per case (about 20 s each on 2 cores). Each case submits request ids of its own (the Hub, which
    every daemon of the session shares, already asks that) and reads back only its own events,
    dead letters and offsets. A case that needs settings, a daemon or a restart of its own takes the
    `settings` and `daemon` fixtures."""
    process = DaemonProcess(shared_settings, shared_settings.work_dir.parent / "daemon.log").start()
    yield process
    process.stop()


@pytest.fixture
def daemon(settings: Settings, tmp_path: Path) -> Iterator[DaemonProcess]:
    process = DaemonProcess(settings, tmp_path / "daemon.log").start()
    yield process
    process.stop()
