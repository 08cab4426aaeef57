"""The package boundaries, read from the source: every import statement of every module, the ones
inside functions too, so an import that only runs on some path cannot slip through.

- `daemon/` never imports the training stack: the parent stays small and starts fast, and torch
  and TRL load only in the child.
- Of `handlers/` the daemon imports `handlers/protocol.py` alone (the job spec and the status
  pipe's messages), which imports pydantic, schemas and the standard library only, and loads none
  of the training stack.
- `handlers/` and `schemas/` never import `daemon`, and `schemas/` never imports `handlers`: the
  child and the wire contract stand alone.
- A method's module (handlers/methods/) imports no other method's: what two share is said once,
  in handlers/toolkit/ or beside them.
- handlers/ in layers by where the code runs: the entry points the daemon starts (handlers/child/)
  above the methods (handlers/methods/), above the toolkit they stand on (handlers/toolkit/). Nothing
  imports an entry point but another entry point, and the toolkit imports no method.
- `schemas/`'s modules import each other relatively, never as `schemas.`: the client wheel installs
  them under another name, `adapterd_schemas`.
- `schemas/` depends on pydantic (and the standard library) only, so producers and consumers can
  import it; `schemas/regex.py` alone may use RE2 when it is installed, and without it the
  contract gives the same verdicts; `schemas/signing.py` alone imports `cryptography`, inside the
  functions that read keys, sign and verify events, so only a reader that verifies loads it; and
  `schemas/skeleton.py` alone imports confusable-homoglyphs (issue 46: credential-named keys judged
  by their Unicode skeleton need UTS #39's confusables table, which that small pure-Python package
  ships as data; a producer installs it with schemas).
- Nothing but the tests imports `tests`: the benchmarks and the shipped packages run on `testbed/`
  (the local Hub, the daemon as a process, the topics' client), which the tests share.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
TRAINING_STACK = {"torch", "transformers", "trl", "peft", "datasets", "accelerate", "bitsandbytes", "lm_eval"}


def imported_packages(path: Path) -> set[str]:
    """The top-level package of every absolute import in the module, at any depth of the tree."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_the_walk_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import torch.nn\n    from trl import SFTTrainer\n")
    assert imported_packages(module) == {"torch", "trl"}


