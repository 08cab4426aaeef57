"""Datasets in Azure Blob Storage, end to end through the daemon, as S3 and GCS are: Parquet by an
`abfs://` glob with an eval set from an `az://` JSON Lines file, and a streamed `az://` source,
read with adlfs from Azurite on the loopback. The credentials are the host's own
(AZURE_STORAGE_CONNECTION_STRING in the daemon's environment), never the request's; each
`succeeded` records the blobs' ETags and sizes, and the model card names them."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.settings import Settings
from schemas import Succeeded
from testbed.data import CHAT_ROWS
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import all_succeed, jsonl_bytes, parquet_bytes, sft_request

CONTAINER = "ml-data"


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_azure_parquet_glob_eval_source_and_streaming(
    published: HubServer, settings: Settings, azurite: str, tmp_path: Path
) -> None:
    import adlfs

    fs = adlfs.AzureBlobFileSystem(connection_string=azurite)
    if not fs.exists(CONTAINER):
        fs.mkdir(CONTAINER)
    fs.pipe(f"{CONTAINER}/curated/chat/part-0.parquet", parquet_bytes(CHAT_ROWS[:3]))
    fs.pipe(f"{CONTAINER}/curated/chat/part-1.parquet", parquet_bytes(CHAT_ROWS[3:]))
    fs.pipe(f"{CONTAINER}/curated/eval.jsonl", jsonl_bytes(CHAT_ROWS[:2]))
    fs.pipe(f"{CONTAINER}/curated/stream.jsonl", jsonl_bytes(CHAT_ROWS))
    settings = settings.model_copy(
        update={"allowed_dataset_urls": [f"abfs://{CONTAINER}/curated/*", f"az://{CONTAINER}/curated/*"]}
    )
    training = {"max_steps": 3, "learning_rate": 1e-2, "per_device_train_batch_size": 2}
    requests = {
        "azure-parquet": sft_request(
            "azure-parquet",
            dataset={
                "url": f"abfs://{CONTAINER}/curated/chat/*.parquet",
                "eval": {"url": f"az://{CONTAINER}/curated/eval.jsonl"},
            },
            training={**training, "eval_strategy": "steps", "eval_steps": 3},
        ),
        "azure-stream": sft_request(
            "azure-stream",
            dataset={"url": f"az://{CONTAINER}/curated/stream.jsonl", "streaming": True},
            training=training,
        ),
    }
    daemon = DaemonProcess(
        settings, tmp_path / "daemon.log", extra_env={"AZURE_STORAGE_CONNECTION_STRING": azurite}
    ).start()
    succeeded: dict[str, Succeeded] = await all_succeed(settings, requests, daemon)

    train, evaluation = succeeded["azure-parquet"].dataset_sources
    assert (train.role, train.kind, evaluation.role, evaluation.kind) == (
        "train",
        "object_storage",
        "eval",
        "object_storage",
    )
    assert [f.path for f in train.files] == [
        f"abfs://{CONTAINER}/curated/chat/part-0.parquet",
        f"abfs://{CONTAINER}/curated/chat/part-1.parquet",
    ]
    assert evaluation.files[0].path == f"az://{CONTAINER}/curated/eval.jsonl"
    assert all(f.etag and f.size for f in train.files + evaluation.files)
    assert "eval_loss" in succeeded["azure-parquet"].metrics
    [stream] = succeeded["azure-stream"].dataset_sources
    assert stream.kind == "object_storage" and stream.files[0].path == f"az://{CONTAINER}/curated/stream.jsonl"

    card = published.commits("results/azure-parquet")[0].files["README.md"].decode()
    assert "## Training data" in card and train.files[0].etag in card
