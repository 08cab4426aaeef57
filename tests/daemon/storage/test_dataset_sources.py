"""Datasets from where pipelines put them, end to end through the daemon: Parquet files in S3 (a real
S3 API server, moto's, read with s3fs), a JSON Lines folder under an allowed local root, a mixture
of a Hub dataset and S3, a streamed S3 source, and an eval set from a source of its own. One daemon,
the five requests submitted together; each `succeeded` says what its rows resolved to."""

import io
import json
from pathlib import Path

import pytest

from daemon.settings import Settings
from schemas import Progress, Succeeded
from testbed.client import submit, terminal_events
from testbed.data import CHAT_DATASET, CHAT_ROWS
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.conftest import S3_CREDENTIALS
from tests.helpers import sft_request

BUCKET = "ml-data"


def put_parquet(endpoint: str, key: str, rows: list[dict[str, object]]) -> None:
    import boto3
    import pyarrow as pa
    import pyarrow.parquet as pq
    import s3fs

    credentials = {
        "aws_access_key_id": S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    }
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **credentials)
    if BUCKET not in [bucket["Name"] for bucket in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=BUCKET)
    fs = s3fs.S3FileSystem(
        key=credentials["aws_access_key_id"],
        secret=credentials["aws_secret_access_key"],
        client_kwargs={"endpoint_url": endpoint},
    )
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    fs.pipe(f"{BUCKET}/{key}", buffer.getvalue())


@pytest.mark.slow
@pytest.mark.timeout(1200)
async def test_object_storage_local_root_mixture_streaming_and_eval_source(
    published: HubServer,
    settings: Settings,
    s3_endpoint: str,
    tmp_path: Path,
) -> None:
    put_parquet(s3_endpoint, "curated/chat/part-0.parquet", CHAT_ROWS[:3])
    put_parquet(s3_endpoint, "curated/chat/part-1.parquet", CHAT_ROWS[3:])
    root = tmp_path / "data"
    (root / "chat").mkdir(parents=True)
    (root / "chat" / "a.jsonl").write_text("".join(json.dumps(row) + "\n" for row in CHAT_ROWS[:4]))
    (root / "chat" / "b.jsonl").write_text("".join(json.dumps(row) + "\n" for row in CHAT_ROWS[4:]))
    (root / "eval.jsonl").write_text("".join(json.dumps(row) + "\n" for row in CHAT_ROWS[:2]))
    settings = settings.model_copy(
        update={
            "allowed_dataset_urls": [f"s3://{BUCKET}/curated/*"],
            "allowed_local_dataset_roots": [root],
            "dataset_storage_options": {"s3": {"client_kwargs": {"endpoint_url": s3_endpoint}}},
        }
    )
    s3_chat = f"s3://{BUCKET}/curated/chat/*.parquet"
    training = {"max_steps": 3, "learning_rate": 1e-2, "per_device_train_batch_size": 2}
    requests = {
        "s3-parquet": sft_request("s3-parquet", dataset={"url": s3_chat}),
        "local-jsonl": sft_request("local-jsonl", dataset={"url": f"{root}/chat/", "format": "jsonl"}),
        "mixture": sft_request(
            "mixture", dataset={"mixture": [{"id": CHAT_DATASET, "proportion": 1}, {"url": s3_chat, "proportion": 3}]}
        ),
        "streaming": sft_request("streaming", dataset={"url": s3_chat, "streaming": True}, training=training),
        "eval-source": sft_request(
            "eval-source",
            dataset={"id": CHAT_DATASET, "eval": {"url": f"{root}/eval.jsonl"}},
            training={**training, "eval_strategy": "steps", "eval_steps": 3},
        ),
    }
    daemon = DaemonProcess(settings, tmp_path / "daemon.log", extra_env=S3_CREDENTIALS).start()
    try:
        for request in requests.values():
            await submit(settings, request)
        events = await terminal_events(settings, set(requests), timeout_s=1000)
    finally:
        daemon.stop()
    done = {rid: evs[-1] for rid, evs in events.items()}
    assert all(isinstance(event, Succeeded) for event in done.values()), done
    succeeded: dict[str, Succeeded] = done  # type: ignore[assignment]

    [s3] = succeeded["s3-parquet"].dataset_sources
    assert s3.kind == "object_storage" and [f.path for f in s3.files] == [
        f"s3://{BUCKET}/curated/chat/part-0.parquet",
        f"s3://{BUCKET}/curated/chat/part-1.parquet",
    ]
    assert all(f.etag and f.size for f in s3.files)

    [local] = succeeded["local-jsonl"].dataset_sources
    assert local.kind == "local" and [Path(f.path).name for f in local.files] == ["a.jsonl", "b.jsonl"]

    hub, storage = succeeded["mixture"].dataset_sources
    assert (hub.kind, hub.proportion, storage.kind, storage.proportion) == ("hub", 0.25, "object_storage", 0.75)
    assert hub.revision == published.repo(CHAT_DATASET, repo_type="dataset").branches["main"]

    streamed = succeeded["streaming"]
    assert streamed.dataset_sources[0].kind == "object_storage" and streamed.dataset_fingerprint
    assert max(e.step for e in events["streaming"] if isinstance(e, Progress)) == 3  # max_steps of a stream

    roles = [(s.role, s.kind) for s in succeeded["eval-source"].dataset_sources]
    assert roles == [("train", "hub"), ("eval", "local")]
    assert "eval_loss" in succeeded["eval-source"].metrics

    # The model card names what the adapter was trained on, with the objects' ETags.
    card = published.commits("results/s3-parquet")[0].files["README.md"].decode()
    assert "## Training data" in card and s3.files[0].etag in card and "base_model: tiny/qwen2-chat" in card
