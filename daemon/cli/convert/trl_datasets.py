"""The dataset keys of a `trl` CLI config: trl.ScriptArguments' dataset_* keys, or a
trl.DatasetMixtureConfig `datasets:` mixture, into the request's `dataset`; and the recipe formats
teams start from: the alignment-handbook's `dataset_mixture` (and its older `dataset_mixer` with
`dataset_splits`), open-r1's `dataset_prompt_column`, read as the `datasets:` mixture they mean."""

from __future__ import annotations

import re
from typing import Any

from daemon.cli.convert.ledger import Changed, Dropped, Ledger

# trl.ScriptArguments (every script) and trl.DatasetMixtureConfig (the `datasets:` mixture),
# with their defaults (trl 1.16).
SCRIPT_DEFAULTS: dict[str, Any] = {
    "dataset_name": None,
    "dataset_config": None,
    "dataset_train_split": "train",
    "dataset_test_split": "test",
    "dataset_streaming": False,
    "ignore_bias_buffers": False,
}
MIXTURE_DEFAULTS: dict[str, Any] = {"datasets": [], "streaming": False, "test_split_size": None}
# datasets' packaged builders a `datasets:` entry may name as its `path`, with the files in `data_files`.
FILE_BUILDERS = {"json": "json", "csv": "csv", "parquet": "parquet", "arrow": "arrow"}
OTHER_BUILDERS = {
    "text",
    "pandas",
    "xml",
    "sql",
    "generator",
    "spark",
    "hdf5",
    "imagefolder",
    "audiofolder",
    "videofolder",
    "webdataset",
}
DATASET_CONFIG_KEYS = ("path", "name", "data_dir", "data_files", "split", "columns", "fraction")
URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def carry_dataset(keys: Ledger) -> None:
    """The recipe's rows into the request's `dataset`: first the sources (a handbook mixture, a
    `datasets:` mixture, or `dataset_name`), then what every kind shares, once: streaming, the eval
    set, open-r1's prompt column, and the keys no kind carries."""
    handbook = keys.has("dataset_mixture") or keys.has("dataset_mixer")
    mixture = [] if handbook else (keys.get("datasets") or [])
    streaming_key = "streaming" if mixture else "dataset_streaming"
    if handbook:
        carry_handbook_mixture(keys)
        keys.drop(
            "streaming", "unused: it streams a `datasets` mixture; dataset_streaming streams the handbook's", False
        )
        keys.drop(
            "test_split_size",
            "unused: it splits a `datasets` mixture; the handbook's is dataset_mixture.test_split_size",
            None,
        )
    elif mixture:
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
    keys.drop(
        "ignore_bias_buffers", "a DDP workaround of trl's dpo script; adapterd's trainers have no such switch", False
    )
    carry_prompt_column(keys)
    # trl evaluates on dataset_test_split whenever eval_strategy is not "no".
    evaluates = keys.config.get("eval_strategy", "no") not in ("no", None)
    if not handbook and not mixture:
        if evaluates and "dataset" in keys.request:
            keys.put(
                "dataset.eval_split",
                keys.get("dataset_test_split", SCRIPT_DEFAULTS["dataset_test_split"]),
                "dataset_test_split",
            )
        else:
            keys.drop(
                "dataset_test_split",
                "unused: eval_strategy is 'no', so trl evaluates nothing",
                SCRIPT_DEFAULTS["dataset_test_split"],
            )
    if evaluates and not {"eval_split", "test_split_size"} & set(keys.request.get("dataset", {})):
        keys.drop(
            "eval_strategy",
            "no eval set was carried: give dataset.eval, dataset.eval_split or dataset.test_split_size",
            "no",
        )


def carry_mixture(keys: Ledger, entries: list[Any], prefix: str = "datasets") -> None:
    sources = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or "path" not in entry:
            keys.error(f"dataset.mixture.{index}", f"{prefix}.{index}: a dataset entry is a mapping with a `path`")
            continue
        source = dataset_source(entry["path"], entry.get("data_files"))
        if isinstance(source, str):
            keys.error(f"dataset.mixture.{index}", f"{prefix}.{index}.path: {source}")
            continue
        if entry.get("name") is not None:
            source["config"] = entry["name"]
        if entry.get("split") is not None:
            source["split"] = entry["split"]
        if entry.get("fraction") is not None:
            source["proportion"] = entry["fraction"]
        for key in entry:
            if key == "data_dir" and entry[key] is not None:
                keys.dropped.append(
                    Dropped(
                        f"{prefix}.{index}.data_dir",
                        "a request names a Hub dataset's files in data_files; give data_files inside that folder",
                    )
                )
            elif key == "columns" and entry[key] is not None:
                keys.dropped.append(
                    Dropped(
                        f"{prefix}.{index}.columns",
                        "adapterd's dataset.columns renames columns, it does not select them; the "
                        "method reads the columns it needs",
                    )
                )
            elif key not in DATASET_CONFIG_KEYS:
                keys.dropped.append(Dropped(f"{prefix}.{index}.{key}", "unknown to trl's DatasetConfig"))
        sources.append(source)
    if len(sources) != len(entries):
        return
    if len(sources) == 1:
        sources[0].pop("proportion", None)
        keys.put("dataset", sources[0], prefix)
        _carry_test_split(keys)
        return
    with_share = [source for source in sources if "proportion" in source]
    if len(with_share) != len(sources):
        keys.error(
            "dataset.mixture",
            f"{prefix}: give every entry a `fraction`; without them trl concatenates whole datasets, "
            "and adapterd's mixture draws from each source by its proportion",
        )
        return
    keys.put("dataset", {"mixture": sources}, prefix)
    keys.changed.append(
        Changed(
            prefix,
            "each entry's fraction of its dataset becomes its share of the mixture: the recipe keeps that "
            "fraction of each dataset's rows and concatenates them, adapterd interleaves the sources by "
            "these shares (normalised), so a source is drawn by its share, not by its size",
        )
    )
    _carry_test_split(keys)


