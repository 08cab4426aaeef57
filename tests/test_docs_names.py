"""Every name the docs give a newcomer exists: each repository path (`daemon/resources/slots.py`,
`tests/daemon/`) that README.md, docs/*.md, deploy/README.md or a docstring of the code names, and
each dotted module or attribute name (`daemon.service.wire`, `schemas.read_event`,
`tests.fakes.FakeConsumer.getmany`) they put in backticks.

Kept to what cannot be mistaken, so that a failure is a stale name and not noise: a path counts when
it starts at one of the repository's folders (not after a `/` or a `.`: `/etc/adapterd/daemon/...`
is the host's), a dotted name when its first part is one of the Python packages. Commands, settings
keys and bare file names (`child.log`, `common.py`) are not checked. Dotted names are resolved by
reading the source, not importing it: a module is a file, an attribute something its module binds at
the top level (a class, function, assignment or import), and a class's attribute something its body,
its methods' `self.x = ...` or an in-repository base class binds; an attribute of a name imported from
outside the repository, or of a class with a base outside it, is taken on trust.
The failure lists every stale name with its file and line.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ("daemon", "handlers", "schemas", "benchmarks", "testbed", "tests")
FOLDERS = (*PACKAGES, "docs", "deploy")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "README.md"]

# A path at the repository's root: a known folder, then names; not the tail of a longer path or URL.
PATH = re.compile(r"(?<![\w/.~$-])(?:" + "|".join(FOLDERS) + r")/[\w.<>*/-]*")
DOTTED = re.compile(r"(?<![\w./-])(?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_]\w*)+")
CLASS_DOTTED = re.compile(
    r"(?<![\w./-])[A-Z]\w*(?:\.[A-Za-z_]\w*)+"
)  # `Intake.take`: a class of the code's, by its name
SPAN = re.compile(r"`([^`\n]+)`")
LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "msg"}


def project_modules(package: str) -> list[Path]:
    """The package's own modules: not those of a virtual environment synced inside it (the trl 1.12 lane's)."""
    return sorted(path for path in (ROOT / package).rglob("*.py") if ".venv" not in path.relative_to(ROOT).parts)


def sources() -> Iterator[tuple[str, int, str]]:
    """(file, line, text) of each page's lines and of every docstring of the code, line by line."""
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            yield str(page.relative_to(ROOT)), number, line
    for package in PACKAGES:
        for module in project_modules(package):
            tree = ast.parse(module.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
                    first = node.body[0]
                    if (
                        isinstance(first, ast.Expr)
                        and isinstance(first.value, ast.Constant)
                        and isinstance(first.value.value, str)
                    ):
                        for offset, line in enumerate(first.value.value.splitlines()):
                            yield str(module.relative_to(ROOT)), first.value.lineno + offset, line


def path_exists(path: str) -> bool:
    path = path.rstrip(".,:;")
    if any(mark in path for mark in "<>*"):  # `benchmarks/results/gpu_check-<host>.md`: a pattern
        pattern = re.sub(r"<[^>]*>", "*", path).replace("**", "*").rstrip("/")
        return any(ROOT.glob(pattern))
    return (ROOT / path).exists()


@functools.cache
def module_tree(dotted: str) -> ast.Module | None:
    parts = dotted.split(".")
    for candidate in (ROOT.joinpath(*parts).with_suffix(".py"), ROOT.joinpath(*parts, "__init__.py")):
        if candidate.is_file():
            return ast.parse(candidate.read_text())
    return None


def is_module(dotted: str) -> bool:
    parts = dotted.split(".")
    return module_tree(dotted) is not None or ROOT.joinpath(*parts).is_dir()


def absolute(module: str, level: int, name: str | None) -> str:
    """The module a `from ... import` in `module` reads from, its relative dots resolved."""
    if level == 0:
        return name or ""
    package = (
        module.split(".") if ROOT.joinpath(*module.split("."), "__init__.py").is_file() else module.split(".")[:-1]
    )
    return ".".join([*package[: len(package) - level + 1], *([name] if name else [])])


def bound_in(body: list[ast.stmt], name: str, module: str) -> ast.AST | str | None:
    """What `name` is bound to at this level of a body: a class or function node, a module path
    ("module:name") for an import, "value" for anything else; None where it is not bound."""
    found: ast.AST | str | None = None
    for node in body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            found = node
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            found = "value"
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            found = "value"
        elif isinstance(node, ast.ImportFrom):
            source = absolute(module, node.level, node.module)
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    found = f"{source}:{alias.name}"
        elif isinstance(node, ast.Import):
            if any((alias.asname or alias.name.split(".")[0]) == name for alias in node.names):
                found = "value"
        elif isinstance(
            node, ast.If | ast.Try | ast.With
        ):  # TYPE_CHECKING blocks, optional imports, `with deferring():`
            inner = [
                *node.body,
                *getattr(node, "orelse", []),
                *[s for h in getattr(node, "handlers", []) for s in h.body],
            ]
            found = bound_in(inner, name, module) or found
    return found


def class_has(node: ast.ClassDef, name: str, module: str) -> bool:
    if bound_in(node.body, name, module) is not None:
        return True
    for method in node.body:  # self.name = ... in its methods
        if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
            for target in ast.walk(method):
                if isinstance(target, ast.Attribute) and isinstance(target.ctx, ast.Store) and target.attr == name:
                    return True
    for base in node.bases:  # an in-repository base is read; one from outside is trusted
        tree = module_tree(module)
        where = bound_in(tree.body, base.id, module) if isinstance(base, ast.Name) and tree is not None else None
        if isinstance(where, ast.ClassDef):
            if class_has(where, name, module):
                return True
        elif isinstance(where, str) and ":" in where and where.split(":")[0].split(".")[0] in PACKAGES:
            if resolve(where.replace(":", ".") + "." + name) in (None, "trusted"):
                return True
        else:
            return True  # a base from outside the repository, or not a plain name
    return False


def resolve(dotted: str) -> str | None:
    """None when `dotted` names something that exists (or "trusted": outside what can be read);
    else what is missing."""
    parts = dotted.split(".")
    split = max((i for i in range(1, len(parts) + 1) if is_module(".".join(parts[:i]))), default=0)
    if split == 0:
        return dotted
    module, rest = ".".join(parts[:split]), parts[split:]
    if not rest:
        return None
    tree = module_tree(module)
    if tree is None:
        return dotted  # a folder without that module
    where = bound_in(tree.body, rest[0], module)
    if where is None:
        return dotted
    if isinstance(where, str) and ":" in where:
        source, name = where.split(":")
        if source.split(".")[0] not in PACKAGES:
            return "trusted"
        inner = resolve(".".join([source, name, *rest[1:]]))
        return None if inner in (None, "trusted") else dotted
    if len(rest) > 1 and isinstance(where, ast.ClassDef) and not class_has(where, rest[1], module):
        return dotted
    return None


def looks_like_a_path(path: str) -> bool:
    """A file (`x.py`, `x-<host>.md`), a folder (`tests/daemon/`) or two levels deep; not prose
    such as the ratio "daemon/plain"."""
    path = path.rstrip(".,:;")
    return path.endswith("/") or re.search(r"\.\w+$", path) is not None or path.count("/") >= 2


@functools.cache
def log_events() -> frozenset[str]:
    """The code's structlog event names (`daemon.started`): dotted, but not names of the code."""
    events = set()
    for package in PACKAGES:
        for module in project_modules(package):
            for node in ast.walk(ast.parse(module.read_text())):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in LOG_METHODS
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)
                ):
                    events.add(node.args[0].value)
    return frozenset(events)


