"""The HTTP side of the local Hub (`testbed/hub_server.py`, its state in `testbed/hub_state.py`): routes the calls
`huggingface_hub` and `datasets` make (repo creation, preupload, NDJSON commits, revision info, trees, resolve) to the
server's in-memory repos, and answers injected faults first. The bodies of revision info and trees are
`testbed/hub_reads.py`'s; a model card is judged by `testbed/hub_cards.py`."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from testbed.hub_cards import card_problem
from testbed.hub_reads import repo_info, tree_entries
from testbed.hub_state import HubState, PullRequest, Repo, new_commit

# Matched on the path as sent: a revision with slashes (refs/pr/1, a branch a/b) comes quoted as one part.
API = re.compile(
    r"^/api/(models|datasets)/([^/]+/[^/]+?)(?:/(preupload|commit|revision|tree|commits|branch|discussions)(?:/([^/]+)(?:/(.*))?)?)?$"
)
RESOLVE = re.compile(r"^/(datasets/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


class HubRequestHandler(BaseHTTPRequestHandler):
    server_state: HubState
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # the stdlib's name
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up waiting (a read past its deadline, `slow_down`) and closed the connection

    # Plumbing.

    def _send(
        self, status: int, body: Any = None, headers: dict[str, str] | None = None, *, raw: bytes | None = None
    ) -> None:
        payload = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        self.send_response(status)
        if raw is None and body is not None:
            self.send_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _error(self, status: int, code: str, message: str) -> None:
        self._send(status, {"error": message}, {"X-Error-Code": code, "X-Error-Message": message})

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _dispatch(self) -> None:
        hub = self.server_state
        url = urlsplit(self.path)
        path = unquote(url.path)
        with hub.lock:
            hub.requests.append((self.command, path))
        fault = hub.take_fault(self.command, path)
        if fault is not None:
            if fault.delay_s:
                threading.Event().wait(fault.delay_s)
            self._body()
            try:
                self._send(fault.status, {"error": f"injected fault {fault.status}"}, fault.headers)
            except OSError:
                pass  # the client gave up waiting and closed the connection
            fault.answered += 1
            return
        delay = hub.delay(self.command, path)
        if delay:
            threading.Event().wait(delay)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            self._route(url.path, query)
        except KeyError as exc:
            self._error(404, "EntryNotFound", f"not found: {exc}")

    do_GET = do_POST = do_HEAD = do_PUT = _dispatch  # the stdlib's names

    def _route(self, raw_path: str, query: dict[str, str]) -> None:
        hub = self.server_state
        path = unquote(raw_path)
        if path == "/api/repos/create" and self.command == "POST":
            return self._create_repo(json.loads(self._body() or b"{}"))
        if path == "/api/validate-yaml" and self.command == "POST":
            return self._validate_card(json.loads(self._body())["content"])
        if path == "/api/whoami-v2":
            if not hub.tokens:
                return self._send(200, {"type": "user", "name": "adapterd-test", "orgs": [], "auth": {}})
            token = self.headers.get("authorization", "").removeprefix("Bearer ")
            if token not in hub.tokens:
                return self._error(401, "Unauthorized", "Invalid credentials in Authorization header")
            return self._send(200, hub.tokens[token])
        if match := API.match(raw_path):
            kind, repo_id, action, revision, rest = (
                unquote(part) if part is not None else None for part in match.groups()
            )
            assert kind is not None and repo_id is not None
            repo_type = kind[:-1]
            repo = hub.repos.get((repo_type, repo_id))
            if repo is None:
                self._body()
                return self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
            return self._api(repo, action, revision, rest or "", query)
        if match := RESOLVE.match(raw_path):
            datasets, repo_id, revision, file_path = (
                unquote(part) if part is not None else None for part in match.groups()
            )
            assert repo_id is not None and revision is not None and file_path is not None
            repo = hub.repos.get(("dataset" if datasets else "model", repo_id))
            if repo is None:
                return self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
            return self._resolve(repo, revision, file_path)
        self._body()
        self._error(404, "NotFound", f"{self.command} {path} is not served by the test Hub")

    # The API.

    def _create_repo(self, body: dict[str, Any]) -> None:
        hub = self.server_state
        repo_type = body.get("type") or "model"
        repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
        private = body.get("visibility", "private" if body.get("private") else "public") == "private"
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        url = f"{hub.endpoint}/{prefix}{repo_id}"
        with hub.lock:
            exists = (repo_type, repo_id) in hub.repos
            hub.create_repo(repo_id, repo_type, private)
        if exists:
            return self._send(409, {"error": "You already created this repo", "url": url})
        self._send(200, {"url": url, "name": repo_id, "id": repo_id})

    def _validate_card(self, content: str) -> None:
        problem = card_problem(content)
        if problem is None and not content.startswith("---\n"):
            return self._send(200, {"errors": [], "warnings": [{"message": "empty or missing yaml metadata"}]})
        if problem is not None:
            return self._send(400, {"error": problem, "errors": [{"message": problem}]})
        self._send(200, {"errors": [], "warnings": []})

    def _api(self, repo: Repo, action: str | None, revision: str | None, rest: str, query: dict[str, str]) -> None:
        hub = self.server_state
        with hub.lock:
            if action == "branch" and self.command == "POST":
                body = json.loads(self._body() or b"{}")
                start = repo.resolve(body.get("startingPoint") or "main")
                if revision in repo.branches:
                    return self._error(409, "BranchExists", f"branch {revision} exists")
                repo.branches[revision] = start.sha if start else repo.branches["main"]
                return self._send(200, {})
            if action == "preupload":
                body = json.loads(self._body())
                files = [
                    {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
                    for f in body["files"]
                ]
                return self._send(200, {"files": files, "commitOid": repo.branches.get(revision or "main")})
            if action == "commit":
                return self._commit(repo, revision or "main", create_pr=query.get("create_pr") == "1")
            if action == "discussions" and self.command == "GET":
                pulls = [p for p in repo.pulls if query.get("type") in (None, "all", "pull_request")]
                return self._send(
                    200,
                    {
                        "count": len(pulls),
                        "start": 0,
                        "numClosedDiscussions": 0,
                        "discussions": [
                            {
                                "num": p.num,
                                "title": p.title,
                                "status": "open",
                                "isPullRequest": True,
                                "createdAt": p.created_at,
                                "author": {"name": "adapterd-test"},
                                "repo": {"name": repo.repo_id, "type": repo.repo_type},
                            }
                            for p in pulls
                        ],
                    },
                )
            commit = repo.resolve(revision or "main")
            if commit is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            if action in (None, "revision"):
                return self._send(200, repo_info(repo, commit))
            if action == "tree":
                return self._send(
                    200, tree_entries(commit, rest.strip("/"), query.get("recursive") in ("1", "true", "True"))
                )
            if action == "commits":
                return self._send(
                    200,
                    [
                        {
                            "id": c.sha,
                            "title": c.title,
                            "message": f"{c.title}\n\n{c.description}".strip(),
                            "authors": [],
                            "date": c.date,
                        }
                        for c in repo.history(commit.sha)
                    ],
                )
        self._error(404, "NotFound", f"{action} not served")

    def _commit(self, repo: Repo, revision: str, *, create_pr: bool = False) -> None:
        """An NDJSON commit onto `revision`; with `create_pr`, onto a new pull request's ref
        (refs/pr/N, from `revision`'s head), as the Hub opens one."""
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        header = next(line["value"] for line in lines if line["key"] == "header")
        parent = repo.resolve(revision)
        if parent is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        files = dict(parent.files)
        for line in lines:
            if line["key"] == "file":
                value = line["value"]
                files[value["path"]] = (
                    base64.b64decode(value["content"])
                    if value.get("encoding") == "base64"
                    else value["content"].encode()
                )
            elif line["key"] == "deletedFile":
                files.pop(line["value"]["path"], None)
            elif line["key"] == "lfsFile":
                return self._error(400, "LfsNotServed", "the test Hub takes regular uploads only")
        if repo.repo_type == "model" and "README.md" in files:
            # Like the Hub, which refuses a commit whose model card has invalid metadata.
            problem = card_problem(files["README.md"].decode(errors="replace"))
            if problem is not None:
                return self._error(400, "BadRequest", f"Invalid metadata in README.md.\n- {problem}")
        commit = new_commit(repo, parent, header.get("summary", ""), header.get("description", ""), files)
        prefix = "" if repo.repo_type == "model" else f"{repo.repo_type}s/"
        pull_url = None
        if create_pr:
            pull = PullRequest(len(repo.pulls) + 1, header.get("summary", ""), commit.date)
            repo.pulls.append(pull)
            repo.branches[pull.ref] = commit.sha
            pull_url = f"{self.server_state.endpoint}/{prefix}{repo.repo_id}/discussions/{pull.num}"
        else:
            repo.branches[revision] = commit.sha
        url = f"{self.server_state.endpoint}/{prefix}{repo.repo_id}/commit/{commit.sha}"
        self._send(200, {"success": True, "commitOid": commit.sha, "commitUrl": url, "pullRequestUrl": pull_url})

    def _resolve(self, repo: Repo, revision: str, file_path: str) -> None:
        with self.server_state.lock:
            commit = repo.resolve(revision)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        if file_path not in commit.files:
            return self._error(404, "EntryNotFound", f"{file_path} does not exist at {revision}")
        content = commit.files[file_path]
        headers = {
            "X-Repo-Commit": commit.sha,
            "ETag": f'"{hashlib.sha256(content).hexdigest()}"',
            "Content-Type": "application/octet-stream",
        }
        self._send(HTTPStatus.OK, headers=headers, raw=content)