def _carry_test_split(keys: Ledger, key: str = "test_split_size") -> None:
    """A mixture's `test_split_size` (`key`: where the file says it): an eval set carved from its
    rows, as trl's get_dataset and the handbook's get_dataset do."""
    value = _nested(keys, key)
    if keys.get("streaming", False):
        if value is not None:
            keys.dropped.append(
                Dropped(
                    key,
                    "a stream has no length to carve a part of; give an eval set as dataset.eval or dataset.eval_split",
                )
            )
    elif value is not None:
        # trl's own split is unseeded; adapterd's is seeded by training.seed, so every attempt evaluates the same rows.
        keys.put("dataset.test_split_size", value, key)


def _nested(keys: Ledger, key: str) -> Any:
    """The value at a dotted key of the file ("dataset_mixture.test_split_size"), or None."""
    first, _, rest = key.partition(".")
    value = keys.get(first)
    for part in rest.split(".") if rest else []:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def carry_handbook_mixture(keys: Ledger) -> None:
    """The alignment-handbook's mixtures as trl's `datasets:` entries: `dataset_mixture: {datasets:
    [{id, config, split, columns, weight}], seed, test_split_size}`, or the older `dataset_mixer:
    {id: weight}` with `dataset_splits` (its train split, and a test split the eval set is read from).
    The sources and the eval set only: carry_dataset does the rest for every kind of dataset."""
    for key in ("dataset_name", "dataset_config", "dataset_train_split", "dataset_test_split", "datasets"):
        keys.drop(key, "ignored: the recipe's handbook mixture names the datasets", SCRIPT_DEFAULTS.get(key))
    if keys.has("dataset_mixture"):
        mixture = keys.get("dataset_mixture")
        if not isinstance(mixture, dict) or not isinstance(mixture.get("datasets"), list):
            keys.error("dataset", "dataset_mixture: the handbook's mixture is a mapping with a `datasets` list")
            return
        entries = [_handbook_entry(entry) for entry in mixture["datasets"]]
        if mixture.get("seed") is not None:
            keys.dropped.append(
                Dropped("dataset_mixture.seed", "adapterd draws a mixture and carves its eval set with training.seed")
            )
        for extra in set(mixture) - {"datasets", "seed", "test_split_size"}:
            keys.dropped.append(Dropped(f"dataset_mixture.{extra}", "unknown to the handbook's DatasetMixtureConfig"))
        carry_mixture(keys, entries, prefix="dataset_mixture.datasets")
        _carry_test_split(keys, "dataset_mixture.test_split_size")
        return
    mixer, splits = keys.get("dataset_mixer"), keys.get("dataset_splits", ["train", "test"])
    if not isinstance(mixer, dict) or not isinstance(splits, list):
        keys.error(
            "dataset", "dataset_mixer: a mapping of dataset ids to weights, with dataset_splits a list of split names"
        )
        return
    train = [split for split in splits if "train" in str(split)]
    test = [split for split in splits if "test" in str(split)]
    if len(train) != 1:
        keys.error(
            "dataset", f"dataset_splits: {splits} names {len(train)} train splits; adapterd reads one per source"
        )
        return
    carry_mixture(
        keys,
        [{"path": name, "split": train[0], "fraction": weight} for name, weight in mixer.items()],
        prefix="dataset_mixer",
    )
    evaluates = keys.config.get("eval_strategy", "no") not in ("no", None)
    if test and evaluates and len(mixer) == 1 and "dataset" in keys.request:
        keys.put(
            "dataset.eval_split", test[0], "dataset_splits"
        )  # the handbook evaluates on the test split of each dataset
    elif test and evaluates:
        keys.dropped.append(
            Dropped(
                "dataset_splits",
                f"{test[0]}: the test splits of several datasets are no eval set adapterd reads; "
                "give dataset.eval or dataset.test_split_size",
            )
        )


def _handbook_entry(entry: Any) -> Any:
    """A handbook mixture entry ({id, config, split, columns, weight}) as trl's DatasetConfig entry."""
    if not isinstance(entry, dict):
        return entry
    names = {"id": "path", "config": "name", "weight": "fraction"}
    return {names.get(key, key): value for key, value in entry.items()}


def carry_prompt_column(keys: Ledger) -> None:
    """open-r1's `dataset_prompt_column`: the column its GRPO script reads prompts from, renamed onto
    `prompt`; its `system_prompt`, which that script puts before each prompt, has no place in a request."""
    keys.drop(
        "system_prompt",
        "open-r1's GRPO script puts it before each prompt; a request has no system prompt: "
        "put the system message in the rows' prompts",
    )
    column = keys.get("dataset_prompt_column", "prompt")
    if column != "prompt" and "dataset" in keys.request:
        if "mixture" in keys.request["dataset"]:
            # open-r1 reads the column of the mixed rows: renamed in every source, beside its own renames.
            for index, part in enumerate(keys.request["dataset"]["mixture"]):
                part["columns"] = {**part.get("columns", {}), column: "prompt"}
                keys.origin[f"dataset.mixture.{index}.columns"] = "dataset_prompt_column"
        else:
            keys.put("dataset.columns", {column: "prompt"}, "dataset_prompt_column")


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
