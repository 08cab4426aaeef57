"""The client install (issue 49): `client/` builds a wheel, `adapterd-client`, holding this repository's
`schemas` package, installed as `adapterd_schemas` (issue 63: `schemas` is a name any team's project may have), and
asking for pydantic, aiokafka (with its snappy, lz4 and zstd extras: issue 61), cryptography and
confusable-homoglyphs only. Installed into a fresh environment with the network off, it brings a `schemas` that decodes
requests and events, an aiokafka that reads every codec Kafka has, and no torch, TRL, transformers,
PEFT or datasets, nor the daemon. The old name, `schemas`, stays for a release as a deprecated alias
(client/schemas_shim/): it warns on import and gives adapterd_schemas's very modules, so a class is one class
under both names.

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


def test_the_client_wheel_installs_offline_with_adapterd_schemas_and_none_of_the_training_stack(tmp_path: Path) -> None:
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
        "adapterd_schemas",
        "schemas",  # the deprecated alias alone
        wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info",
    }
    assert {path.name for path in (ROOT / "schemas").glob("*.py")} <= {
        name.split("/")[1] for name in names if name.count("/") == 1 and name.startswith("adapterd_schemas/")
    }
    assert [name for name in names if name.startswith("schemas/")] == ["schemas/__init__.py"]  # no second copy

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
import importlib.util, json, pathlib, sys, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import adapterd_schemas
    from adapterd_schemas import RequestBase, decode_request, parse_event
    from adapterd_schemas.signing import EventKeys
current = [str(warning.message) for warning in caught]
request = decode_request(pathlib.Path({str(ROOT / "schemas" / "examples" / "sft.json")!r}).read_bytes())
assert isinstance(request, RequestBase), request
# A credential-named key in lookalikes (Cyrillic а) is refused there too: the confusables came along.
document = json.loads(pathlib.Path({str(ROOT / "schemas" / "examples" / "sft.json")!r}).read_text())
document["metadata"] = {{"p\u0430ssword": "hunter2"}}
refused = decode_request(json.dumps(document).encode())
assert not isinstance(refused, RequestBase), refused
# The old name: warned of once, and the very same modules (a second copy would hold other classes).
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import schemas
    from schemas import RequestBase as OldBase, decode_request as old_decode
    import schemas.signing
    from schemas.events import Progress
legacy = [(warning.category.__name__, str(warning.message)) for warning in caught]
old_request = old_decode(pathlib.Path({str(ROOT / "schemas" / "examples" / "sft.json")!r}).read_bytes())
same = [schemas is adapterd_schemas, schemas.signing is adapterd_schemas.signing, OldBase is RequestBase,
        schemas.signing.EventKeys is EventKeys, Progress is adapterd_schemas.events.Progress,
        isinstance(old_request, RequestBase), adapterd_schemas.signing.__spec__.name == "adapterd_schemas.signing",
        all(module is sys.modules["adapterd_schemas" + name[len("schemas"):]]
            for name, module in list(sys.modules.items()) if name.split(".")[0] == "schemas")]
import aiokafka.codec
print(json.dumps({{"schemas": adapterd_schemas.__file__, "request": request.request_id,
                  "current": current, "legacy": legacy, "same": same,
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
    assert said["current"] == []  # adapterd_schemas imports without a warning
    [(category, message)] = said["legacy"]  # `schemas`: one warning, however many of its modules are imported
    assert category == "DeprecationWarning" and "adapterd_schemas" in message and "0.3.0" in message, message
    assert said["same"] == [True] * 8, said["same"]

    # Under Python's default filters the warning shows where a script imports the old name.
    shown = subprocess.run(
        [str(python), "-c", "import schemas.signing"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0 and shown.stderr.count("DeprecationWarning") == 1, shown.stderr
    assert "<string>:1: DeprecationWarning" in shown.stderr, shown.stderr
