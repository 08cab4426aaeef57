"""The local Hub's answers about what a repo holds at a commit (`testbed/hub_http.py` sends them):
the revision info `HfApi.model_info` reads, and the tree listing `list_repo_tree` reads."""

from __future__ import annotations

import hashlib
from typing import Any

from testbed.hub_state import Commit, Repo


def repo_info(repo: Repo, commit: Commit) -> dict[str, Any]:
    """A repo at `commit` as the Hub's revision info describes it: id, sha, privacy, its files."""
    return {
        "id": repo.repo_id,
        "_id": repo.repo_id,
        "sha": commit.sha,
        "private": repo.private,
        "lastModified": commit.date,
        "tags": [],
        "siblings": [{"rfilename": p, "size": len(content)} for p, content in sorted(commit.files.items())],
    }


def tree_entries(commit: Commit, folder: str, recursive: bool) -> list[dict[str, Any]]:
    """The files and folders under `folder` at `commit`, as the Hub's tree listing gives them:
    its direct entries, or with `recursive` every one below it."""
    prefix = f"{folder}/" if folder else ""
    entries: dict[str, dict[str, Any]] = {}
    for path, content in sorted(commit.files.items()):
        if not path.startswith(prefix):
            continue
        parts = path[len(prefix) :].split("/")
        for depth in range(1, len(parts)):
            directory = prefix + "/".join(parts[:depth])
            if recursive or depth == 1:
                entries.setdefault(
                    directory,
                    {
                        "type": "directory",
                        "oid": hashlib.sha1(directory.encode()).hexdigest(),
                        "size": 0,
                        "path": directory,
                    },
                )
        if recursive or len(parts) == 1:
            entries[path] = {
                "type": "file",
                "oid": hashlib.sha1(content).hexdigest(),
                "size": len(content),
                "path": path,
            }
    return list(entries.values())