@pytest.mark.parametrize("path", modules("daemon"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_daemon_never_imports_the_training_stack(path: Path) -> None:
    assert not imported_packages(path) & TRAINING_STACK


@pytest.mark.parametrize("path", modules("handlers") + modules("schemas"), ids=lambda p: str(p.relative_to(ROOT)))
def test_handlers_and_schemas_never_import_the_daemon(path: Path) -> None:
    assert "daemon" not in imported_packages(path)


@pytest.mark.parametrize("path", modules("schemas"), ids=lambda p: str(p.relative_to(ROOT)))
def test_schemas_never_import_handlers(path: Path) -> None:
    assert "handlers" not in imported_packages(path)


@pytest.mark.parametrize("path", modules("daemon"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_daemon_imports_only_the_protocol_of_handlers(path: Path) -> None:
    known = {module_name(p) for package in PROJECT for p in modules(package)}
    assert {target for target in project_imports(path, known) if target.split(".")[0] == "handlers"} <= {
        "handlers.protocol"
    }


def test_the_protocol_depends_on_pydantic_schemas_and_the_standard_library_only() -> None:
    outside = {
        name
        for name in imported_packages(ROOT / "handlers" / "protocol.py") - {"pydantic", "schemas", "__future__"}
        if name not in sys.stdlib_module_names
    }
    assert not outside


def test_importing_the_protocol_loads_no_training_stack() -> None:
    """What the daemon imports of handlers/, at run time: the package's own `__init__` included."""
    code = f"import sys, handlers.protocol; print(sorted(m for m in {sorted(TRAINING_STACK)!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("path", modules("handlers/methods"), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_method_imports_no_other_method(path: Path) -> None:
    from schemas.methods import METHODS

    methods = {method.module for method in METHODS.values()}
    known = {module_name(p) for p in modules("handlers")}
    assert not project_imports(path, known) & (methods - {module_name(path)})


# handlers/'s parts that run in a job's child (or start it), lowest first: a part imports only the
# parts below it (and handlers.protocol, beside them all). handlers/contract/ and handlers/fixtures/
# are tooling, held by the tests that say they are never imported at run time.
HANDLER_LAYERS = ["toolkit", "methods", "child"]


def handlers_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "handlers" and len(parts) > 1 and parts[1] in HANDLER_LAYERS else None


@pytest.mark.parametrize(
    "path",
    [path for part in HANDLER_LAYERS for path in modules(f"handlers/{part}")],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_a_handlers_part_imports_only_the_parts_below_it(path: Path) -> None:
    own = handlers_part(module_name(path))
    assert own is not None
    known = {module_name(p) for p in modules("handlers")}
    above = {
        part
        for target in project_imports(path, known)
        if (part := handlers_part(target)) is not None and HANDLER_LAYERS.index(part) > HANDLER_LAYERS.index(own)
    }
    assert not above, f"handlers/{own} imports handlers/{sorted(above)}"


@pytest.mark.parametrize(
    "path",
    [
        *modules("daemon"),
        *modules("benchmarks"),
        *modules("testbed"),
        *(p for part in ("toolkit", "methods", "contract", "fixtures") for p in modules(f"handlers/{part}")),
    ],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_nothing_but_an_entry_point_imports_an_entry_point(path: Path) -> None:
    """handlers/child/ is started by module name (`python -m handlers.child.runner`), never imported
    but by its own modules (the fork server runs the runner's `main` in each child it forks) and the
    tests that run an entry point's `main` in process."""
    known = {module_name(p) for package in PROJECT for p in modules(package)}
    assert not {target for target in project_imports(path, known) if target.startswith("handlers.child.")}


def test_the_entry_points_the_daemon_starts_exist() -> None:
    """The daemon names them as strings (`python -m <entry>`), which no import check sees."""
    import re

    named = {
        match
        for path in modules("daemon") + modules("handlers")
        for match in re.findall(r"[\"(](handlers\.child\.\w+)[\"]", path.read_text())
    }
    assert {
        "handlers.child.runner",
        "handlers.child.forkserver",
        "handlers.child.launch",
        "handlers.child.math_worker",
    } <= named
    for name in named:
        assert (ROOT / f"{name.replace('.', '/')}.py").is_file(), name


@pytest.mark.parametrize(
    "path",
    [*modules("benchmarks"), *modules("testbed"), *modules("daemon"), *modules("handlers")],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_nothing_but_the_tests_imports_the_tests(path: Path) -> None:
    assert "tests" not in imported_packages(path)


@pytest.mark.parametrize("path", modules("schemas"), ids=lambda p: str(p.relative_to(ROOT)))
def test_schemas_import_each_other_relatively(path: Path) -> None:
    # The client wheel installs these files as `adapterd_schemas` (issue 63): an absolute `schemas.` import
    # there would load the deprecated shim, or another project's `schemas`, instead of the package itself.
    assert "schemas" not in imported_packages(path)


@pytest.mark.parametrize("path", modules("schemas"), ids=lambda p: str(p.relative_to(ROOT)))
def test_schemas_depend_on_pydantic_and_the_standard_library_only(path: Path) -> None:
    # regex.py: the engine it prefers, `re` without it; skeleton.py: UTS #39's confusables table,
    # data without code of its own to run (issue 46, credential-named keys in lookalikes); signing.py:
    # checking the fleet's Ed25519 signature needs cryptography, imported inside its functions only
    # (tests/schemas/test_signing.py: importing schemas loads none).
    optional = {"regex.py": {"re2"}, "skeleton.py": {"confusable_homoglyphs"}, "signing.py": {"cryptography"}}.get(
        path.name, set()
    )
    outside = {
        name
        for name in imported_packages(path) - {"pydantic", "schemas", "__future__"} - optional
        if name not in sys.stdlib_module_names
    }
    assert not outside


def test_schemas_give_the_same_verdicts_without_re2() -> None:
    """A producer without google-re2 gets Python's re: the same secret rules and verdicts, and a
    pattern that re cannot compile refused rather than raised (look-around, which RE2 alone
    refuses, is judged by the daemon, which always has RE2)."""
    code = (
        "import sys; sys.modules['re2'] = None\n"
        "from schemas.regex import ENGINE, pattern_problem\n"
        "from schemas.secrets import BUILTIN, secret_kind\n"
        "print(ENGINE, pattern_problem('[') is not None, pattern_problem('a{4294967296}') is not None,"
        " BUILTIN.keys.names_credential('p\u0430ssword'), BUILTIN.keys.may_hold('{\"p\u0430ssword\": 1}'.encode()),"
        " BUILTIN.keys.names_credential('eot_token'),"
        " secret_kind('xoxb-1234567890-abcdefghij'), secret_kind('a prompt about tokens'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split(maxsplit=1)
    assert out == ["re", "True True True True False a Slack token or webhook None\n"]


def test_importing_every_daemon_module_loads_no_training_stack() -> None:
    """The same, at run time: what the modules' imports pull in transitively."""
    names = ", ".join(module_name(p) for p in modules("daemon"))
    code = f"import sys, {names}; print(sorted(m for m in {sorted(TRAINING_STACK)!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


# daemon/'s parts, lowest first: each imports only the parts of the layers below it, so the tree
# reads as the architecture does (docs/architecture.md) and a part can be understood, and tested,
# with what is under it alone. Peers in one layer never import each other. docs/architecture.md lists the parts in
# this order (tests/test_architecture_doc.py): a part added here is added there.
DAEMON_LAYERS: list[set[str]] = [
    {"errors", "executors"},  # the error tree; the bounded pools of worker threads
    # the settings: the TOML file and environment, the Kafka, job and endpoint settings, the fleet's classes and
    # teams, and the source that reads the operator's secret files
    {"settings"},
    {"ops"},  # logs, metrics, the health endpoint, systemd
    {
        "kafka",
        "children",
        "admission",
        "hub",
        "local_broker",
        "store",
    },  # Kafka I/O; the processes that train; admission rules; publishing; a broker for the demo and the tests;
    # the checkpoint store and the host's job folders
    {"decoding"},  # a record of a request decoded by intake's rules, for every reader of requests
    {"table"},  # the table of requests: each request's state from its events, in a compacted topic
    {"resources"},  # what a job needs of the host: slots, memory estimates, shard plans
    {"job"},  # one job's lifecycle
    {"jobs"},  # the scheduler
    {"intake"},  # records into requests for the scheduler, or rejections
    {"fleet"},  # the fleet's one queue, in front of the scheduler (with priority classes)
    {"service"},  # the flat loop
    {"cli"},  # the commands, and what only they use: `adapterd convert`'s converter (cli/convert/)
]


def daemon_part(module: str) -> str | None:
    """The part of daemon/ a module belongs to: its sub-package, or its own name at the top."""
    parts = module.split(".")
    return parts[1] if parts[0] == "daemon" and len(parts) > 1 else None


def test_every_part_of_the_daemon_has_a_layer() -> None:
    parts = {daemon_part(module_name(path)) for path in modules("daemon")} - {None}
    assert parts == set().union(*DAEMON_LAYERS)


@pytest.mark.parametrize("path", modules("daemon"), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_daemon_part_imports_only_the_layers_below_it(path: Path) -> None:
    layer = {part: depth for depth, layer in enumerate(DAEMON_LAYERS) for part in layer}
    own = daemon_part(module_name(path))
    known = {module_name(p) for p in modules("daemon")}
    above = {
        daemon_part(target)
        for target in project_imports(path, known)
        if daemon_part(target) not in (None, own) and layer[daemon_part(target)] >= layer[own]
    }  # type: ignore[index]
    assert not above, f"{own} (layer {layer[own]}) imports {sorted(above)}"  # type: ignore[index]


# Everything that is the project's own Python: the packages and their tests and benchmarks (the
# second test environment, tests/trl_1_12, holds no module of its own).
PROJECT = ("daemon", "schemas", "handlers", "testbed", "tests", "benchmarks")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports(path: Path, known: set[str]) -> set[str]:
    """The project modules a module imports, at any depth of its tree: `from a.b import c` is an
    import of module a.b.c where that is a module, else of a.b (relative imports resolved)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def owner(dotted: str) -> str | None:  # the module a dotted name lives in
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {owner(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found |= {
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else owner(base) for alias in node.names
            }
    return found - {None, name}  # type: ignore[return-value]  # None taken out


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def test_the_cycle_finder_finds_a_cycle_closed_by_a_late_import() -> None:
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_anywhere_in_the_project() -> None:
    """A cycle closed by an import inside a function is still a cycle: each module of it can only
    be understood, and imported first, with the others."""
    paths = [path for package in PROJECT for path in modules(package) if "trl_1_12" not in path.parts]
    known = {module_name(path) for path in paths}
    graph = {module_name(path): project_imports(path, known) for path in paths}
    assert len(graph) > 100 and "daemon.settings" in graph["daemon.cli.options"]  # the walk sees the project
    assert import_cycles(graph) == []


def test_a_jobs_events_are_published_through_jobevents_alone() -> None:
    """daemon/job/events.py is the one place a job's events go out (intake's rejections, which
    are no job's, are sent in batches by `Publisher.send_all`)."""
    publishing = {str(path.relative_to(ROOT)) for path in modules("daemon") if "publisher.publish(" in path.read_text()}
    assert publishing == {"daemon/job/events.py"}
