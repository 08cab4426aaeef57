"""The dataset keys of a `trl` CLI config: trl.ScriptArguments' dataset_* keys, or a
trl.DatasetMixtureConfig `datasets:` mixture, into the request's `dataset`."""

from __future__ import annotations

import re
from typing import Any

from daemon.convert.ledger import Dropped, Ledger

# trl.ScriptArguments (every script) and trl.DatasetMixtureConfig (the `datasets:` mixture), with their defaults (trl 1.16).
SCRIPT_DEFAULTS: dict[str, Any] = {
    "dataset_name": None, "dataset_config": None, "dataset_train_split": "train", "dataset_test_split": "test",
    "dataset_streaming": False, "ignore_bias_buffers": False,
}
MIXTURE_DEFAULTS: dict[str, Any] = {"datasets": [], "streaming": False, "test_split_size": None}
# datasets' packaged builders a `datasets:` entry may name as its `path`, with the files in `data_files`.
FILE_BUILDERS = {"json": "json", "csv": "csv", "parquet": "parquet", "arrow": "arrow"}
OTHER_BUILDERS = {"text", "pandas", "xml", "sql", "generator", "spark", "hdf5", "imagefolder", "audiofolder", "videofolder", "webdataset"}
DATASET_CONFIG_KEYS = ("path", "name", "data_dir", "data_files", "split", "columns", "fraction")
URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def carry_dataset(keys: Ledger) -> None:
    mixture = keys.get("datasets") or []
    streaming_key = "streaming" if mixture else "dataset_streaming"
    if mixture:
        for key in ("dataset_name", "dataset_config", "dataset_train_split", "dataset_test_split", "dataset_streaming"):
            keys.drop(key, "ignored by the trl CLI when `datasets` is given", SCRIPT_DEFAULTS[key])
        carry_mixture(keys, mixture if isinstance(mixture, list) else [mixture])
    else:
        keys.drop("streaming", "unused: it streams a `datasets` mixture; dataset_streaming streams dataset_name", False)
        keys.drop("test_split_size", "unused: it splits a `datasets` mixture", None)
        source = dataset_source(keys.get("dataset_name")) if keys.has("dataset_name") else None
        if isinstance(source, str):
            keys.error("dataset", f"dataset_name: {source}")
        elif source is not None:
            keys.put("dataset", source, "dataset_name")
            if keys.has("dataset_config"):
                keys.put("dataset.config", keys.get("dataset_config"), "dataset_config")
            if keys.has("dataset_train_split"):
                keys.put("dataset.split", keys.get("dataset_train_split"), "dataset_train_split")
    if keys.get(streaming_key, False) and "dataset" in keys.request:
        keys.put("dataset.streaming", True, streaming_key)
    keys.drop("ignore_bias_buffers", "a DDP workaround of trl's dpo script; adapterd's trainers have no such switch", False)
    # trl evaluates on dataset_test_split whenever eval_strategy is not "no".
    evaluates = keys.config.get("eval_strategy", "no") not in ("no", None)
    if evaluates and not mixture and "dataset" in keys.request:
        keys.put("dataset.eval_split", keys.get("dataset_test_split", SCRIPT_DEFAULTS["dataset_test_split"]), "dataset_test_split")
    elif not mixture:
        keys.drop("dataset_test_split", "unused: eval_strategy is 'no', so trl evaluates nothing", SCRIPT_DEFAULTS["dataset_test_split"])
    if evaluates and not {"eval_split", "test_split_size"} & set(keys.request.get("dataset", {})):
        keys.drop("eval_strategy", "no eval set was carried: give dataset.eval, dataset.eval_split or dataset.test_split_size", "no")

def carry_mixture(keys: Ledger, entries: list[Any]) -> None:
    sources = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or "path" not in entry:
            keys.error(f"dataset.mixture.{index}", f"datasets.{index}: a dataset entry is a mapping with a `path`")
            continue
        source = dataset_source(entry["path"], entry.get("data_files"))
        if isinstance(source, str):
            keys.error(f"dataset.mixture.{index}", f"datasets.{index}.path: {source}")
            continue
        if entry.get("name") is not None:
            source["config"] = entry["name"]
        if entry.get("split") is not None:
            source["split"] = entry["split"]
        if entry.get("fraction") is not None:
            source["proportion"] = entry["fraction"]
        for key in entry:
            if key == "data_dir" and entry[key] is not None:
                keys.dropped.append(Dropped(f"datasets.{index}.data_dir", "a request names a Hub dataset's files in data_files; give data_files inside that folder"))
            elif key == "columns" and entry[key] is not None:
                keys.dropped.append(Dropped(f"datasets.{index}.columns", "adapterd's dataset.columns renames columns, it does not select them; the method reads the columns it needs"))
            elif key not in DATASET_CONFIG_KEYS:
                keys.dropped.append(Dropped(f"datasets.{index}.{key}", "unknown to trl's DatasetConfig"))
        sources.append(source)
    if len(sources) != len(entries):
        return
    if len(sources) == 1:
        sources[0].pop("proportion", None)
        keys.put("dataset", sources[0], "datasets")
        _carry_test_split(keys)
        return
    with_share = [source for source in sources if "proportion" in source]
    if len(with_share) != len(sources):
        keys.error("dataset.mixture", "datasets: give every entry a `fraction`; without them trl concatenates whole datasets, "
                                      "and adapterd's mixture draws from each source by its proportion")
        return
    keys.put("dataset", {"mixture": sources}, "datasets")
    _carry_test_split(keys)


def _carry_test_split(keys: Ledger) -> None:
    """A mixture's `test_split_size`: an eval set carved from its rows, as trl's get_dataset does."""
    if keys.get("streaming", False):
        keys.drop("test_split_size", "a stream has no length to carve a fraction of; give an eval set as dataset.eval or dataset.eval_split", None)
    elif keys.get("test_split_size") is not None:
        # trl's own split is unseeded; adapterd's is seeded by training.seed, so every attempt evaluates the same rows.
        keys.put("dataset.test_split_size", keys.get("test_split_size"), "test_split_size")


def dataset_source(name: Any, data_files: Any = None) -> dict[str, Any] | str:
    """One dataset source from trl's dataset name or mixture entry `path`: a Hub id, a URL or an
    absolute path; a file builder (json, csv, parquet, arrow) with its data_files. A string: why not."""
    if not isinstance(name, str):
        return f"{name!r} is not a dataset name"
    if name in FILE_BUILDERS:
        if data_files is None:
            return f"the {name} builder reads data_files, and this entry has none"
        source: dict[str, Any] = {"format": FILE_BUILDERS[name]}
        if isinstance(data_files, str):
            source["url"] = data_files
        elif isinstance(data_files, list):
            source["files"] = {"train": data_files}
        else:
            source["files"] = data_files
        return source
    if name in OTHER_BUILDERS:
        return f"the {name} builder: adapterd reads json, jsonl, parquet, csv and arrow files"
    if name.startswith("/") or URL.match(name):
        return {"url": name}
    source = {"id": name}
    if data_files is not None:
        source["data_files"] = data_files
    return source
