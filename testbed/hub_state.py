"""The local Hub's state (`testbed/hub_server.py`): repos, their commits and branches, the requests
seen and the faults to inject. `testbed/hub_http.py` reads and changes it to answer requests; tests
read it through `HubServer`, which adds the HTTP server around it.
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


@dataclass
class Commit:
    sha: str
    parent: str | None
    title: str
    description: str
    files: dict[str, bytes]
    date: str


@dataclass
class PullRequest:
    num: int
    title: str  # the opening commit's summary, as the Hub titles it
    created_at: str

    @property
    def ref(self) -> str:
        return f"refs/pr/{self.num}"


@dataclass
class Repo:
    repo_type: str  # "model" or "dataset"
    repo_id: str
    private: bool
    branches: dict[str, str] = field(default_factory=dict)  # pull requests' heads too, as refs/pr/N
    commits: dict[str, Commit] = field(default_factory=dict)
    pulls: list[PullRequest] = field(default_factory=list)  # numbered from 1, as the Hub's discussions are

    def resolve(self, revision: str) -> Commit | None:
        sha = self.branches.get(revision, revision)
        return self.commits.get(sha)

    def history(self, revision: str) -> list[Commit]:
        commit, out = self.resolve(revision), []
        while commit is not None:
            out.append(commit)
            commit = self.commits.get(commit.parent) if commit.parent else None
        return out


@dataclass
class Fault:
    """Answer `times` matching requests with `status` (and `headers`) instead of serving them."""

    method: str
    path_pattern: str
    status: int
    times: int = 1
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    answered: int = 0  # faulted requests answered so far (a delayed one counts once its answer is sent)


@dataclass
class Slow:
    """Serve matching requests as usual, but each only after `delay_s`: a Hub slow to answer (reads
    of safetensors headers, say), unlike a `Fault`, which answers in the Hub's place."""

    method: str
    path_pattern: str
    delay_s: float
    served: int = 0  # matching requests that have waited their delay


@dataclass
class HubState:
    repos: dict[tuple[str, str], Repo] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    slow: list[Slow] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)
    # Tokens the Hub knows, each with what `whoami` says of it; while empty, every request is one
    # user's (adapterd-test), whatever its token, as most tests need.
    tokens: dict[str, dict[str, Any]] = field(default_factory=dict)

    # What tests inspect and arrange.

    def fail(self, method: str, path_pattern: str, status: int, times: int = 1, **kw: Any) -> Fault:
        fault = Fault(method, path_pattern, status, times, **kw)
        with self.lock:
            self.faults.append(fault)
        return fault

    def slow_down(self, method: str, path_pattern: str, delay_s: float) -> Slow:
        """From now on, every request matching `method` and `path_pattern` is answered `delay_s` late."""
        slow = Slow(method, path_pattern, delay_s)
        with self.lock:
            self.slow.append(slow)
        return slow

    def delay(self, method: str, path: str) -> float:
        """How long to wait before answering this request (the sum of the matching `Slow`s)."""
        with self.lock:
            matching = [slow for slow in self.slow if slow.method == method and re.search(slow.path_pattern, path)]
            for slow in matching:
                slow.served += 1
        return sum(slow.delay_s for slow in matching)

    def put_files(self, repo_id: str, files: dict[str, bytes], title: str = "files") -> Commit:
        """Commit `files` to a model repo's main (created if need be), as an upload would."""
        with self.lock:
            repo = self.create_repo(repo_id)
            commit = new_commit(repo, repo.resolve("main"), title, "", files)
            repo.branches["main"] = commit.sha
            return commit

    def repo(self, repo_id: str, repo_type: str = "model") -> Repo:
        with self.lock:
            return self.repos[(repo_type, repo_id)]

    def pulls(self, repo_id: str, repo_type: str = "model") -> list[PullRequest]:
        with self.lock:
            key = (repo_type, repo_id)
            return list(self.repos[key].pulls) if key in self.repos else []

    def commits(self, repo_id: str, repo_type: str = "model", revision: str = "main") -> list[Commit]:
        """A repo's commits on a branch, newest first, excluding the initial empty commit."""
        with self.lock:
            key = (repo_type, repo_id)
            if key not in self.repos:
                return []
            return [c for c in self.repos[key].history(revision) if c.parent is not None]

    def create_repo(self, repo_id: str, repo_type: str = "model", private: bool = False) -> Repo:
        with self.lock:
            key = (repo_type, repo_id)
            if key not in self.repos:
                repo = Repo(repo_type, repo_id, private)
                initial = new_commit(
                    repo,
                    None,
                    "initial commit",
                    "",
                    {".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"},
                )
                repo.branches["main"] = initial.sha
                self.repos[key] = repo
            return self.repos[key]

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.times > 0 and fault.method == method and re.search(fault.path_pattern, path):
                    fault.times -= 1
                    return fault
        return None


def new_commit(repo: Repo, parent: Commit | None, title: str, description: str, files: dict[str, bytes]) -> Commit:
    date = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    seed = f"{repo.repo_id}|{parent.sha if parent else ''}|{title}|{date}|{len(repo.commits)}".encode()
    for path in sorted(files):
        seed += path.encode() + hashlib.sha256(files[path]).digest()
    commit = Commit(hashlib.sha1(seed).hexdigest(), parent.sha if parent else None, title, description, files, date)
    repo.commits[commit.sha] = commit
    return commit
