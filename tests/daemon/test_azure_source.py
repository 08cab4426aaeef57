"""Datasets in Azure Blob Storage, end to end through the daemon, as S3 and GCS are: Parquet by an
`abfs://` glob with an eval set from an `az://` JSON Lines file, and a streamed `az://` source,
read with adlfs from Azurite on the loopback. The credentials are the host's own
(AZURE_STORAGE_CONNECTION_STRING in the daemon's environment), never the request's; each
`succeeded` records the blobs' ETags and sizes, and the model card names them."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from daemon.settings import Settings
from schemas import Succeeded
from tests.helpers import CHAT_ROWS, sft_request, submit, terminal_events
from tests.hub_server import HubServer
from tests.processes import DaemonProcess

CONTAINER = "ml-data"


def parquet(rows: list[dict[str, object]]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    return buffer.getvalue()


def jsonl(rows: list[dict[str, object]]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_azure_parquet_glob_eval_source_and_streaming(published: HubServer, settings: Settings, azurite: str, tmp_path: Path) -> None:
    import adlfs

    fs = adlfs.AzureBlobFileSystem(connection_string=azurite)
    if not fs.exists(CONTAINER):
        fs.mkdir(CONTAINER)
    fs.pipe(f"{CONTAINER}/curated/chat/part-0.parquet", parquet(CHAT_ROWS[:3]))
    fs.pipe(f"{CONTAINER}/curated/chat/part-1.parquet", parquet(CHAT_ROWS[3:]))
    fs.pipe(f"{CONTAINER}/curated/eval.jsonl", jsonl(CHAT_ROWS[:2]))
    fs.pipe(f"{CONTAINER}/curated/stream.jsonl", jsonl(CHAT_ROWS))
    settings = settings.model_copy(update={"allowed_dataset_urls": [f"abfs://{CONTAINER}/curated/*", f"az://{CONTAINER}/curated/*"]})
    training = {"max_steps": 3, "learning_rate": 1e-2, "per_device_train_batch_size": 2}
    requests = {
        "azure-parquet": sft_request("azure-parquet", dataset={"url": f"abfs://{CONTAINER}/curated/chat/*.parquet", "eval": {"url": f"az://{CONTAINER}/curated/eval.jsonl"}},
                                     training={**training, "eval_strategy": "steps", "eval_steps": 3}),
        "azure-stream": sft_request("azure-stream", dataset={"url": f"az://{CONTAINER}/curated/stream.jsonl", "streaming": True}, training=training),
    }
    daemon = DaemonProcess(settings, tmp_path / "daemon.log", extra_env={"AZURE_STORAGE_CONNECTION_STRING": azurite}).start()
    try:
        for request in requests.values():
            await submit(settings, request)
        events = await terminal_events(settings, set(requests), timeout_s=800)
    finally:
        daemon.stop()
    done = {rid: evs[-1] for rid, evs in events.items()}
    assert all(isinstance(event, Succeeded) for event in done.values()), done
    succeeded: dict[str, Succeeded] = done  # type: ignore[assignment]

    train, evaluation = succeeded["azure-parquet"].dataset_sources
    assert (train.role, train.kind, evaluation.role, evaluation.kind) == ("train", "object_storage", "eval", "object_storage")
    assert [f.path for f in train.files] == [f"abfs://{CONTAINER}/curated/chat/part-0.parquet", f"abfs://{CONTAINER}/curated/chat/part-1.parquet"]
    assert evaluation.files[0].path == f"az://{CONTAINER}/curated/eval.jsonl"
    assert all(f.etag and f.size for f in train.files + evaluation.files)
    assert "eval_loss" in succeeded["azure-parquet"].metrics
    [stream] = succeeded["azure-stream"].dataset_sources
    assert stream.kind == "object_storage" and stream.files[0].path == f"az://{CONTAINER}/curated/stream.jsonl"

    card = published.commits("results/azure-parquet")[0].files["README.md"].decode()
    assert "## Training data" in card and train.files[0].etag in card