@functools.cache
def classes() -> dict[str, list[str]]:
    """Each class name the packages define at a module's top level, and the modules that do."""
    found: dict[str, list[str]] = {}
    for package in PACKAGES:
        for module in project_modules(package):
            dotted = ".".join(module.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.parse(module.read_text()).body:
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, []).append(dotted)
    return found


def resolve_class_attribute(dotted: str) -> str | None:
    """`Intake.take`: checked where one module defines that class; a class of another library's,
    or a name two modules define, is not checked here."""
    name, attribute = dotted.split(".")[:2]
    modules = classes().get(name, [])
    if len(modules) != 1:
        return None
    return None if resolve(f"{modules[0]}.{name}.{attribute}") in (None, "trusted") else dotted


def stale() -> list[str]:
    found = []
    for file, line, text in sources():
        for match in PATH.finditer(text):
            if looks_like_a_path(match.group()) and not path_exists(match.group()):
                found.append(f"{file}:{line}: path {match.group().rstrip('.,:;')}")
        for span in SPAN.findall(text):
            for match in DOTTED.finditer(span):
                if match.group() not in log_events() and resolve(match.group()) not in (None, "trusted"):
                    found.append(f"{file}:{line}: name {match.group()}")
            for match in CLASS_DOTTED.finditer(span):
                if resolve_class_attribute(match.group()) is not None:
                    found.append(f"{file}:{line}: name {match.group()}")
    return found


def test_every_path_and_dotted_name_the_docs_give_exists() -> None:
    missing = stale()
    assert not missing, f"{len(missing)} stale names (fix the text, or the name):\n" + "\n".join(missing)


def test_the_checker_finds_a_stale_path_and_name_and_passes_real_ones() -> None:
    assert (
        path_exists("daemon/resources/slots.py")
        and path_exists("tests/daemon/")
        and path_exists("benchmarks/results/<name>.md")
    )
    assert not path_exists("handlers/common.py") and not path_exists("daemon/jobs/nowhere.py")
    assert resolve("daemon.service.wire") is None and resolve("daemon.resources.slots.Slots.take") is None
    assert resolve("tests.core.CoreOnFakes.intake") is None  # bound in __init__ as self.intake
    assert resolve("schemas.read_event") is None  # bound by an import in schemas/__init__.py
    assert resolve("daemon.intake.Intake.nothing_here") == "daemon.intake.Intake.nothing_here"
    assert (
        resolve_class_attribute("Intake.take") is None and resolve_class_attribute("Intake.refuse") == "Intake.refuse"
    )
    assert resolve("handlers.common") == "handlers.common" and resolve("daemon.nowhere.thing") == "daemon.nowhere.thing"
    assert [m.group() for m in PATH.finditer("see /etc/daemon/x and daemon/service.py, or https://x.org/tests/y")] == [
        "daemon/service.py"
    ]
