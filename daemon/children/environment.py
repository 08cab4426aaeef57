"""What a job's child sees of the daemon's environment: an allowlist, never the whole of it.

A child runs a request's training (its chat template, its reward functions, the libraries it
names): whatever the daemon's environment holds, a job could read. So a child gets only:

- the process basics: PATH, HOME, the locale, the temporary folder, the Python and virtual
  environment, the CA bundles and proxies the Hub needs;
- the training stack's own settings: HF_* (the Hub endpoint and the daemon's token are set apart,
  daemon/children/warm.py), CUDA_*, NCCL_*, TORCH_*, TRANSFORMERS_*, thread and allocator settings...;
- the credentials of the object stores datasets may come from: AWS_* only when the operator
  allows an s3:// dataset URL (`allowed_dataset_urls`), GOOGLE_*/gcloud's for gs://, AZURE_* and
  managed identity's for az:// and abfs://, as s3fs, gcsfs and adlfs read them from the
  environment (`dataset_storage_options` holds endpoints, not credentials). Every child gets them
  when the scheme is allowed: a child is started, or its fork server is, before its job is known;
- MLFLOW_* when the operator set a tracking server (its token or user and password);
- what the operator lists in `child_env` (names, or prefixes ending in `*`).

Never the rest: ADAPTERD_* (the daemon's own settings, its logs token among them), systemd's
(NOTIFY_SOCKET, CREDENTIALS_DIRECTORY: the folder of the daemon's credential files), object-store
credentials of a scheme no dataset may use, and any other variable (SOME_SECRET=...).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from daemon.settings import Settings

NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "TEMP",
        "TMP",
        "VIRTUAL_ENV",
        "LD_LIBRARY_PATH",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "all_proxy",
        "XDG_CACHE_HOME",
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
        "HUGGINGFACE_HUB_CACHE",
        "HUGGINGFACE_ASSETS_CACHE",
        "TOKENIZERS_PARALLELISM",
    }
)
PREFIXES = (
    "LC_",
    "PYTHON",
    "HF_",
    "CUDA_",
    "NVIDIA_",
    "NCCL_",
    "CUBLAS_",
    "CUDNN_",
    "TORCH",
    "PYTORCH_",
    "TRITON_",
    "TRANSFORMERS_",
    "ACCELERATE_",
    "BNB_",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "KMP_",
    "GOMP_",
    "MALLOC_",
    "JE_",
    "ARROW_",
    "GCSFS_",
)
# An object store's credentials and settings, by the URL schemes that read it.
STORES: dict[tuple[str, ...], tuple[str, ...]] = {
    ("s3", "s3a"): ("AWS_", "FSSPEC_S3_"),
    ("gs", "gcs"): (
        "GOOGLE_",
        "GCLOUD_",
        "CLOUDSDK_",
        "GCE_METADATA_",
        "STORAGE_EMULATOR_HOST",
        "FSSPEC_GS_",
        "FSSPEC_GCS_",
    ),
    ("az", "abfs", "abfss", "adl"): (
        "AZURE_",
        "IDENTITY_ENDPOINT",
        "IDENTITY_HEADER",
        "MSI_ENDPOINT",
        "MSI_SECRET",
        "FSSPEC_AZ_",
        "FSSPEC_ABFS_",
        "FSSPEC_ABFSS_",
        "FSSPEC_ADL_",
    ),
}


def allowed(settings: Settings) -> tuple[frozenset[str], tuple[str, ...]]:
    """The names and the prefixes a job's child may get of the daemon's environment."""
    schemes = {pattern.partition("://")[0].lower() for pattern in settings.allowed_dataset_urls if "://" in pattern}
    prefixes = [
        *PREFIXES,
        *(prefix for store, store_prefixes in STORES.items() if schemes & set(store) for prefix in store_prefixes),
    ]
    if settings.mlflow_tracking_uri is not None:
        prefixes.append("MLFLOW_")
    names = set(NAMES)
    for entry in settings.child_env:
        if entry.endswith("*"):
            prefixes.append(entry[:-1])
        else:
            names.add(entry)
    return frozenset(names), tuple(prefixes)


def passed_on(environ: Mapping[str, str], settings: Settings) -> dict[str, str]:
    """The variables of `environ` (the daemon's) that a job's child gets."""
    names, prefixes = allowed(settings)
    return {name: value for name, value in environ.items() if name in names or _starts(name, prefixes)}


def _starts(name: str, prefixes: Iterable[str]) -> bool:
    return not name.startswith("ADAPTERD_") and any(name.startswith(prefix) for prefix in prefixes)
