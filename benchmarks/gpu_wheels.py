"""`python -m benchmarks.gpu_wheels OUT`: the wheels a bare GPU machine lacks, at uv.lock's versions.

The machine lent for GPU checks has Python 3.12 with its own torch (and numpy, pyarrow, pandas,
safetensors, tokenizers, accelerate, ...), no network, and takes packages only as wheels carried
with the tree, 64 MiB at a time. This downloads, for `--python` and `--platform`, the wheels of
`LACKING` (what that image lacks or holds at a version adapterd's lock disagrees with) at the versions
uv.lock pins, and bitsandbytes trimmed to the native library of one CUDA major (`--cuda`; its wheel
ships one per CUDA version, 43 MB in all) as `bnb.zip`, to unpack beside the wheels. It fails when the
folder is over `--limit-mib`. benchmarks/gpu_check.sh installs the folder there and runs the check.
`--plan` prints what it would fetch and fetches nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).parents[1]
# What the daemon and its children import that the GPU image (torch 2.11, transformers 5.17, ...) lacks
# or has at another version than the lock's: seen missing there on 2026-12-04 (../shared/TESTING.md).
LACKING = (
    "trl",
    "transformers",
    "huggingface-hub",
    "hf-xet",
    "datasets",
    "dill",
    "multiprocess",
    "pydantic",
    "pydantic-core",
    "pydantic-settings",
    "python-dotenv",
    "typing-inspection",
    "annotated-types",
    "structlog",
    "aiokafka",
    "async-timeout",
    "google-re2",
    "detect-secrets",
    "tenacity",
    "peft",
    "httpx2",
    "httpcore2",
    "truststore",
    "click",
    "idna",
    "anyio",
    "regex",
    "fsspec",
    "typing-extensions",
    "h11",
    "psutil",
    "prometheus-client",
)
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)


def locked_versions(lock: Path = ROOT / "uv.lock") -> dict[str, str]:
    """Each package's version in uv.lock (one version a package: the lock resolves one)."""
    packages = tomllib.loads(lock.read_text())["package"]
    return {package["name"]: package["version"] for package in packages if "version" in package}


def plan(versions: dict[str, str]) -> list[str]:
    """The requirements to fetch, `name==version`; a name the lock lacks is an error, not a guess."""
    missing = [name for name in (*LACKING, "bitsandbytes") if name not in versions]
    if missing:
        raise SystemExit(f"not in uv.lock: {', '.join(missing)}")
    return [f"{name}=={versions[name]}" for name in (*LACKING, "bitsandbytes")]


def pip() -> list[str]:
    """This interpreter's pip, or (in a uv environment, which has none) pip run by uvx."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    if shutil.which("uvx") is not None:
        return ["uvx", "pip"]
    raise SystemExit(
        "no pip: run this with an interpreter that has pip (python3 -m benchmarks.gpu_wheels), or install uv"
    )


def download(requirements: list[str], out: Path, python: str, platforms: tuple[str, ...]) -> None:
    platform_args = [arg for platform in platforms for arg in ("--platform", platform)]
    for requirement in requirements:  # one at a time: pip stops at the first it cannot find, naming it
        subprocess.run(
            [
                *pip(),
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                python,
                "--implementation",
                "cp",
                *platform_args,
                "-d",
                str(out),
                requirement,
            ],
            check=True,
        )


def trim_bitsandbytes(out: Path, cuda_major: str) -> Path:
    """bitsandbytes' wheel unpacked, its native libraries only the CPU one and those of one CUDA major, as `bnb.zip`."""
    [wheel] = out.glob("bitsandbytes-*.whl")
    zipped = out / "bnb.zip"
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(zipped, "w", zipfile.ZIP_DEFLATED) as target:
        for item in source.infolist():
            name = Path(item.filename).name
            if name.startswith("libbitsandbytes_") and not name.startswith(
                ("libbitsandbytes_cpu", f"libbitsandbytes_cuda{cuda_major}")
            ):
                continue
            target.writestr(item, source.read(item))
    wheel.unlink()
    return zipped


def size_mib(folder: Path) -> float:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path, nargs="?", default=ROOT / ".gpu")
    parser.add_argument("--python", default="3.12")
    parser.add_argument("--platform", action="append", help="a wheel platform tag (repeat); default: manylinux x86-64")
    parser.add_argument(
        "--cuda", default="13", help="the CUDA major of the machine's torch: bitsandbytes keeps only that library"
    )
    parser.add_argument("--limit-mib", type=float, default=64.0, help="what the device tool carries at once")
    parser.add_argument("--plan", action="store_true", help="print the requirements and fetch nothing")
    args = parser.parse_args(argv)
    requirements = plan(locked_versions())
    if args.plan:
        print("\n".join(requirements))
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        staging = Path(scratch) / "wheels"
        download(requirements, staging, args.python, tuple(args.platform or PLATFORMS))
        trim_bitsandbytes(staging, args.cuda)
        if args.out.exists():
            shutil.rmtree(args.out)
        shutil.copytree(staging, args.out)
    size = size_mib(args.out)
    print(
        f"{len(list(args.out.glob('*.whl')))} wheels and bnb.zip in {args.out}: {size:.1f} "
        f"MiB (limit {args.limit_mib:.0f})"
    )
    return 0 if size <= args.limit_mib else 1


if __name__ == "__main__":
    sys.exit(main())
