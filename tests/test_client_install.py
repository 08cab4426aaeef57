"""The client install (issue 49): `client/` builds a wheel, `adapterd-client`, holding this repository's
`schemas` package and asking for pydantic, aiokafka (with its snappy, lz4 and zstd extras: issue 61), cryptography and
confusable-homoglyphs only. Installed into a fresh environment with the network off, it brings a `schemas` that decodes
requests and events, an aiokafka that reads every codec Kafka has, and no torch, TRL, transformers,
PEFT or datasets, nor the daemon.

The wheel is built in the test (`uv build --offline --wheel client`). Its dependencies come from a
folder of wheels the test packs from this environment's own installed copies (their RECORD files say
which files are theirs), so the install resolves with `--no-index` and nothing is downloaded."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).parents[1]
TRAINING_STACK = ("torch", "transformers", "trl", "peft", "datasets", "accelerate", "daemon", "handlers")

pytestmark = pytest.mark.skipif(shutil.which("uv") is None, reason="builds and installs with uv")


def closure(requirements: list[str]) -> dict[str, metadata.Distribution]:
    """The installed distributions these requirements need, with theirs, markers evaluated here."""
    found: dict[str, metadata.Distribution] = {}
    extras: dict[str, set[str]] = {}  # the extras of each asked for so far ("" its plain requirements)
    pending = [(Requirement(text), {""}) for text in requirements]  # with the extras of who asks for it
    while pending:
        requirement, asked_with = pending.pop()
        if requirement.marker is not None and not any(
            requirement.marker.evaluate({"extra": extra}) for extra in asked_with
        ):
            continue
        name = canonicalize_name(requirement.name)
        wanted = {"", *requirement.extras}
        if wanted <= extras.get(name, set()):
            continue
        extras[name] = extras.get(name, set()) | wanted
        found[name] = metadata.distribution(name)
        pending += [(Requirement(text), wanted) for text in found[name].requires or []]
    return found


def pack(distribution: metadata.Distribution, folder: Path) -> Path:
    """An installed distribution as a wheel again: the files its RECORD lists (scripts and bytecode
    left out), under its own WHEEL tag, with a RECORD of their hashes."""
    tags = [
        line.split(": ", 1)[1]
        for line in (distribution.read_text("WHEEL") or "").splitlines()
        if line.startswith("Tag: ")
    ]
    # A universal wheel lists py2 first (confusable-homoglyphs): the one this Python installs names py3 or cp3.
    tag = next((tag for tag in tags if tag.startswith(("py3", "cp3"))), tags[0])
    name = canonicalize_name(distribution.metadata["Name"]).replace("-", "_")
    wheel = folder / f"{name}-{distribution.version}-{tag}.whl"
    rows = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        record = None
        for file in distribution.files or []:
            path = str(file)
            if path.startswith("..") or "__pycache__" in path or path.endswith(".pyc"):
                continue
            if path.endswith(".dist-info/RECORD"):
                record = path
                continue
            data = Path(str(file.locate())).read_bytes()
            archive.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append((path, f"sha256={digest}", str(len(data))))
        assert record is not None, distribution.metadata["Name"]
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows([*rows, (record, "", "")])
        archive.writestr(record, text.getvalue())
    return wheel


def test_the_client_wheel_installs_offline_with_schemas_and_none_of_the_training_stack(tmp_path: Path) -> None:
    built = subprocess.run(
        ["uv", "build", "--offline", "--wheel", str(ROOT / "client"), "-o", str(tmp_path / "dist")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    [wheel] = (tmp_path / "dist").glob("adapterd_client-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        requires = [
            line.split(": ", 1)[1]
            for line in archive.read(next(n for n in names if n.endswith("METADATA"))).decode().splitlines()
            if line.startswith("Requires-Dist: ")
        ]
    assert {canonicalize_name(Requirement(text).name) for text in requires} == {
        "pydantic",
        "aiokafka",
        "cryptography",
        "confusable-homoglyphs",
    }
    assert {name.split("/")[0] for name in names} == {
        "schemas",
        wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info",
    }
    assert {path.name for path in (ROOT / "schemas").glob("*.py")} <= {
        name.split("/")[1] for name in names if name.count("/") == 1
    }

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    needed = closure(requires)
    for distribution in needed.values():
        pack(distribution, wheels)
    environment = tmp_path / "fresh"
    made = subprocess.run(
        ["uv", "venv", "--offline", "--python", sys.executable, str(environment)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    python = environment / "bin" / "python"
    installed = subprocess.run(
        [
            "uv",
            "pip",
            "install",
            "--offline",
            "--no-index",
            "--find-links",
            str(wheels),
            "--python",
            str(python),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr

    listed = subprocess.run(
        ["uv", "pip", "list", "--python", str(python), "--format", "json"], capture_output=True, text=True, timeout=60
    )
    assert {canonicalize_name(row["name"]) for row in json.loads(listed.stdout)} == {"adapterd-client", *needed}
    probe = f"""
import importlib.util, json, pathlib, schemas
from schemas import RequestBase, decode_request, parse_event
request = decode_request(pathlib.Path({str(ROOT / "schemas" / "examples" / "sft.json")!r}).read_bytes())
assert isinstance(request, RequestBase), request
# A credential-named key in lookalikes (Cyrillic а) is refused there too: the confusables came along.
document = json.loads(pathlib.Path({str(ROOT / "schemas" / "examples" / "sft.json")!r}).read_text())
document["metadata"] = {{"p\u0430ssword": "hunter2"}}
refused = decode_request(json.dumps(document).encode())
assert not isinstance(refused, RequestBase), refused
import aiokafka.codec
print(json.dumps({{"schemas": schemas.__file__, "request": request.request_id,
                  "codecs": [aiokafka.codec.has_gzip(), aiokafka.codec.has_snappy(), aiokafka.codec.has_lz4(), aiokafka.codec.has_zstd()],
                  "absent": [name for name in {TRAINING_STACK!r} if importlib.util.find_spec(name) is None]}}))
"""  # noqa: E501 (a script's text, run as written)
    ran = subprocess.run(
        [str(python), "-c", probe],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    said = json.loads(ran.stdout)
    assert said["schemas"].startswith(str(environment)) and said["request"] == "example-sft-1"
    assert said["absent"] == list(TRAINING_STACK)
    assert said["codecs"] == [True, True, True, True]  # every codec Kafka has: gzip, snappy, lz4, zstd
